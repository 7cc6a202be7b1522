"""A real Neovim (not headless) with editor_clients/neovim in a tmux pane of fixed size: a broken .cu file's error
drawn as a sign and virtual text on its line, and the hover card of a kernel in the same file. Each screen is
captured with its colours and written as an SVG "screenshot" to docs/images/neovim-*.svg (the README's images:
rewritten only when this test runs), with the plain and ANSI captures in artifacts/neovim-screen/ (gitignored).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

import pytest

from kernel_lsp.server.hover_card import NO_PROFILE
from tests.editors.ansi_svg import Style, apply_sgr, parse, to_svg

NO_PROFILE_HERE = "no profile: the file's last compile failed"  # bad.cu's card (server/profile_feature.py)
REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "editor_clients" / "neovim"
IMAGES = REPO / "docs" / "images"
ARTIFACTS = REPO / "artifacts" / "neovim-screen"
COLUMNS, ROWS = 110, 20
# the error of test_neovim.py's BAD on line 3, and a good kernel on line 4 to hover
SOURCE = ("// two lines before the kernel,\n// so line numbers must follow\n__global__ void f(int* p){ p[0] = y; }\n"
          "__global__ void scale(float* p){ p[threadIdx.x] *= 2.0f; }\n")
ERROR = 'identifier "y" is undefined'
WAIT_S = 40

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)")
pytestmark = pytest.mark.timeout(120, func_only=True)  # func_only: installing Neovim and tmux is not timed


def lua(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a Lua string literal for these paths


class Pane:
    """One tmux session on a private server (its own socket, no config) running one command."""

    def __init__(self, tmux: str, env: dict[str, str]):
        self.tmux, self.env = tmux, env
        # a short folder: a socket's path must stay under ~100 bytes, and pytest's tmp_path can be longer
        self.folder = Path(tempfile.mkdtemp(prefix="kls-tmux-", dir="/tmp" if Path("/tmp").is_dir() else None))
        self.socket = self.folder / "sock"

    def __call__(self, *args: str, check: bool = True) -> str:
        done = subprocess.run([self.tmux, "-S", str(self.socket), "-f", "/dev/null", *args], env=self.env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def start(self, argv: list[str], cwd: Path) -> None:
        # set before the session starts: a crash at once still leaves its last screen to read (remain-on-exit)
        self("start-server", ";", "set-option", "-g", "remain-on-exit", "on",
             ";", "set-option", "-g", "default-terminal", "tmux-256color",
             ";", "new-session", "-d", "-s", "screen", "-x", str(COLUMNS), "-y", str(ROWS), "-c", str(cwd),
             shlex.join(argv))

    def capture(self, colours: bool = False) -> str:
        # -N keeps trailing spaces: a float's background goes on past its text
        return self("capture-pane", "-p", *(["-e", "-N"] if colours else []), "-t", "screen")

    def keys(self, *keys: str) -> None:
        self("send-keys", "-t", "screen", *keys)

    def dead(self) -> bool:
        """Whether the command has ended (or the session is gone)."""
        return self("display-message", "-p", "-t", "screen", "#{pane_dead}", check=False).strip() != "0"

    def wait_for(self, ready, what: str) -> str:
        """Polls the plain screen until `ready(screen)`, then until it stops changing (a frame drawn whole)."""
        deadline, screen = time.monotonic() + WAIT_S, ""
        while time.monotonic() < deadline:
            screen = self.capture()
            if ready(screen):
                while time.monotonic() < deadline:
                    time.sleep(0.3)
                    again = self.capture()
                    if again == screen:
                        return screen
                    screen = again
            if self.dead():
                break
            time.sleep(0.2)
        raise AssertionError(f"{what} not on screen within {WAIT_S} s; the screen:\n{screen}")

    def close(self) -> None:
        try:
            self("kill-server", check=False)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def save(name: str, ansi: str, title: str) -> str:
    """docs/images/NAME.svg from the colour capture, the captures in artifacts/; the SVG's text."""
    IMAGES.mkdir(parents=True, exist_ok=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    svg = to_svg(ansi, COLUMNS, ROWS, title=title)
    (IMAGES / f"{name}.svg").write_text(svg)
    (ARTIFACTS / f"{name}.ansi").write_text(ansi)
    (ARTIFACTS / f"{name}.txt").write_text(re.sub(r"\x1b\[[0-9;:]*m", "", ansi))
    return svg


def row_of(screen: str, text: str) -> int:
    """The index of the one screen row holding `text`."""
    found = [i for i, row in enumerate(screen.splitlines()) if text in row]
    assert len(found) == 1, f"{text!r} on rows {found}, not on one; the screen:\n{screen}"
    return found[0]


@pytest.mark.nvcc
@needs_nvcc
def test_screenshots_of_the_error_sign_virtual_text_and_hover(nvim: str, tmux: str, tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'neovim-screen-test'\n")
    document = tmp_path / "kernels" / "bad.cu"
    document.parent.mkdir()
    document.write_text(SOURCE)
    init = tmp_path / "init.lua"
    init.write_text(f"""vim.opt.runtimepath:prepend({lua(PLUGIN)})
vim.o.number = true
vim.o.signcolumn = "yes"
vim.o.laststatus = 2
vim.o.background = "dark"
vim.o.termguicolors = false
vim.opt.shortmess:append("I")
vim.diagnostic.config({{ virtual_text = true, signs = true, underline = true, update_in_insert = false }})
vim.keymap.set("n", "K", vim.lsp.buf.hover)  -- 0.10 maps it by default; 0.7 does not
require("kernel_lsp").setup({{ python = {lua(sys.executable)} }})
""")
    xdg = tmp_path / ".xdg"  # Neovim's and kernel-lsp's own folders, away from the user's
    env = {key: value for key, value in os.environ.items() if not key.startswith("TMUX")}
    env.update({f"XDG_{kind}_HOME": str(xdg / kind.lower()) for kind in ("CONFIG", "DATA", "CACHE", "STATE")})
    env.update(TERM="xterm-256color", LANG="C.UTF-8", LC_ALL="C.UTF-8", COLORTERM="")
    env.pop("NVIM_LISTEN_ADDRESS", None)
    env.pop("NVIM", None)

    pane = Pane(tmux, env)
    try:
        pane.start([nvim, "-n", "-i", "NONE", "-u", str(init), "kernels/bad.cu"], tmp_path)

        # the error: a sign and its message as virtual text, on the row of line 3
        screen = pane.wait_for(lambda screen: ERROR in screen, "the error's virtual text")
        save("neovim-diagnostics", pane.capture(colours=True), "Neovim: kernel-lsp's nvcc error on a .cu file")
        rows = screen.splitlines()
        assert len(rows) == ROWS and all(len(row) <= COLUMNS for row in rows)
        line = rows[row_of(screen, ERROR)]
        drawn = r"E\s+3 __global__ void f\(int\* p\)\{ p\[0\] = y; \}\s+■ "  # sign, line number, text, virtual text
        assert re.fullmatch(drawn + re.escape(ERROR), line), line
        assert rows[row_of(screen, "p[threadIdx.x]")].lstrip().startswith("4 __global__ void scale")
        assert "kernels/bad.cu" in rows[-2]  # the status line

        # the hover card of the good kernel on line 4: cursor on its name, then K
        pane.keys("4G", f"{SOURCE.splitlines()[3].index('scale') + 1}|", "K")
        # the file does not compile (line 3): the card says why no profile can be made, not to make one
        screen = pane.wait_for(lambda screen: NO_PROFILE_HERE in screen, "the hover card")
        save("neovim-hover", pane.capture(colours=True), "Neovim: kernel-lsp's hover card on a kernel")
        rows = screen.splitlines()
        assert NO_PROFILE not in screen, screen
        kernel, card = row_of(screen, "p[threadIdx.x]"), row_of(screen, NO_PROFILE_HERE)
        assert kernel < card < kernel + 6, f"the card is not just below the kernel's line:\n{screen}"
        assert any(re.search(r"\bscale\b", row) for row in rows[kernel + 1:card]), screen  # its title
        assert ERROR in rows[row_of(screen, ERROR)]  # the error is still drawn

        pane.keys("Escape", ":qa!", "Enter")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not pane.dead():
            time.sleep(0.1)
        assert pane.dead(), "nvim did not quit on :qa!"
    finally:
        pane.close()

    for name in ("neovim-diagnostics", "neovim-hover"):  # well-formed, and the message is text in the picture
        svg = ElementTree.parse(IMAGES / f"{name}.svg").getroot()
        assert any(ERROR in (text.text or "") for text in svg.iter("{http://www.w3.org/2000/svg}text")), name


def test_ansi_to_svg_colours_attributes_and_cells():
    """The converter alone (no tmux, no nvim): SGR state carried across rows, 256 and 24-bit colours, wide cells."""
    ansi = "\x1b[96m\x1b[48;5;242m  \x1b[93m\x1b[49m  1 x\n\x1b[1;4:3m\x1b[58:2::255:0:0my\x1b[0m\x1b[7m界\x1b[0m<&>\n"
    rows = parse(ansi)
    assert "".join(char for char, _ in rows[0]) == "    1 x"
    assert rows[0][0][1] == Style(fg="#29b8db", bg="#6c6c6c") and rows[0][6][1] == Style(fg="#f5f543")
    assert rows[1][0] == ("y", Style(fg="#f5f543", bold=True, underline=3, underline_color="#ff0000"))
    assert rows[1][1:3] == [("界", Style(reverse=True)), ("", Style(reverse=True))] and len(rows[1]) == 6
    assert apply_sgr(Style(), "38;2;1;2;3") == Style(fg="#010203")
    svg = ElementTree.fromstring(to_svg(ansi, 10, 3))
    texts = [text.text for text in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert texts == ["  1 x", "y", "界", "<&>"]
    assert svg.get("width") == f"{10 * 8.4 + 20:g}"
