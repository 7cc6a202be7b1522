"""The server's side of the worker: start (or connect), hand over jobs, forward cancellation, time out,
and restart a worker that died, with backoff and a message saying so.

Address "" (the default) starts a local worker as a child process speaking over its stdin/stdout, with an
allow-listed environment (worker_environment: no credential reaches it, nor the candidates it runs);
"unix:PATH" and "tcp:HOST:PORT" connect to a worker that is already listening (e.g. on a GPU server), with the
token given, else the one the worker made and wrote for its clients (protocol.token_file_for). The commands' shared
worker (worker/rendezvous.py) is found, or started detached, on the user's socket, and greeted with its token.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from kernel_lsp import __version__
from kernel_lsp.process.isolation import CREDENTIAL, allowed
from kernel_lsp.worker import protocol
from kernel_lsp.worker.protocol import ConnectionClosed, Job, ProtocolError, Result
from kernel_lsp.worker.rendezvous import RendezvousError, SharedWorker

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 60.0
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
# what the local worker gets beyond the candidates' allow-list: its real HOME (its cache folder, the user's site
# packages), where its caches and settings are, and how its Python is set up; never a credential-named variable
WORKER_NAMES = frozenset({"HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "TEMP", "TMP"})
WORKER_PREFIXES = ("KERNEL_LSP_", "PYTHON", "CONDA_")


def worker_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a local worker started by a client: the candidates' allow-list (process/isolation.py)
    and WORKER_NAMES / WORKER_PREFIXES, minus anything named like a credential (the Anthropic API key, the worker's
    token, cloud and tool tokens): nothing a candidate must not read is ever in the worker's environment."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items()
            if allowed(name) or ((name in WORKER_NAMES or name.startswith(WORKER_PREFIXES))
                                 and not CREDENTIAL.search(name))}


@dataclass
class WorkerStatus:
    state: str = "stopped"  # stopped | starting | connected | restarting | failed
    address: str = "local"
    gpu: str | None = None
    driver: str | None = None
    memory_free_mib: int | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    running_jobs: int = 0
    restarts: int = 0
    message: str | None = None

    @property
    def busy(self) -> bool:
        return self.running_jobs > 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "busy": self.busy}


class WorkerUnavailable(Exception):
    """The worker could not be started or reached; the message says why."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 process: asyncio.subprocess.Process | None) -> None:
        self.reader, self.writer, self.process = reader, writer, process
        self.pending: dict[int, asyncio.Future] = {}
        self.progress: dict[int, Callable[[str, float | None], None]] = {}
        self.pongs: dict[int, asyncio.Future] = {}
        self.reader_task: asyncio.Task | None = None
        self.send_lock = asyncio.Lock()

    async def send(self, message: dict, max_frame: int) -> None:
        async with self.send_lock:
            await protocol.write_message(self.writer, message, max_frame)


