"""The commands' shared worker: a `kernel-lsp verify` finds the worker a command before it left running, and starts
one, detached, only when none is there (as dmypy does), so that each call does not pay for a worker's start.

Where: `$XDG_RUNTIME_DIR/kernel-lsp/`, else `/tmp/kernel-lsp-<uid>/`, a folder of the user's that only the user may
open (0700, checked at every use). In it, per worker: `worker-<key>.sock` (mode 0600), its token beside it
(`.sock.token`, 0600, made by the worker: daemon.make_token), `.lock` (one command starts it at a time: fcntl.flock)
and `.log` (the worker's stderr). The key is a hash of what makes a worker fit to reuse: kernel-lsp's version and
folder, the Python, the largest frame and the environment the worker gets (client.worker_environment: its cache
folder, PATH, CUDA_*...), so a command of another version or other settings never reaches a worker started for
different ones: it finds, or starts, its own. A candidate's sandbox never sees the folder (its /tmp is its own,
/run is not mounted: process/namespaces.py), and the worker asks every connection for the token all the same.

The worker exits after KERNEL_LSP_WORKER_IDLE_S seconds (default 600) without a client. KERNEL_LSP_REUSE_WORKER=0,
or a command's --fresh-worker, gives the command a private worker of its own instead, as the server has.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kernel_lsp import __version__
from kernel_lsp.process.isolation import PACKAGE_ROOT

log = logging.getLogger(__name__)

REUSE_ENV = "KERNEL_LSP_REUSE_WORKER"  # "0": every command starts a private worker
IDLE_ENV = "KERNEL_LSP_WORKER_IDLE_S"
DEFAULT_IDLE_S = 600.0
START_TIMEOUT_S = 60.0  # from the start of the worker to its socket answering (imports on a loaded machine)
NOT_IN_KEY = frozenset({REUSE_ENV, IDLE_ENV})  # how long a worker waits does not make it another worker


class RendezvousError(Exception):
    """The shared worker could not be reached nor started; the message says why and how to do without it."""


def reuse_wanted(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(REUSE_ENV, "1").strip() not in ("0", "false", "no", "off")


def idle_seconds(environ: Mapping[str, str] | None = None) -> float:
    """KERNEL_LSP_WORKER_IDLE_S, else 600; a value that is not a positive number is the default."""
    try:
        value = float((os.environ if environ is None else environ).get(IDLE_ENV, DEFAULT_IDLE_S))
    except ValueError:
        return DEFAULT_IDLE_S
    return value if value > 0 else DEFAULT_IDLE_S


def rendezvous_folder(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_RUNTIME_DIR/kernel-lsp where the session has one (a folder), else /tmp/kernel-lsp-<uid>."""
    runtime = (os.environ if environ is None else environ).get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "kernel-lsp"
    return Path("/tmp") / f"kernel-lsp-{os.getuid()}"


def private_folder(folder: Path) -> Path:
    """`folder`, made if missing, once it is a real folder of this user's that no one else may open; else
    RendezvousError (another user's folder planted at that path would hand them our socket and token)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RendezvousError(f"{folder} is not a folder of yours: remove it, or run with --fresh-worker "
                              f"({REUSE_ENV}=0)")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(folder, 0o700)
    return folder


def reuse_key(python: str, environment: Mapping[str, str], max_frame_mib: int) -> str:
    """What a worker must share with a command to serve it, hashed: a worker differing in any of it is another."""
    fit = {"version": __version__, "package": PACKAGE_ROOT, "python": python, "maxFrameMiB": max_frame_mib,
           "environment": sorted((k, v) for k, v in environment.items() if k not in NOT_IN_KEY)}
    return hashlib.sha256(json.dumps(fit, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Reached:
    """An open connection to the shared worker, not yet greeted."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pid: int  # the worker's, as the kernel says (SO_PEERCRED)
    started: bool  # this command started it


class SharedWorker:
    """The shared worker for one key: found on its socket, else started detached under the lock."""

    def __init__(self, python: str, environment: Mapping[str, str], max_frame_mib: int,
                 folder: Path | None = None, idle_s: float | None = None) -> None:
        self.python = python
        self.environment = dict(environment)
        self.max_frame_mib = max_frame_mib
        self.folder = rendezvous_folder(environment) if folder is None else folder
        self.idle_s = idle_seconds(environment) if idle_s is None else idle_s
        self.key = reuse_key(python, environment, max_frame_mib)
        self.socket = self.folder / f"worker-{self.key}.sock"

    @property
    def address(self) -> str:
        return f"unix:{self.socket}"

    async def reach(self) -> Reached:
        """A connection to the worker on the socket, started first when none answers there. RendezvousError: the
        folder is not private, or the worker did not start (its log's last lines say why)."""
        private_folder(self.folder)
        found = await self._connect(started=False)
        if found is not None:
            return found
        lock = os.open(self.folder / f"worker-{self.key}.lock",
                       os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
            found = await self._connect(started=False)  # another command started it while this one waited
            return found if found is not None else await self._start()
        finally:
            os.close(lock)  # the lock goes with its descriptor

    async def _connect(self, started: bool) -> Reached | None:
        """The worker listening on the socket, or None when none does (no socket, or a dead worker's)."""
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.socket), limit=2**20)
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        sock = writer.get_extra_info("socket")
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            struct.calcsize("3i")))
        if uid != os.getuid():
            writer.close()
            raise RendezvousError(f"{self.socket} is served by another user's process (uid {uid}): not used")
        if not started:
            log.info("reusing the shared worker (pid %d) on %s", pid, self.address)
        return Reached(reader, writer, pid, started)

    async def _start(self) -> Reached:
        """Starts the worker in a session of its own (it outlives this command) and waits until it answers on the
        socket; the worker replaces a dead one's socket and token file (asyncio's unix server, daemon.make_token)."""
        log_path = self.folder / f"worker-{self.key}.log"
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            process = subprocess.Popen(
                [self.python, "-m", "kernel_lsp", "worker", "--listen", self.address, "--idle-exit",
                 f"{self.idle_s:g}", "--max-frame-mib", str(self.max_frame_mib)],
                stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, env=self.environment, cwd="/",
                start_new_session=True)
        finally:
            os.close(log_fd)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RendezvousError(f"the shared worker exited with status {process.returncode} before it "
                                      f"listened: {_tail(log_path)}")
            if self.socket.exists() and (found := await self._connect(started=True)) is not None:
                log.warning("started a shared worker (pid %d) on %s: it exits after %g s without a client "
                            "(%s; --fresh-worker or %s=0 for a private one)", found.pid, self.address, self.idle_s,
                            IDLE_ENV, REUSE_ENV)
                return found
            await asyncio.sleep(0.05)
        process.kill()
        raise RendezvousError(f"the shared worker did not listen within {START_TIMEOUT_S:g} s: {_tail(log_path)}")


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) or "(its log is empty)"
    except OSError as exc:
        return f"(its log {path} could not be read: {exc})"
