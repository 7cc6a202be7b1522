"""A terminal screen as an SVG "screenshot": the text of `tmux capture-pane -p -e` (SGR escapes for colours and
attributes) laid on a grid of monospace cells, each run of equal style one <text> (stretched to its cells with
textLength, so any monospace font lines up) over a <rect> for its background. Self-contained: no fonts, no scripts.

Colours: the 16 ANSI colours of a dark palette, xterm's 256-colour cube and greys, and 24-bit (`38;2;r;g;b`).
Attributes: bold, dim, italic, underline (also curly, with the underline colour of `58;…`), reverse, strikethrough.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace
from xml.sax.saxutils import escape

# A dark palette (VS Code's terminal colours): black, red, green, yellow, blue, magenta, cyan, white, then bright.
PALETTE = ("#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
           "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff")
FOREGROUND, BACKGROUND = "#d4d4d4", "#1e1e1e"
FONT = "'DejaVu Sans Mono', Menlo, Consolas, 'Liberation Mono', monospace"
FONT_SIZE, CELL_W, CELL_H, PAD = 14, 8.4, 18, 10

_ESCAPE = re.compile(r"\x1b\[([0-9;:]*)([A-Za-z])|\x1b[()][A-Za-z0-9]|\x1b[=>]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def color_256(n: int) -> str:
    if n < 16:
        return PALETTE[n]
    if n < 232:
        n -= 16
        levels = [0 if v == 0 else 55 + 40 * v for v in (n // 36, n // 6 % 6, n % 6)]
        return "#{:02x}{:02x}{:02x}".format(*levels)
    grey = 8 + 10 * (n - 232)
    return f"#{grey:02x}{grey:02x}{grey:02x}"


@dataclass(frozen=True)
class Style:
    fg: str | None = None  # None: the default colour
    bg: str | None = None
    bold: bool = False
    dim: bool = False
    italic: bool = False
    underline: int = 0  # 0 none, 1 straight, 3 curly (others drawn straight)
    underline_color: str | None = None
    reverse: bool = False
    strike: bool = False

    def colors(self) -> tuple[str, str | None]:
        """(text fill, background fill or None for the screen's own)."""
        fg, bg = self.fg or FOREGROUND, self.bg
        if self.reverse:
            fg, bg = bg or BACKGROUND, fg
        return fg, bg


def _extended(params: list[str], at: int) -> tuple[str | None, int]:
    """A `38`/`48`/`58` colour starting after params[at]; (colour, index of the next parameter)."""
    kind = params[at + 1] if at + 1 < len(params) else ""
    if kind == "5" and at + 2 < len(params):
        return color_256(int(params[at + 2] or 0) % 256), at + 3
    if kind == "2" and at + 4 < len(params):
        r, g, b = (max(0, min(255, int(v or 0))) for v in params[at + 2:at + 5])
        return f"#{r:02x}{g:02x}{b:02x}", at + 5
    return None, len(params)


# SGR codes that set fixed Style fields
SGR_ATTRIBUTES: dict[int, dict[str, object]] = {
    1: {"bold": True}, 2: {"dim": True}, 3: {"italic": True}, 7: {"reverse": True}, 9: {"strike": True},
    21: {"underline": 2}, 22: {"bold": False, "dim": False}, 23: {"italic": False}, 24: {"underline": 0},
    27: {"reverse": False}, 29: {"strike": False}, 39: {"fg": None}, 49: {"bg": None}, 59: {"underline_color": None},
}


def apply_sgr(style: Style, text: str) -> Style:
    """The style after one SGR sequence's parameters (`text` as between `ESC[` and `m`)."""
    # colon forms (38:2::r:g:b, 4:3) become the semicolon ones this reads
    params, curly = [], None
    for group in (text or "0").split(";"):
        parts = group.split(":")
        if len(parts) > 1 and parts[0] in ("38", "48", "58"):
            parts = [parts[0], parts[1]] + [p for p in parts[2:] if p != ""][-3 if parts[1] == "2" else -1:]
        elif len(parts) > 1 and parts[0] == "4":
            curly, parts = int(parts[1] or 0), ["4"]
        params += parts
    i = 0
    while i < len(params):
        code = int(params[i] or 0)
        if code == 0:
            style = Style()
        elif code in SGR_ATTRIBUTES:
            style = replace(style, **SGR_ATTRIBUTES[code])
        elif code == 4:
            style = replace(style, underline=curly if curly is not None else 1)
        elif 30 <= code <= 37:
            style = replace(style, fg=PALETTE[code - 30])
        elif 90 <= code <= 97:
            style = replace(style, fg=PALETTE[code - 90 + 8])
        elif 40 <= code <= 47:
            style = replace(style, bg=PALETTE[code - 40])
        elif 100 <= code <= 107:
            style = replace(style, bg=PALETTE[code - 100 + 8])
        elif code in (38, 48, 58):
            color, i = _extended(params, i)
            field = {38: "fg", 48: "bg", 58: "underline_color"}[code]
            style = replace(style, **{field: color})
            continue
        i += 1
    return style


def char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def parse(ansi: str) -> list[list[tuple[str, Style]]]:
    """Rows of (character, style) cells; a wide character is followed by an empty cell. The style carries over from
    one row to the next, as tmux writes it."""
    rows, style = [], Style()
    for line in ansi.split("\n"):
        row: list[tuple[str, Style]] = []
        at = 0
        for match in _ESCAPE.finditer(line):
            row += _cells(line[at:match.start()], style)
            if match.group(2) == "m":
                style = apply_sgr(style, match.group(1))
            at = match.end()
        row += _cells(line[at:], style)
        rows.append(row)
    if rows and not rows[-1]:  # the newline that ends the last row
        rows.pop()
    return rows


def _cells(text: str, style: Style) -> list[tuple[str, Style]]:
    cells: list[tuple[str, Style]] = []
    for char in text.replace("\r", ""):
        width = char_width(char)
        if width == 0 and cells:
            cells[-1] = (cells[-1][0] + char, cells[-1][1])
        elif width:
            cells.append((char, style))
            if width == 2:
                cells.append(("", style))
    return cells


def to_svg(ansi: str, columns: int | None = None, rows: int | None = None, title: str = "terminal") -> str:
    """The SVG of a captured screen; `columns` x `rows` cells (default: as much as the text covers)."""
    grid = parse(ansi)
    columns = columns or max((len(row) for row in grid), default=1)
    rows = rows or len(grid)
    width, height = columns * CELL_W + 2 * PAD, rows * CELL_H + 2 * PAD
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
            f'viewBox="0 0 {width:g} {height:g}" font-family="{escape(FONT)}" font-size="{FONT_SIZE}">'),
           f"<title>{escape(title)}</title>",
           f'<rect width="100%" height="100%" rx="6" fill="{BACKGROUND}"/>']
    texts: list[str] = []
    for y, row in enumerate(grid[:rows]):
        top, baseline = PAD + y * CELL_H, PAD + y * CELL_H + CELL_H * 0.75
        for start, cells, style in _runs(row[:columns]):
            x, span = PAD + start * CELL_W, len(cells) * CELL_W
            fg, bg = style.colors()
            if bg is not None:
                out.append(f'<rect x="{x:g}" y="{top:g}" width="{span:g}" height="{CELL_H}" fill="{bg}"/>')
            text = "".join(char for char, _ in cells)
            if not text.strip():
                continue
            attrs = [f'x="{x:g}"', f'y="{baseline:g}"', f'fill="{fg}"',
                     f'textLength="{span:g}"', 'lengthAdjust="spacingAndGlyphs"']
            if style.bold:
                attrs.append('font-weight="bold"')
            if style.italic:
                attrs.append('font-style="italic"')
            if style.dim:
                attrs.append('fill-opacity="0.6"')
            if style.strike:
                attrs.append('text-decoration="line-through"')
            texts.append(f'<text {" ".join(attrs)} xml:space="preserve">{escape(text)}</text>')
            if style.underline:  # drawn as a line (or a zigzag for curly) in the underline colour
                color, under = style.underline_color or fg, baseline + 2.5
                if style.underline == 3:
                    points = " ".join(f"{x + i * 2:g},{under + (1.5 if i % 2 else -0.5):g}"
                                      for i in range(int(span // 2) + 1))
                    texts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1"/>')
                else:
                    texts.append(f'<line x1="{x:g}" y1="{under:g}" x2="{x + span:g}" y2="{under:g}" '
                                 f'stroke="{color}" stroke-width="1"/>')
    out += texts  # text above every background
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _runs(row: list[tuple[str, Style]]):
    """(first column, cells, style) of each run of cells that share a style."""
    start = 0
    while start < len(row):
        end = start + 1
        while end < len(row) and row[end][1] == row[start][1]:
            end += 1
        yield start, row[start:end], row[start][1]
        start = end


def plain(ansi: str) -> str:
    """The text without its escapes."""
    return _ESCAPE.sub("", ansi)
