"""The judge's handle on the candidate's process (kernel_lsp.verify.host): start it, ask it, read its answers.

The process is started at the very beginning of a verification, so that its imports overlap the reference's
set-up. It stays in the sandbox child's process group (a timeout kills both). It gets a scratch folder of its
own as HOME and TMPDIR, and may write only there, in the build caches, /dev and /proc (process/confine.py).

If it dies without answering (a segfault, an illegal address that aborts, the out-of-memory killer), the judge
ends the same way (same signal or exit code, the candidate's own stderr already in the shared stderr), so the
sandbox reports the candidate's crash exactly as it would have reported it in one process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from kernel_lsp.process.frames import read_frame, write_frame
from kernel_lsp.process.isolation import build_cache_root, candidate_environment, with_package_on_path

HOST_MODULE = "kernel_lsp.verify.host"
BUILD_CACHE_VARIABLES = ("TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH")
ALWAYS_WRITABLE = ("/dev", "/proc")  # device nodes CUDA opens read-write; CUDA's driver writes under /proc/self


def candidate_launch(home: Path) -> tuple[dict[str, str], list[str]]:
    """How a candidate's process is started: its environment (the allow-list of process/isolation.py, so no
    secret, with HOME and TMPDIR at `home` and this kernel_lsp on its path) and the folders it may write once
    confined (`home`, the build caches, /dev and /proc). The candidate's process of a verification or a
    profile and the program ncu profiles all start this way."""
    environment = with_package_on_path(candidate_environment(os.environ, str(home), build_cache_root()))
    environment["HOME"] = environment["TMPDIR"] = str(home)
    writable = [str(home), *ALWAYS_WRITABLE]
    for name in BUILD_CACHE_VARIABLES:
        if environment.get(name):
            Path(environment[name]).mkdir(parents=True, exist_ok=True)
            writable.append(environment[name])
    return environment, writable


@contextlib.contextmanager
def candidate_process(allow_network: bool, device: str) -> Iterator[CandidateProcess]:
    """The candidate's process for one task: the one this sandbox child started while it waited
    (verify/prestart.py) if it suits, else a new one; closed and its scratch folder removed afterwards.
    For the CPU it runs Triton's interpreter (TRITON_INTERPRET=1), which Triton reads when it is imported: the
    process must start with it."""
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    prestart = sys.modules.get("kernel_lsp.verify.prestart")  # imported only where the worker preloads it
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    host = prestart.take(allow_network, interpret) if prestart is not None else None
    if host is None:
        host = CandidateProcess(Path(tempfile.mkdtemp(prefix="kernel-lsp-judge-")), allow_network)
    try:
        yield host
    finally:
        host.close()
        shutil.rmtree(host.scratch, ignore_errors=True)


class CandidateFailed(Exception):
    """The candidate raised in its own process; `sandbox_failure` is how (the sandbox child reports it)."""

    def __init__(self, failure: dict[str, Any]) -> None:
        super().__init__(failure.get("message", "the candidate failed"))
        self.sandbox_failure = failure


class CandidateProcess:
    def __init__(self, scratch: Path, allow_network: bool) -> None:
        self.scratch = scratch  # the caller removes it once the process is closed
        self.home = scratch / "candidate-home"
        self.exchange_folder = self.home / "exchange"
        self.exchange_folder.mkdir(parents=True, exist_ok=True)
        environment, writable = candidate_launch(self.home)
        self.interpret = environment.get("TRITON_INTERPRET") == "1"  # Triton reads it once, at import
        request_read, self._requests = os.pipe()
        self._replies, reply_write = os.pipe()
        command = [sys.executable, "-P", "-m", HOST_MODULE, "--requests-fd", str(request_read),
                   "--replies-fd", str(reply_write), "--exchange", str(self.exchange_folder),
                   *(f"--writable={folder}" for folder in writable), *(["--allow-network"] if allow_network else [])]
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=environment,
                                            pass_fds=(request_read, reply_write))
        finally:
            os.close(request_read)
            os.close(reply_write)
        self.confinement: dict[str, str] | None = None
        self.wall_s: dict[str, float] = {}  # per op, the judge's clock from request to reply

    def ready(self) -> dict[str, str]:
        """Waits for the process to be up and confined; how it is confined."""
        if self.confinement is None:
            self.confinement = self._read()["confinement"]
        return self.confinement

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        """One request and its reply; raises CandidateFailed when the candidate raised."""
        self.ready()
        started = time.perf_counter()
        try:
            write_frame(self._requests, {"op": op, **fields})
        except BrokenPipeError:
            self._died()
        reply = self._read()
        self.wall_s[op] = time.perf_counter() - started
        if "error" in reply:
            raise CandidateFailed(reply["error"])
        return reply

    def close(self) -> None:
        try:
            write_frame(self._requests, {"op": "exit"})
        except OSError:
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._requests, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass

    def _read(self) -> dict[str, Any]:
        reply = read_frame(self._replies)
        if reply is None:
            self._died()
        return reply

    def _died(self) -> NoReturn:
        """The candidate's process ended without answering: this process ends the same way."""
        returncode = self.process.wait()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        faulthandler.disable()  # the candidate's own dump is the last one on stderr, as the sandbox expects
        if returncode < 0:
            signal.signal(-returncode, signal.SIG_DFL)
            os.kill(os.getpid(), -returncode)
            time.sleep(5)  # a signal that does not end a process by default (SIGCHLD...) falls through
        os._exit(returncode if returncode >= 0 else 1)
