"""`kernel-lsp worker`: the long-lived process that owns the GPU and runs jobs for servers and CLIs.

One connection = one client (the server's local worker speaks over stdin/stdout; a GPU server
listens on a unix socket or TCP; the commands' shared worker listens on the user's unix socket and exits once
no client has used it for its idle time: worker/rendezvous.py). Every connection starts with hello/welcome; a wrong
token closes it. A listening worker always asks for a token, on a unix socket too: one given (KERNEL_LSP_TOKEN,
--token-file), else one it makes and writes, readable by its user only, where its clients look
(protocol.token_file_for). Jobs run concurrently as asyncio tasks; untrusted code runs only inside the
sandbox's children. A malformed message gets an error reply; the worker itself never dies of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import secrets
import time
from pathlib import Path
from typing import Awaitable, BinaryIO, Callable

from kernel_lsp import __version__
from kernel_lsp.worker import protocol
from kernel_lsp.config import cache_dir
from kernel_lsp.findings import register_secret, secret_variable
from kernel_lsp.worker.environment import device_summary, package_version
from kernel_lsp.worker.jobs import JOB_KINDS, Handler, JobContext
from kernel_lsp.worker.protocol import ConnectionClosed, Job, ProtocolError, Result
from kernel_lsp.worker.sandbox import Sandbox, SandboxStartError, sweep_stale_folders
from kernel_lsp.worker.startup import TorchStartup

log = logging.getLogger(__name__)


class UsageError(Exception):
    """A listen address or token set-up the worker refuses to start with (exit status 2)."""


class WorkerDaemon:
    def __init__(self, token: str | None = None, max_frame: int = protocol.DEFAULT_MAX_FRAME,
                 warm: bool = True, single_client: bool = True, handlers: dict[str, Handler] | None = None) -> None:
        self.single_client = single_client
        self.handlers = dict(JOB_KINDS if handlers is None else handlers)  # job kind -> handler
        self.token = token
        self.max_frame = max_frame
        # children wait with torch already imported, so a candidate's start costs no import. For verifications the
        # candidate's process is started first (candidate/prestart.py; with a GPU, the baselines' process too), so
        # that its own imports and CUDA context run alongside the child's instead of after them: one after the other
        # took ~16 s on the H200, longer than a warm verification, and the next verification waited for it
        self.sandbox = Sandbox(preload=("kernel_lsp.candidate.prestart", "torch") if package_version("torch") else ())
        self.startup = TorchStartup()
        self._warm = warm
        self.stopped = asyncio.Event()
        self.cache_dir = cache_dir()
        # user code (run-python, an extension's build) runs in children confined like a candidate's process; they
        # also write the built extensions, which later run-python jobs load
        self.user_sandbox = Sandbox(preload=("torch",) if package_version("torch") else (),
                                    confined=(str(self.cache_dir / "extensions"),))
        self._gpu = asyncio.Semaphore(1)  # timing needs the GPU alone: GPU jobs queue, builds do not
        self._gpu_waiting = 0
        self._build_locks: dict[str, asyncio.Lock] = {}
        self.clients = 0  # connections open now: a listener with an idle time exits only when none is
        self.idle_since = time.monotonic()

    @contextlib.asynccontextmanager
    async def gpu_slot(self, progress: Callable[..., Awaitable[None]]):
        """Holds the GPU for one job; a job that has to wait says so in its progress."""
        if self._gpu.locked():
            await progress(f"waiting for the GPU ({self._gpu_waiting} other job(s) waiting)")
        self._gpu_waiting += 1
        try:
            await self._gpu.acquire()
        finally:
            self._gpu_waiting -= 1
        try:
            yield
        finally:
            self._gpu.release()

    def job_context(self, progress: Callable[..., Awaitable[None]]) -> JobContext:
        return JobContext(progress=progress, sandbox=self.sandbox, user_sandbox=self.user_sandbox,
                          startup=self.startup, cache_dir=self.cache_dir,
                          gpu_slot=lambda: self.gpu_slot(progress), build_lock=self.build_lock,
                          versions=self.versions)

    def build_lock(self, key: str) -> asyncio.Lock:
        """One build per content hash at a time: a second identical job waits and then finds it built."""
        return self._build_locks.setdefault(key, asyncio.Lock())

    def start_up(self) -> None:
        removed = sweep_stale_folders()  # a worker killed with its keepers left them: no one else removes them
        if removed:
            log.warning("removed %d folder(s) of sandboxes whose worker is gone: %s", len(removed), ", ".join(removed))
        if self._warm:
            self.startup.start()
        asyncio.ensure_future(self._prestart_sandbox())

    async def _prestart_sandbox(self) -> None:
        """The first candidate finds a child waiting too; a child that cannot start is retried per run."""
        try:  # the user code's sandbox starts with its first job: the editor's own jobs never use it
            await self.sandbox.start()
        except SandboxStartError as exc:
            log.warning("sandbox child did not start: %s", exc)

    async def close_sandboxes(self) -> None:
        await self.sandbox.close()
        await self.user_sandbox.close()

    def versions(self) -> dict[str, str | None]:
        from profilers.nvml import driver_version

        return {"python": platform.python_version(), "torch": package_version("torch"),
                "triton": package_version("triton"), "cuda": self.startup.cuda, "driver": driver_version()}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection, from hello to EOF; its unfinished jobs are cancelled when it goes."""
        send_lock = asyncio.Lock()

        async def send(message: dict) -> None:
            async with send_lock:
                await protocol.write_message(writer, message, self.max_frame)

        jobs: dict[int, asyncio.Task] = {}
        self.clients += 1
        try:
            if await self._handshake(reader, send):
                await self._dispatch_loop(reader, send, jobs)
        except (ConnectionClosed, ConnectionError):
            pass
        finally:
            for task in jobs.values():
                task.cancel()
            await asyncio.gather(*jobs.values(), return_exceptions=True)
            writer.close()
            self.clients -= 1
            self.idle_since = time.monotonic()

    async def _next_message(self, reader: asyncio.StreamReader,
                            send: Callable[[dict], Awaitable[None]]) -> dict | None:
        """The next valid message; a bad one gets an error reply. None: the stream cannot go on."""
        while True:
            try:
                return await protocol.read_message(reader, self.max_frame)
            except ProtocolError as exc:
                await send(protocol.error(exc.message_id, exc.code, str(exc)))
                if exc.fatal:
                    return None

    async def _handshake(self, reader: asyncio.StreamReader, send: Callable[[dict], Awaitable[None]]) -> bool:
        while (message := await self._next_message(reader, send)) is not None:
            if message["kind"] != "hello":
                await send(protocol.error(message.get("id"), "not-authenticated", "send hello first"))
                continue
            if not protocol.check_token(message.get("token"), self.token):
                log.warning("refused a client with a %s token", "missing" if message.get("token") is None else "wrong")
                await send(protocol.error(None, "auth-failed", AUTH_FAILED))
                return False
            await send(protocol.welcome(f"kernel-lsp {__version__}", self.versions(), device_summary(), True))
            return True
        return False

    async def _dispatch_loop(self, reader: asyncio.StreamReader, send: Callable[[dict], Awaitable[None]],
                             jobs: dict[int, asyncio.Task]) -> None:
        while (message := await self._next_message(reader, send)) is not None:
            kind = message["kind"]
            if kind == "ping":
                await send(protocol.pong(message["id"]))
            elif kind == "submit":
                await self._submit(message, send, jobs)
            elif kind == "cancel":
                task = jobs.get(message["id"])
                if task is None:
                    await send(protocol.error(message["id"], "unknown-job", f"no running job {message['id']}"))
                else:
                    task.cancel()
            elif kind == "shutdown":
                if self.single_client:  # a listening worker outlives its clients; a stdio one is its client's
                    self.stopped.set()
                return
            else:
                await send(protocol.error(message.get("id"), "unknown-kind", f"'{kind}' is not sent to a worker"))

    async def _submit(self, message: dict, send: Callable[[dict], Awaitable[None]],
                      jobs: dict[int, asyncio.Task]) -> None:
        job_id = message["id"]
        job = Job.from_wire(message["job"])
        if job.kind not in self.handlers:
            await send(protocol.error(job_id, "unknown-job-kind",
                                      f"unknown job kind '{job.kind}' (known: {', '.join(sorted(self.handlers))})"))
            return
        if job_id in jobs:
            await send(protocol.error(job_id, "busy", f"job {job_id} is already running"))
            return
        context = self.job_context(lambda text, fraction=None: send(protocol.progress(job_id, text, fraction)))
        jobs[job_id] = asyncio.ensure_future(self._run_job(job_id, job, context, send))
        jobs[job_id].add_done_callback(lambda _t: jobs.pop(job_id, None))

    async def _run_job(self, job_id: int, job: Job, context: JobContext,
                       send: Callable[[dict], Awaitable[None]]) -> None:
        try:
            result = await self.handlers[job.kind](job, context)
        except asyncio.CancelledError:
            result = Result("cancelled", [], {}, {}, "cancelled by the client")
            await asyncio.shield(_quiet(send(result.to_wire(job_id))))
            raise
        except Exception as exc:  # a job's bug fails that job, not the worker
            log.exception("job %s (%s) failed", job_id, job.kind)
            result = Result("failed", [], {}, {}, f"{type(exc).__name__}: {exc}")
        await send(result.to_wire(job_id))


