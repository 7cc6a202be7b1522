"""`kernel-lsp worker`: the long-lived process that owns the GPU and runs jobs for servers and CLIs.

One connection = one client (the server's local worker speaks over stdin/stdout; a GPU server
listens on a unix socket or TCP). Every connection starts with hello/welcome; a wrong token closes
it. Jobs run concurrently as asyncio tasks; untrusted code runs only inside the sandbox's children.
A malformed message gets an error reply; the worker itself never dies of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import platform
from typing import Awaitable, BinaryIO, Callable

from kernel_lsp import __version__
from kernel_lsp.worker import protocol
from kernel_lsp.config import cache_dir
from kernel_lsp.worker.environment import device_summary, package_version
from kernel_lsp.worker.jobs import JOB_KINDS, Handler, JobContext
from kernel_lsp.worker.protocol import ConnectionClosed, Job, ProtocolError, Result
from kernel_lsp.worker.sandbox import Sandbox, SandboxStartError, sweep_stale_folders

log = logging.getLogger(__name__)


class UsageError(Exception):
    """A listen address or token set-up the worker refuses to start with (exit status 2)."""


class Warmup:
    """torch imported and CUDA initialised once, in a thread, while the worker already answers."""

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.cuda: str | None = None
        self.cuda_available = False
        self.problem: str | None = None

    def start(self) -> None:
        self.task = asyncio.ensure_future(asyncio.to_thread(self._warm))

    async def wait(self) -> None:
        if self.task is not None:
            await asyncio.shield(self.task)

    def _warm(self) -> None:
        try:
            import torch
        except ImportError:
            self.problem = "torch is not installed in the worker's Python: pip install 'kernel-lsp[worker]'"
            return
        self.cuda = torch.version.cuda
        self.cuda_available = torch.cuda.is_available()
        if self.cuda_available:
            torch.cuda.init()


class WorkerDaemon:
    def __init__(self, token: str | None = None, max_frame: int = protocol.DEFAULT_MAX_FRAME,
                 warm: bool = True, single_client: bool = True, handlers: dict[str, Handler] | None = None) -> None:
        self.single_client = single_client
        self.handlers = dict(JOB_KINDS if handlers is None else handlers)  # job kind -> handler
        self.token = token
        self.max_frame = max_frame
        # children wait with torch already imported, so a candidate's start costs no import, and torch._dynamo
        # and inductor's compile_fx (the compile baseline imports them on first use: ~1.5 s). For verifications the
        # candidate's process is started first (verify/prestart.py), so that its own imports and CUDA context run
        # alongside the child's instead of after them: one after the other took ~16 s on the H200, longer than a
        # warm verification, and the next verification waited for it
        self.sandbox = Sandbox(preload=("kernel_lsp.verify.prestart", "torch", "torch._dynamo",
                                        "torch._inductor.compile_fx")
                               if package_version("torch") else ())
        self.warmup = Warmup()
        self._warm = warm
        self.stopped = asyncio.Event()
        self.cache_dir = cache_dir()
        self._gpu = asyncio.Semaphore(1)  # timing needs the GPU alone: GPU jobs queue, builds do not
        self._gpu_waiting = 0
        self._build_locks: dict[str, asyncio.Lock] = {}

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
        return JobContext(progress=progress, sandbox=self.sandbox, warmup=self.warmup, cache_dir=self.cache_dir,
                          gpu_slot=lambda: self.gpu_slot(progress), build_lock=self.build_lock,
                          versions=self.versions)

    def build_lock(self, key: str) -> asyncio.Lock:
        """One build per content hash at a time: a second identical job waits and then finds it built."""
        return self._build_locks.setdefault(key, asyncio.Lock())

    def start_warmup(self) -> None:
        removed = sweep_stale_folders()  # a worker killed with its keepers left them: no one else removes them
        if removed:
            log.warning("removed %d folder(s) of sandboxes whose worker is gone: %s", len(removed), ", ".join(removed))
        if self._warm:
            self.warmup.start()
        asyncio.ensure_future(self._prestart_sandbox())

    async def _prestart_sandbox(self) -> None:
        """The first candidate finds a child waiting too; a child that cannot start is retried per run."""
        try:
            await self.sandbox.start()
        except SandboxStartError as exc:
            log.warning("sandbox child did not start: %s", exc)

    def versions(self) -> dict[str, str | None]:
        from profilers.nvml import driver_version

        return {"python": platform.python_version(), "torch": package_version("torch"),
                "triton": package_version("triton"), "cuda": self.warmup.cuda, "driver": driver_version()}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection, from hello to EOF; its unfinished jobs are cancelled when it goes."""
        send_lock = asyncio.Lock()

        async def send(message: dict) -> None:
            async with send_lock:
                await protocol.write_message(writer, message, self.max_frame)

        jobs: dict[int, asyncio.Task] = {}
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
                log.warning("refused a client with a wrong or missing token")
                await send(protocol.error(None, "auth-failed", "wrong or missing token"))
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | None) -> str | None:
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise UsageError(f"token file {token_file} is empty")
        return token
    return os.environ.get("KERNEL_LSP_TOKEN") or None


def parse_listen(address: str, token: str | None) -> tuple[str, str | int]:
    """'unix:PATH' or 'tcp:HOST:PORT'; TCP beyond loopback without a token is refused."""
    scheme, _, rest = address.partition(":")
    if scheme == "unix" and rest:
        return "unix", rest
    if scheme == "tcp":
        host, _, port = rest.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--listen tcp:HOST:PORT expected, got '{address}'")
        if token is None and not is_loopback(host.strip("[]")):
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
    daemon.start_warmup()
    try:
        await daemon.serve(reader, writer)
    finally:
        await daemon.sandbox.close()


async def run_listener(daemon: WorkerDaemon, address: str) -> None:
    host, port = parse_listen(address, daemon.token)
    if host == "unix":
        server = await asyncio.start_unix_server(daemon.serve, path=str(port))
        os.chmod(str(port), 0o600)  # only this user may connect to an unauthenticated unix socket
    else:
        server = await asyncio.start_server(daemon.serve, host=host, port=port)
    log.warning("kernel-lsp worker listening on %s", address)
    daemon.start_warmup()
    try:
        async with server:
            await daemon.stopped.wait()
    finally:
        await daemon.sandbox.close()
