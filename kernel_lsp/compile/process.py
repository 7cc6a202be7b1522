"""Run a tool as an asyncio subprocess: bounded time and output, killed (with its children) on cancel."""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import subprocess
import time
from dataclasses import dataclass

MAX_OUTPUT_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ProcessResult:
    argv: tuple[str, ...]
    returncode: int | None  # None when it was killed for running past its time
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float

    @property
    def output(self) -> str:
        """stderr, then stdout: what the compiler-output parsers read."""
        return self.stderr + "\n" + self.stdout


def output_tail(text: str, lines: int = 5, empty: str = "(none)") -> str:
    """A tool's last non-blank lines on one line, for a message."""
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or empty


async def run_process(argv: list[str], *, timeout_s: float, cwd: str | None = None,
                      env: dict[str, str] | None = None) -> ProcessResult:
    """Raises OSError when the program cannot be started; asyncio.CancelledError kills it."""
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # own process group, so nvcc's children (cicc, ptxas) die with it
    )
    try:
        out, err = await asyncio.wait_for(_read_capped(proc), timeout=timeout_s)
        returncode, timed_out = await proc.wait(), False
    except asyncio.TimeoutError:
        _kill_group(proc)
        await proc.wait()
        out, err, returncode, timed_out = b"", b"", None, True
    except BaseException:
        _kill_group(proc)
        await asyncio.shield(proc.wait())
        raise
    return ProcessResult(tuple(argv), returncode, out.decode("utf-8", "replace"),
                         err.decode("utf-8", "replace"), timed_out, time.monotonic() - start)


async def _read_capped(proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    async def drain(stream: asyncio.StreamReader) -> bytes:
        chunks, size = [], 0
        while chunk := await stream.read(65536):
            if size < MAX_OUTPUT_BYTES:
                chunks.append(chunk[: MAX_OUTPUT_BYTES - size])
            size += len(chunk)
        return b"".join(chunks)

    return await asyncio.gather(drain(proc.stdout), drain(proc.stderr))


_running: set[subprocess.Popen] = set()


def run_blocking(argv: list[str], *, timeout_s: float, cwd: str | None = None) -> subprocess.CompletedProcess:
    """The same for a thread: output discarded, killed (with its children) past its time or when this process
    exits. Raises OSError when the program cannot be started."""
    proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    _running.add(proc)
    try:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
        return subprocess.CompletedProcess(argv, proc.returncode)
    finally:
        _running.discard(proc)


@atexit.register
def _kill_running() -> None:
    for proc in list(_running):
        _kill_group(proc)


def _kill_group(proc: asyncio.subprocess.Process | subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