async def _quiet(awaitable: Awaitable[None]) -> None:
    try:
        await awaitable
    except (ConnectionError, ConnectionClosed):
        pass


TOKEN_ENV = "KERNEL_LSP_TOKEN"
AUTH_FAILED = ("wrong or missing token: this worker asks every client for its token (KERNEL_LSP_TOKEN, --token-file "
               "or the workerTokenFile setting; a worker listening without one given made its own, readable by its "
               "user only, beside its unix socket (PATH.token) or under the cache folder's worker-tokens/)")


def read_token(token_file: str | None) -> str | None:
    """The token in `token_file`, else $KERNEL_LSP_TOKEN (held out of os.environ by the command: no child inherits
    it); registered, so it never shows in a message."""
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise UsageError(f"token file {token_file} is empty")
        register_secret(token)
        return token
    return secret_variable(TOKEN_ENV)


def make_token(daemon: WorkerDaemon, address: str) -> Path | None:
    """A listener given no token makes one (every socket asks for a token, a unix socket's too) and writes it, mode
    0600, where its clients look for it (protocol.token_file_for), before it listens. The file it wrote, or None
    when a token was given."""
    if daemon.token is not None:
        return None
    path = protocol.token_file_for(address)
    if path is None:  # parse_listen refuses a non-loopback TCP address without a token before this
        raise UsageError(f"refusing to listen on {address} without a token (KERNEL_LSP_TOKEN or --token-file)")
    token = secrets.token_urlsafe(32)
    if address.startswith("tcp:"):  # under the cache folder; a unix socket's folder is the user's to make
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a worker's before this one: never written through (O_EXCL, no symlink followed)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot write the worker's token to {path}: {exc}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    register_secret(token)
    daemon.token = token
    return path


