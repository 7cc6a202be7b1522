"""A long command's live progress line: on a terminal (stdout and stderr a pty) `check` and `verify` show it within
seconds of starting; piped output and `--format json` get no escape codes, the JSON parseable."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ESCAPE = b"\x1b["

pytestmark = pytest.mark.timeout(300)


def terminal() -> tuple[int, int]:
    """A pty 120 columns wide: (the side the test reads, the side the command writes)."""
    reader, writer = os.openpty()
    fcntl.ioctl(writer, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    return reader, writer


def environment() -> dict[str, str]:
    """A terminal as a person's: not dumb, and none of the variables that tell rich to draw or not to."""
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR")}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "120"}


def start(args: list[str], stdout: int, stderr: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kernel_lsp", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=stderr, env=environment(), start_new_session=True)


def read_until(reader: int, pattern: bytes | None, seconds: float) -> tuple[bytes, float | None]:
    """What the pty got until `pattern` showed (and after how many seconds), or everything within `seconds` or until
    the command closed its side (`pattern` None: all it wrote)."""
    seen, began = b"", time.monotonic()
    while time.monotonic() - began < seconds:
        ready, _, _ = select.select([reader], [], [], 0.1)
        if ready:
            try:
                seen += os.read(reader, 65536)
            except OSError:  # the command closed its side
                break
            if pattern is not None and re.search(pattern, seen):
                return seen, time.monotonic() - began
    return seen, None


def interrupt(process: subprocess.Popen) -> None:
    """Ctrl-C as a terminal sends it: the command stops its work (and any worker it started) and exits."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    process.wait(timeout=120)


def progress_on_a_terminal(arguments: list[str], pattern: bytes) -> bytes:
    """What `kernel-lsp ARGUMENTS` drew on a terminal until `pattern` (within 10 s, or the test fails), then
    stopped with Ctrl-C."""
    reader, writer = terminal()
    process = start(arguments, writer, writer)
    os.close(writer)
    try:
        seen, after = read_until(reader, pattern, 10)
    finally:
        interrupt(process)
        os.close(reader)
    assert after is not None, seen.decode(errors="replace")
    return seen


@pytest.mark.slow
def test_check_of_a_folder_on_a_terminal_shows_its_progress_within_seconds():
    """The tour's compile takes 40 s with nvcc and showed nothing meanwhile; now a live line counts the files."""
    seen = progress_on_a_terminal(["check", "--no-cache", "examples/tour"], rb"kernel-lsp check: \d+ files.*\d+/\d+")
    assert ESCAPE in seen  # drawn live, not printed as a line


@pytest.mark.slow
def test_verify_on_a_terminal_shows_its_progress_while_the_worker_starts():
    """The worker's start-up (torch imported, CUDA started) said nothing for a minute."""
    progress_on_a_terminal(["verify", "examples/tour/relu_triton.py", "--device", "cpu"],
                           rb"kernel-lsp verify: relu_triton\.py.*\d:\d\d:\d\d")


def test_check_piped_prints_no_escape_codes():
    process = subprocess.run([sys.executable, "-m", "kernel_lsp", "check", "--no-cache", "examples/tour/relu.py"],
                             cwd=ROOT, capture_output=True, env=environment(), timeout=120)
    assert ESCAPE not in process.stdout and ESCAPE not in process.stderr, process.stderr
    assert b"finding" in process.stderr  # the count still comes


def test_check_as_json_on_a_terminal_prints_no_escape_codes_and_parses():
    """stdout and stderr both a pty, as on a terminal: --format json alone keeps the live line off."""
    out_reader, out_writer = terminal()
    err_reader, err_writer = terminal()
    process = start(["check", "--no-cache", "--format", "json", "examples/tour/relu.py"], out_writer, err_writer)
    os.close(out_writer)
    os.close(err_writer)
    try:
        assert process.wait(timeout=120) == 0
        out, _ = read_until(out_reader, None, 5)
        err, _ = read_until(err_reader, None, 5)
    finally:
        interrupt(process)
        os.close(out_reader)
        os.close(err_reader)
    assert ESCAPE not in out and ESCAPE not in err, (out, err)
    assert json.loads(out) == []
