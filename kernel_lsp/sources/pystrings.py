"""Decodes Python string literals as written in a file, recording where each decoded character came from.

`ast` gives the value of a literal but, for implicitly concatenated pieces ("a" "b"), only the range of the
whole expression; reading the characters ourselves gives every character's exact (line, col) in the file.
"""

from __future__ import annotations

import re
import unicodedata

from kernel_lsp.sources.sourcemap import CharPositions

_SIMPLE_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
                   "t": "\t", "v": "\v"}
_HEX_ESCAPE_LENGTH = {"x": 2, "u": 4, "U": 8}
_OCTAL_DIGITS = "01234567"
_HEX_DIGITS = "0123456789abcdefABCDEF"
_PREFIX_LETTERS = "rRbBuUfF"
# Characters that decode to themselves, by (quote, is an f-string)
_PLAIN_RUN = {(quote, is_f): re.compile("[^\\\\" + quote + ("{}" if is_f else "") + "]+")
              for quote in "'\"" for is_f in (False, True)}


class LiteralError(ValueError):
    """The text is not a sequence of plain string literals (an f-string with fields, or not a literal at all)."""


def decode_literals(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> tuple[str, CharPositions]:
    """Decodes the adjacent string literals between start and end (0-based line, character).

    `lines` are the file's lines without their line breaks; a break inside a literal decodes to '\\n'.
    """
    reader = _Reader(lines, start)
    decoded: list[str] = []
    positions = CharPositions()
    while True:
        reader.skip_blanks()
        if reader.position >= end or reader.at_end():
            break
        _read_literal(reader, decoded, positions)
    return "".join(decoded), positions


class _Reader:
    """A cursor over the lines of a file; the end of each line reads as '\\n'."""

    def __init__(self, lines: list[str], start: tuple[int, int]) -> None:
        self.lines = lines
        self.line, self.col = start

    @property
    def position(self) -> tuple[int, int]:
        return self.line, self.col

    def at_end(self) -> bool:
        return self.line >= len(self.lines) or (self.line == len(self.lines) - 1 and self.col >= len(self.lines[-1]))

    def peek(self, ahead: int = 0) -> str:
        """The character `ahead` places on within the current line ('\\n' at its end, '' past it)."""
        if self.line >= len(self.lines):
            return ""
        text = self.lines[self.line]
        index = self.col + ahead
        if index < len(text):
            return text[index]
        if index == len(text) and self.line + 1 < len(self.lines):
            return "\n"
        return ""

    def startswith(self, text: str) -> bool:
        return self.line < len(self.lines) and self.lines[self.line].startswith(text, self.col)

    def advance(self, count: int = 1) -> None:
        for _ in range(count):
            if self.peek() == "\n":
                self.line, self.col = self.line + 1, 0
            else:
                self.col += 1

    def skip_blanks(self) -> None:
        """Whitespace, line breaks, comments and backslash continuations between adjacent literals."""
        while not self.at_end():
            ch = self.peek()
            if ch in " \t\f\n":
                self.advance()
            elif ch == "\\" and self.peek(1) == "\n":
                self.advance(2)
            elif ch == "#":
                self.col = len(self.lines[self.line])
            else:
                return


def _read_literal(reader: _Reader, decoded: list[str], positions: CharPositions) -> None:
    prefix = ""
    while reader.peek() in _PREFIX_LETTERS and reader.peek() and len(prefix) < 2:
        prefix += reader.peek()
        reader.advance()
    quote = reader.peek()
    if quote not in ("'", '"'):
        raise LiteralError(f"expected a string literal at line {reader.line + 1}")
    if reader.startswith(quote * 3):
        quote *= 3
    reader.advance(len(quote))
    flags = prefix.lower()
    _read_body(reader, quote, "r" in flags, "b" in flags, "f" in flags, decoded, positions)


def _read_body(reader: _Reader, quote: str, raw: bool, is_bytes: bool, is_f: bool,
               decoded: list[str], positions: CharPositions) -> None:
    def emit(text: str, line: int, col: int) -> None:
        for ch in text:
            decoded.append(ch)
            positions.append(line, col)

    plain = _PLAIN_RUN[quote[0], is_f]
    while True:
        line, col = reader.position
        run = plain.match(reader.lines[line], col) if line < len(reader.lines) else None
        if run is not None:  # the common case: a stretch with nothing to decode
            decoded.append(run[0])
            positions.append_run(line, col, len(run[0]))
            reader.col = run.end()
            continue
        ch = reader.peek()
        if ch == "":
            raise LiteralError("unterminated string literal")
        if reader.startswith(quote):
            reader.advance(len(quote))
            return
        if ch == "\n" and len(quote) == 1:
            raise LiteralError("line break inside a single-quoted string")
        if ch == "\\":
            _read_escape(reader, raw, is_bytes, emit)
        elif is_f and ch in "{}":
            if reader.peek(1) != ch:
                raise LiteralError("an f-string with replacement fields is built at run time")
            emit(ch, line, col)
            reader.advance(2)
        else:
            emit(ch, line, col)
            reader.advance()


def _read_escape(reader: _Reader, raw: bool, is_bytes: bool, emit) -> None:
    """Reads one backslash sequence; each character it decodes to sits at the backslash."""
    line, col = reader.position
    following = reader.peek(1)
    if raw:
        emit("\\", line, col)  # a raw string keeps the backslash and whatever follows it, quote included
        reader.advance()
        if following:
            emit(following, *reader.position)
            reader.advance()
        return
    if following == "\n":
        reader.advance(2)  # a continuation: neither character is part of the value
        return
    if following in _SIMPLE_ESCAPES:
        emit(_SIMPLE_ESCAPES[following], line, col)
        reader.advance(2)
        return
    if following in _OCTAL_DIGITS and following:
        digits = _run_of(reader, 1, _OCTAL_DIGITS, 3)
        emit(chr(int(digits, 8)), line, col)
        reader.advance(1 + len(digits))
        return
    if following in _HEX_ESCAPE_LENGTH and following and (following == "x" or not is_bytes):
        length = _HEX_ESCAPE_LENGTH[following]
        digits = _run_of(reader, 2, _HEX_DIGITS, length)
        if len(digits) != length:
            raise LiteralError(f"truncated \\{following} escape")
        emit(chr(int(digits, 16)), line, col)
        reader.advance(2 + length)
        return
    if following == "N" and not is_bytes and reader.peek(2) == "{":
        emit(_named_character(reader), line, col)
        return
    emit("\\", line, col)  # an unknown escape keeps its backslash; the next character is read as itself
    reader.advance()


def _run_of(reader: _Reader, ahead: int, alphabet: str, limit: int) -> str:
    digits = ""
    while len(digits) < limit and (ch := reader.peek(ahead + len(digits))) and ch in alphabet and ch != "\n":
        digits += ch
    return digits


def _named_character(reader: _Reader) -> str:
    text = reader.lines[reader.line]
    close = text.find("}", reader.col + 3)
    if close < 0:
        raise LiteralError("unterminated \\N{...} escape")
    try:
        value = unicodedata.lookup(text[reader.col + 3:close])
    except KeyError as error:
        raise LiteralError(f"unknown character name in \\N{{{text[reader.col + 3:close]}}}") from error
    reader.advance(close + 1 - reader.col)
    return value