def _remove_token_file(path: Path, token: str) -> None:
    """The token file this worker wrote, unless another worker has written its own there since."""
    if protocol.read_token_file(path) == token:
        with contextlib.suppress(OSError):
            path.unlink()


def parse_listen(address: str, token: str | None) -> tuple[str, str | int]:
    """'unix:PATH' or 'tcp:HOST:PORT'; TCP beyond loopback without a token is refused."""
    scheme, _, rest = address.partition(":")
    if scheme == "unix" and rest:
        return "unix", rest
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--listen tcp:HOST:PORT expected, got '{address}'")
        if token is None and not protocol.is_loopback(host.strip("[]")):
            raise UsageError(f"refusing to listen on {host} without a token: anyone who can reach it could run "
                             "code on this machine. Set KERNEL_LSP_TOKEN or --token-file, or listen on 127.0.0.1 "
                             "and reach it through an ssh tunnel (docs/PROTOCOL.md).")
        return host.strip("[]"), int(port)
    raise UsageError(f"--listen expects unix:PATH or tcp:HOST:PORT, got '{address}'")


async def run_stdio(daemon: WorkerDaemon, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Serve the one client on the other ends of stdin and `stdout` (a private copy of fd 1)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
    transport, stream_protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, stdout)
    writer = asyncio.StreamWriter(transport, stream_protocol, reader, loop)
    daemon.start_up()
    try:
        await daemon.serve(reader, writer)
    finally:
        await daemon.close_sandboxes()


async def run_listener(daemon: WorkerDaemon, address: str, idle_exit_s: float | None = None) -> None:
    """Listens on `address` until stopped, or, given idle_exit_s, until no client has been connected for that long;
    every client must present the token (given, or made here: make_token). UsageError or OSError: it could not
    start (the caller says so, exit status 2)."""
    host, port = parse_listen(address, daemon.token)
    made = make_token(daemon, address)
    socket_id = None
    try:
        if host == "unix":
            server = await asyncio.start_unix_server(daemon.serve, path=str(port))
            os.chmod(str(port), 0o600)  # only this user may connect at all; the token is asked for all the same
            socket_id = _file_id(str(port))
        else:
            server = await asyncio.start_server(daemon.serve, host=host, port=port)
        log.warning("kernel-lsp worker listening on %s%s%s", address,
                    f" (its token, for clients: {made})" if made else " (clients need its token)",
                    f"; it exits after {idle_exit_s:g} s without a client" if idle_exit_s is not None else "")
        daemon.start_up()
        idle = asyncio.ensure_future(_exit_when_idle(daemon, idle_exit_s)) if idle_exit_s is not None else None
        try:
            async with server:
                await daemon.stopped.wait()
        finally:
            if idle is not None:
                idle.cancel()
            await daemon.close_sandboxes()
    finally:
        if socket_id is not None:
            _remove_socket(str(port), socket_id)
        if made is not None and daemon.token is not None:
            _remove_token_file(made, daemon.token)


async def _exit_when_idle(daemon: WorkerDaemon, idle_s: float) -> None:
    """Stops the daemon once no client has been connected for idle_s (a connection open counts, its jobs with it)."""
    while True:
        left = daemon.idle_since + idle_s - time.monotonic()
        if daemon.clients == 0 and left <= 0:
            log.warning("no client for %g s: the worker exits", idle_s)
            daemon.stopped.set()
            return
        await asyncio.sleep(max(left, 0.05) if daemon.clients == 0 else idle_s)


def _file_id(path: str) -> tuple[int, int]:
    """Inode and change time: an inode number alone is reused once its file is removed."""
    info = os.stat(path)
    return info.st_ino, info.st_ctime_ns


def _remove_socket(path: str, socket_id: tuple[int, int]) -> None:
    """The socket this worker listened on, unless another worker listens there since (Python 3.11 leaves it)."""
    with contextlib.suppress(OSError):
        if _file_id(path) == socket_id:
            os.unlink(path)