class WorkerClient:
    def __init__(self, address: str = "", token: str | None = None, max_frame: int = protocol.DEFAULT_MAX_FRAME,
                 job_timeout_s: float = 600.0, python: str = sys.executable,
                 on_status: Callable[[WorkerStatus], None] | None = None,
                 on_message: Callable[[str], None] | None = None, shared: SharedWorker | None = None) -> None:
        self.shared = shared  # given: the user's shared worker, on its socket (address and token are its own)
        self.address = shared.address if shared is not None else address
        self.token = None if shared is not None else token
        self.max_frame = max_frame
        self.job_timeout_s = job_timeout_s
        self.python = python
        self.status = WorkerStatus(address=self.address or "local")
        self._on_status = on_status or (lambda s: None)
        self._on_message = on_message or (lambda m: None)
        self._connection: _Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._failures = 0
        self._last_failure = 0.0

    # --- public -------------------------------------------------------------------------------

    capacity = 1  # jobs worth running at once: one worker, whose GPU runs one job at a time

    async def run(self, job: Job, progress: Callable[[str, float | None], None] | None = None,
                  timeout_s: float | None = None) -> Result:
        """Runs one job; a worker that dies meanwhile gives status 'lost', a job past its time 'timeout'."""
        connection = await self._connected()
        job_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        connection.pending[job_id] = future
        if progress is not None:
            connection.progress[job_id] = progress
        self._set_status(running_jobs=self.status.running_jobs + 1)
        limit = self.job_timeout_s if timeout_s is None else timeout_s
        try:
            await connection.send(protocol.submit(job_id, job), self.max_frame)
            return await asyncio.wait_for(asyncio.shield(future), timeout=limit)
        except asyncio.TimeoutError:
            await self._cancel_quietly(connection, job_id)
            return Result("timeout", [], {}, {}, f"the job ran past its time limit ({limit:g} s) and was cancelled "
                                                 "(setting 'jobTimeoutS')")
        except asyncio.CancelledError:
            await asyncio.shield(self._cancel_quietly(connection, job_id))
            raise
        except (ConnectionError, ConnectionClosed) as exc:
            self._lost(connection, f"connection failed ({exc})")
            return Result("lost", [], {}, {}, f"the worker connection failed while sending the job: {exc}")
        finally:
            connection.pending.pop(job_id, None)
            connection.progress.pop(job_id, None)
            self._set_status(running_jobs=max(self.status.running_jobs - 1, 0))

    async def ping(self) -> float:
        """Round trip time in seconds (starting the worker first if needed)."""
        connection = await self._connected()
        ping_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        connection.pongs[ping_id] = future
        start = time.perf_counter()
        await connection.send(protocol.ping(ping_id), self.max_frame)
        await asyncio.wait_for(future, timeout=HANDSHAKE_TIMEOUT_S)
        return time.perf_counter() - start

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            await connection.send(protocol.shutdown(), self.max_frame)
        except (ConnectionError, ConnectionClosed, RuntimeError):
            pass
        await self._drop(connection)
        self._set_status(state="stopped")

    # --- connecting -----------------------------------------------------------------------------

    async def _connected(self) -> _Connection:
        async with self._connect_lock:
            if self._connection is not None:
                return self._connection
            delay = self._backoff_remaining()
            if delay > 0:
                await asyncio.sleep(delay)
            self._set_status(state="starting" if not self.status.restarts else "restarting")
            try:
                self._connection = await asyncio.wait_for(self._open(), timeout=HANDSHAKE_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError, ConnectionClosed, ProtocolError, WorkerUnavailable,
                    RendezvousError) as exc:
                self._failures += 1
                self._last_failure = time.monotonic()
                message = f"kernel-lsp: the GPU worker ({self.status.address}) is unavailable: {str(exc) or type(exc).__name__}"
                self._set_status(state="failed", message=message)
                raise WorkerUnavailable(message) from exc
            self._failures = 0
            return self._connection

    def _backoff_remaining(self) -> float:
        if not self._failures:
            return 0.0
        wait = BACKOFF_S[min(self._failures, len(BACKOFF_S)) - 1]
        return max(0.0, self._last_failure + wait - time.monotonic())

    async def _open(self) -> _Connection:
        if self.shared is not None:
            return await self._open_shared(self.shared)
        process = None
        if not self.address:
            # its own session: a terminal's Ctrl-C stops the command, which shuts its worker down (close); a
            # command that dies instead leaves the worker its stdin's end, and the worker exits
            process = await asyncio.create_subprocess_exec(
                self.python, "-m", "kernel_lsp", "worker", "--stdio", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, limit=2**20, start_new_session=True, env=worker_environment())
            reader, writer = process.stdout, process.stdin
        elif self.address.startswith("unix:"):
            reader, writer = await asyncio.open_unix_connection(self.address[5:], limit=2**20)
        elif self.address.startswith("tcp:"):
            host, _, port = self.address[4:].rpartition(":")
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port), limit=2**20)
        else:
            raise WorkerUnavailable(f"worker address must be empty (local), unix:PATH or tcp:HOST:PORT, "
                                    f"got '{self.address}'")
        return await self._greet(_Connection(reader, writer, process))

    async def _open_shared(self, shared: SharedWorker) -> _Connection:
        """The shared worker, greeted; one that closes on the greeting (it was exiting, idle) is reached again, which
        starts another."""
        reached = await shared.reach()
        try:
            return await self._greet(_Connection(reached.reader, reached.writer, None))
        except (ConnectionClosed, ConnectionError):
            reached.writer.close()
            if reached.started:
                raise
        reached = await shared.reach()
        return await self._greet(_Connection(reached.reader, reached.writer, None))

    async def _greet(self, connection: _Connection) -> _Connection:
        """hello and welcome; the status says what the worker has. A shared worker must be this kernel-lsp."""
        await connection.send(protocol.hello(f"kernel-lsp {__version__}", self._token()), self.max_frame)
        reply = await protocol.read_message(connection.reader, self.max_frame)
        if reply["kind"] != "welcome":
            await self._drop(connection)
            raise WorkerUnavailable(f"{reply.get('code', reply['kind'])}: {reply.get('message', '')}")
        if self.shared is not None and reply.get("worker") != f"kernel-lsp {__version__}":
            await self._drop(connection)
            raise WorkerUnavailable(f"the worker on {self.address} is {reply.get('worker')}, not kernel-lsp "
                                    f"{__version__}: stop it, or run with --fresh-worker")
        device = reply.get("device") or {}
        self._set_status(state="connected", versions=reply["versions"], gpu=device.get("name"),
                         driver=reply["versions"].get("driver"), memory_free_mib=device.get("memoryFreeMiB"),
                         message=None)
        connection.reader_task = asyncio.ensure_future(self._read_loop(connection))
        return connection

    def _token(self) -> str | None:
        """The token given, else the one a worker listening here made for its clients (read at each connection:
        a restarted worker makes another)."""
        if self.token is not None:
            return self.token
        path = protocol.token_file_for(self.address)
        return protocol.read_token_file(path) if path is not None else None

    async def _read_loop(self, connection: _Connection) -> None:
        try:
            while True:
                message = await protocol.read_message(connection.reader, self.max_frame)
                self._deliver(connection, message)
        except (ConnectionClosed, ConnectionError, ProtocolError) as exc:
            reason = await self._exit_reason(connection, exc)
            self._lost(connection, reason)

    def _deliver(self, connection: _Connection, message: dict) -> None:
        kind, message_id = message["kind"], message.get("id")
        if kind == "result":
            future = connection.pending.get(message_id)
            if future is not None and not future.done():
                future.set_result(Result.from_wire(message))
        elif kind == "progress":
            callback = connection.progress.get(message_id)
            if callback is not None:
                callback(message["message"], message.get("fraction"))
        elif kind == "pong":
            future = connection.pongs.pop(message_id, None)
            if future is not None and not future.done():
                future.set_result(None)
        elif kind == "error":
            future = connection.pending.get(message_id)
            if future is not None and not future.done():
                future.set_result(Result("failed", [], {}, {}, f"{message['code']}: {message['message']}",
                                         message["code"]))
            else:
                log.warning("worker error %s: %s", message["code"], message["message"])

    async def _exit_reason(self, connection: _Connection, exc: BaseException) -> str:
        if connection.process is not None:
            try:
                code = await asyncio.wait_for(connection.process.wait(), timeout=2)
                return f"exited with status {code}"
            except asyncio.TimeoutError:
                pass
        return f"closed the connection ({type(exc).__name__}: {exc})"

    def _lost(self, connection: _Connection, reason: str) -> None:
        """Every job in flight on a dead connection ends as 'lost'; the next job starts a new worker."""
        if self._connection is not connection:
            return
        self._connection = None
        lost = [f for f in connection.pending.values() if not f.done()]
        for future in lost:
            future.set_result(Result("lost", [], {}, {}, f"the worker {reason} while running this job"))
        for future in connection.pongs.values():
            if not future.done():
                future.set_exception(WorkerUnavailable(f"the worker {reason}"))
        self._failures += 1
        self._last_failure = time.monotonic()
        message = (f"kernel-lsp: the GPU worker {reason}; {len(lost)} job(s) lost. It will be restarted for the "
                   f"next job (in {self._backoff_remaining():.1f} s at the earliest).")
        self._set_status(state="restarting", restarts=self.status.restarts + 1, message=message)
        log.warning("%s", message)
        self._on_message(message)
        asyncio.ensure_future(self._drop(connection))

    async def _drop(self, connection: _Connection) -> None:
        if connection.reader_task is not None and connection.reader_task is not asyncio.current_task():
            connection.reader_task.cancel()
        connection.writer.close()
        if connection.process is not None and connection.process.returncode is None:
            try:
                await asyncio.wait_for(connection.process.wait(), timeout=5)
            except asyncio.TimeoutError:
                connection.process.kill()
                await connection.process.wait()

    async def _cancel_quietly(self, connection: _Connection, job_id: int) -> None:
        try:
            await connection.send(protocol.cancel(job_id), self.max_frame)
        except (ConnectionError, ConnectionClosed, RuntimeError):
            pass

    def _set_status(self, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(self.status, key, value)
        self._on_status(self.status)
