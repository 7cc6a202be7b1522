"""Runs untrusted candidates, each in a fresh child process, with time, memory, disk and output limits.

One child is started ahead of time and has imported the heavy modules before it is needed, so a run only
sends its task. Each child runs under a keeper (process/keeper.py) in a session of its own: a spinning kernel
cannot be interrupted, so a timeout (or a cancelled run) has the keeper kill everything the child started, a
process that left the session or double-forked included; a worker that dies (SIGKILL, SIGTERM) ends the keeper's
lifeline, and the keeper kills the tree and removes the child's folders itself. The folders are named after the
worker (pid and PID namespace), so a worker starting later removes those of a worker that is gone
(`sweep_stale_folders`). child.py is the other end of the task and result pipes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from kernel_lsp.process.isolation import BUILD_CACHES, build_cache_root, candidate_environment, with_package_on_path
from kernel_lsp.process.failures import CUDA_ERROR_MARKERS, OUT_OF_MEMORY_MARKERS
from kernel_lsp.process.frames import FRAME_HEADER, decode_frame_body, encode_frame
from kernel_lsp.contracts.codec import ContractError, decode
from kernel_lsp.contracts.keeper_report import KeeperEnd, KeeperStart
from kernel_lsp.contracts.sandbox_reply import ChildReady, ChildReply, SandboxStatus, TracebackFrame
from kernel_lsp.process.keeper import KILL_WITHIN_S, KeeperLink, keeper_command
from kernel_lsp.process.namespaces import TASK_DIR_ENV, isolation_status
from kernel_lsp.candidate.handle import ALWAYS_WRITABLE, in_sandbox
from kernel_lsp.worker.child import user_frames

log = logging.getLogger(__name__)

CHILD_MODULE = "kernel_lsp.worker.child"
DEFAULT_OUTPUT_BYTES = 1 * 2**20
START_TIMEOUT_S = 120.0  # importing torch from a cold disk can take a minute
EXIT_GRACE_S = 5.0  # a child that has replied only has to exit; tearing down a CUDA context takes a moment
KEEPER_EXIT_S = EXIT_GRACE_S + KILL_WITHIN_S  # a keeper told to stop has killed the tree by then
DEFAULT_DISK_BYTES = 4 * 2**30
_OWNED_FOLDER = re.compile(r"^kernel-lsp-(?:home|task)-(?P<pid>\d+)\.(?P<namespace>\d+)-")
EXIT_POLL_S = 0.01
STDERR_TAIL_CHARS = 4000
READ_CHUNK_BYTES = 2**16
_FAULT_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+)$')
_FAULT_STACK_HEADER = "(most recent call first):"


@dataclass(frozen=True)
class SandboxLimits:
    wall_time_s: float = 60.0
    host_memory_bytes: int | None = 16 * 2**30
    gpu_memory_fraction: float | None = 0.9  # of the device's memory, for torch's caching allocator
    output_bytes: int = DEFAULT_OUTPUT_BYTES  # each of stdout and stderr
    # the run's folders, and files its processes hold open after deleting them (one file: RLIMIT_FSIZE)
    disk_bytes: int | None = DEFAULT_DISK_BYTES


@dataclass(frozen=True)
class SandboxTask:
    entry: str  # "package.module:function", called as function(**args) with the task dir as cwd and sys.path[0]
    args: dict[str, Any]  # the key "uses_cuda" is the sandbox's (host limit via RLIMIT_DATA), not passed on
    files: dict[str, str]  # relative name -> text, written into a fresh temp dir
    origins: dict[str, str] = field(default_factory=dict)  # relative name -> the user's real path
    preload: tuple[str, ...] = ()  # modules the next pre-started children import while they wait


@dataclass(frozen=True)
class SandboxRun:
    """How one task's run in a sandboxed child ended (a job's handler reads it into the job's Result)."""

    status: SandboxStatus
    message: str
    value: Any  # what the entry returned, None unless status is "ok"
    stdout: str
    stderr: str
    output_truncated: bool
    duration_s: float  # from sending the task to its reply (or the child's end)
    exit_code: int | None
    signal_name: str | None
    traceback: list[TracebackFrame]  # oldest first; the last frame is where it failed
    error_type: str | None
    # a confined sandbox's run: how its child was kept in ("namespaces", "files", "network": "isolated: ..." or
    # what was missing); None for the judge's own children
    isolation: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Sandbox:
    """Runs each task in a fresh child process of this one; one child waits, warm, for the next task (started
    when a run ends: nothing of the sandbox's starts while a task runs).

    A run's wall time is counted from sending the task, so a child's own start-up is never charged to it.

    `confined` (a tuple of folders, maybe empty) makes it a sandbox for user code (a run-python job, an
    extension's build): each child starts in the candidate's sandbox (process/namespaces.py, where one starts
    here) and confines itself with Landlock and seccomp before it imports anything, writing only its own folders,
    the candidates' build caches and the folders given. Without it (None), children are the judge's: they run
    kernel-lsp's own code, which starts candidates in their sandbox itself (candidate/handle.py).
    """

    def __init__(self, python: str = sys.executable, preload: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, confined: tuple[str, ...] | None = None) -> None:
        self._python = python
        self._preload = tuple(preload)
        self._env = dict(os.environ if env is None else env)
        self._confined = confined
        self._waiting: asyncio.Task[_Child] | None = None
        self._closed = False

    async def start(self) -> None:
        """Starts the waiting child now and waits until it is ready, so that the first run is warm too.

        Raises SandboxStartError when the child cannot start; a later start or run tries again.
        """
        self._prestart()
        waiting = self._waiting
        if waiting is None:
            return
        try:
            await asyncio.shield(waiting)
        except SandboxStartError:
            if self._waiting is waiting:
                self._waiting = None
            raise

    async def run(self, task: SandboxTask, limits: SandboxLimits) -> SandboxRun:
        """How the task's run ended. Cancelling it kills the child's process group."""
        if self._closed:
            raise RuntimeError("the sandbox is closed")
        self._preload = tuple(dict.fromkeys(self._preload + tuple(task.preload)))
        task_dir = None
        try:
            _task_frame(task, limits, "")  # a task msgpack cannot carry fails before a child is used
            child = await self._take_child()
            task_dir = child.task_dir  # made with the child: the candidate's process it starts ahead reads it
            child.guard(task_dir, limits.disk_bytes)
            ran = await _run_in(child, _task_frame(task, limits, task_dir), limits, task_dir, task.origins)
            return dataclasses.replace(ran, isolation=child.isolation)
        except SandboxStartError as failure:
            return _start_failure(str(failure))
        finally:
            if task_dir is not None:
                shutil.rmtree(task_dir, ignore_errors=True)  # here, not in the child: a killed child cannot clean up
            # the next child starts once this run is over, never while it runs: its imports (and on a GPU the CUDA
            # context of the candidate's process it starts ahead) would share the CPU and the device with the
            # judge's timed rounds. A one-shot client that closes the worker now ends it before it costs much
            self._prestart()

    async def close(self) -> None:
        """Stops the waiting child. Runs in progress end on their own; cancel them to kill their children."""
        self._closed = True
        waiting, self._waiting = self._waiting, None
        if waiting is None:
            return
        waiting.cancel()
        await asyncio.wait([waiting])
        if not waiting.cancelled() and waiting.exception() is None:
            await waiting.result().discard()

    def _prestart(self) -> None:
        if not self._closed and self._waiting is None:
            self._waiting = asyncio.create_task(self._spawn())

    async def _take_child(self) -> _Child:
        """The waiting child once ready, if it still lives; else a fresh one (the waiting one is a head start)."""
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            try:
                child = await self._started(waiting)
            except SandboxStartError:
                pass  # a fresh start below either works or reports its own failure
            else:
                if child.process.returncode is None:
                    return child
                await child.discard()  # it died while waiting, killed from outside
        return await self._started(asyncio.create_task(self._spawn()))

    async def _started(self, spawning: asyncio.Task[_Child]) -> _Child:
        try:
            return await asyncio.wait_for(spawning, START_TIMEOUT_S)
        except TimeoutError:
            raise SandboxStartError(f"the sandbox's child was not ready within {START_TIMEOUT_S:g} s "
                                    f"(importing {', '.join(self._preload) or 'nothing'})") from None

    async def _spawn(self) -> _Child:
        home = tempfile.mkdtemp(prefix=f"kernel-lsp-home-{owner_tag()}-")  # its HOME and TMPDIR, removed with it
        task_dir = os.path.realpath(tempfile.mkdtemp(prefix=f"kernel-lsp-task-{owner_tag()}-"))
        try:
            child = await _Child.start(self._python, self._preload, _child_environment(self._env, home, task_dir),
                                       home, task_dir, self._confined)
        except BaseException as error:
            for folder in (home, task_dir):  # a child that never started leaves only its folders
                shutil.rmtree(folder, ignore_errors=True)
            if isinstance(error, OSError):
                raise SandboxStartError(f"cannot start the sandbox's child with {self._python}: {error}") from None
            raise
        try:
            ready = await child.read_frame()
        except BaseException:
            child.kill()
            await asyncio.shield(child.discard())
            raise
        if ready is None:
            await child.discard()
            raise SandboxStartError(f"the sandbox's child ended before it was ready (exit status "
                                    f"{child.process.returncode}): {_tail(child.stderr.text())}")
        try:
            said = decode(ChildReady, ready)
        except ContractError as error:  # before any task: the child's own code, of another install?
            await child.discard()
            raise SandboxStartError(f"the sandbox's child said it was ready in a frame that breaks its contract: "
                                    f"{error}") from None
        if child.isolation is not None:
            child.isolation.update(said.confinement or {})
        return child


def owner_tag() -> str:
    """This worker in the name of its folders: its pid and PID namespace (a pid means nothing in another one)."""
    return f"{os.getpid()}.{_pid_namespace()}"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def sweep_stale_folders(folder: str | None = None) -> list[str]:
    """Removes the sandbox folders (children's homes, task folders) in the temporary folder whose worker is gone:
    those of a worker killed with its keepers, which nothing else removes. Only folders of this PID namespace
    whose owner pid is no longer running; the removed paths."""
    root = folder or tempfile.gettempdir()
    namespace = _pid_namespace()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        owned = _OWNED_FOLDER.match(entry.name)
        if owned is None or int(owned["namespace"]) != namespace or _running(int(owned["pid"])):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: its folders are not ours to judge
    return True


class SandboxStartError(Exception):
    """No child could be started and made ready (run() reports it as a 'sandbox-error' run)."""


class _CappedOutput:
    """What a child writes to one pipe, kept up to a cap; the rest is read and dropped so it never blocks."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.cap = DEFAULT_OUTPUT_BYTES
        self._kept = bytearray()
        self._seen = 0
        self.done = asyncio.create_task(self._drain(stream))

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(READ_CHUNK_BYTES):
            self._seen += len(chunk)
            room = self.cap - len(self._kept)
            if room > 0:
                self._kept += chunk[:room]

    @property
    def truncated(self) -> bool:
        return self._seen > self.cap

    def text(self) -> str:
        return self._kept[: self.cap].decode("utf-8", "replace")


class _Child:
    """One started child process under its keeper, with its frame pipes and captured output; it serves exactly one
    task. `process` is the keeper, which exits as the child did once nothing the child started is left."""

    def __init__(self, process: asyncio.subprocess.Process, link: KeeperLink, task_pipe: asyncio.WriteTransport,
                 results: asyncio.StreamReader, results_pipe: asyncio.ReadTransport, home: str, task_dir: str) -> None:
        self.process = process
        self.link = link
        self.home = home
        self.task_dir = task_dir
        self.kept: KeeperEnd | None = None  # the keeper's last report, once it has exited
        self._task_pipe = task_pipe
        self._results = results
        self._results_pipe = results_pipe
        self.stdout = _CappedOutput(process.stdout)
        self.stderr = _CappedOutput(process.stderr)
        self.isolation: dict[str, str] | None = None  # a confined child's (Sandbox's `confined`)

    @classmethod
    async def start(cls, python: str, preload: tuple[str, ...], env: dict[str, str], home: str,
                    task_dir: str, confined: tuple[str, ...] | None = None) -> _Child:
        task_read, task_write = os.pipe()
        result_read, result_write = os.pipe()
        link = KeeperLink()
        child = [python, "-P", "-m", CHILD_MODULE, "--task-fd", str(task_read), "--result-fd", str(result_write),
                 *(f"--preload={name}" for name in preload), f"--home={home}"]
        writable = None if confined is None else confined_writable(env, home, task_dir, confined)
        if writable is not None:
            child += ["--confine", *(f"--writable={folder}" for folder in writable)]
        namespaces = None if writable is None else isolation_status()
        if namespaces is not None and namespaces.startswith("isolated"):  # the keeper stays outside: should this worker die, it removes the folders the sandbox hides
            child = in_sandbox(child, writable, (), allow_network=False)
        command = keeper_command(python, child, *link.child_fds, new_session=True, remove=[home, task_dir])
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                pass_fds=(task_read, result_write, *link.child_fds), env=env,
                start_new_session=True,  # a signal to the worker's process group leaves the keeper to clean up
            )
        except BaseException:
            os.close(task_write)
            os.close(result_read)
            link.close()
            raise
        finally:
            # only the child may hold its ends, so that end of file on the results means it is gone
            os.close(task_read)
            os.close(result_write)
            link.started()
        try:
            started = await cls._connected(process, link, task_write, result_read, home, task_dir)
        except BaseException:
            link.release()
            raise
        if namespaces is not None:
            started.isolation = {"namespaces": namespaces}
        return started

    @property
    def sandboxed(self) -> bool:
        """Started by bubblewrap, which exits 128+N when the child dies of signal N."""
        return self.isolation is not None and self.isolation["namespaces"].startswith("isolated")

    @classmethod
    async def _connected(cls, process: asyncio.subprocess.Process, link: KeeperLink, task_write: int,
                         result_read: int, home: str, task_dir: str) -> _Child:
        loop = asyncio.get_running_loop()
        task_pipe, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(task_write, "wb", buffering=0))
        results = asyncio.StreamReader()
        results_pipe, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(results),
                                                       os.fdopen(result_read, "rb", buffering=0))
        return cls(process, link, task_pipe, results, results_pipe, home, task_dir)

    def guard(self, task_dir: str, disk_bytes: int | None) -> None:
        """The run's folders (the home and the task folder) are the keeper's to watch and, should this worker die,
        to remove; the disk limit applies from now on (not while the child waits)."""
        self.link.send(watch=[self.home, task_dir], remove=[task_dir], diskBytes=disk_bytes)

    async def read_frame(self) -> dict[str, Any] | None:
        """The child's next frame, or None when it closed the pipe (it has ended) first."""
        try:
            header = await self._results.readexactly(FRAME_HEADER.size)
            return decode_frame_body(await self._results.readexactly(FRAME_HEADER.unpack(header)[0]))
        except asyncio.IncompleteReadError:
            return None

    def cap_output(self, output_bytes: int) -> None:
        self.stdout.cap = self.stderr.cap = output_bytes

    async def exchange(self, task_frame: bytes) -> dict[str, Any] | None:
        """Sends the task; its reply, or None once the child (and all it started) has ended without one."""
        self._task_pipe.write(task_frame)
        self._task_pipe.close()  # after the buffered frame has gone out
        reply = await self.read_frame()
        if reply is None:
            await _exit_status(self.process, timeout_s=None)
        return reply

    async def finish(self) -> None:
        """After its reply the child exits by itself, and the keeper once what it started has ended or been
        killed; whatever lingers past the grace time is killed."""
        await _exit_status(self.process, EXIT_GRACE_S)
        await self.stop()

    def kill(self) -> None:
        """The keeper kills the child and everything it started."""
        self.link.release()

    async def stop(self) -> None:
        """Kills what is left, then collects the exit status, the keeper's report and the output (bounded)."""
        self.kill()
        if await _exit_status(self.process, KEEPER_EXIT_S) is None:
            self.process.kill()  # a keeper that does not end: the child dies with it (PR_SET_PDEATHSIG)
            await _exit_status(self.process, EXIT_GRACE_S)
        drains = [self.stdout.done, self.stderr.done]
        await asyncio.wait(drains, timeout=EXIT_GRACE_S)
        for drain in drains:
            drain.cancel()  # a process the keeper could not kill may still hold a pipe open
        if not self._task_pipe.is_closing():
            self._task_pipe.abort()
        self._results_pipe.close()
        self.kept = self.link.end()
        _log_keeper(self.link.start(0), self.kept)
        self.link.close()
        shutil.rmtree(self.home, ignore_errors=True)  # the task folder stays until the run's result is read

    async def discard(self) -> None:
        """Stops a child that ran no task, and removes its task folder too."""
        await self.stop()
        shutil.rmtree(self.task_dir, ignore_errors=True)

    def ending(self) -> _Ending:
        returncode = self.process.returncode
        if self.sandboxed and returncode is not None and 128 < returncode < 128 + signal.NSIG:
            returncode = 128 - returncode  # bubblewrap's 128+N: the child died of signal N
        return _Ending(returncode, self.stdout.text(), self.stderr.text(),
                       self.stdout.truncated or self.stderr.truncated, self.kept)


def confined_writable(env: dict[str, str], home: str, task_dir: str, extra: tuple[str, ...]) -> list[str]:
    """What a confined child writes: its home and task folder, the candidates' build caches (named in its
    environment), the folders its sandbox was given, and /dev and /proc (process/confine.py's ALWAYS_WRITABLE)."""
    caches = [env[name] for name in BUILD_CACHES if env.get(name)]
    for folder in (*caches, *extra):
        os.makedirs(folder, exist_ok=True)
    return list(dict.fromkeys([home, task_dir, *caches, *extra, *ALWAYS_WRITABLE]))


_said_keeper_problem = False


def _log_keeper(start: KeeperStart | None, kept: KeeperEnd | None) -> None:
    """What the keeper could not do, and what the child left behind, in the worker's log."""
    global _said_keeper_problem
    problem = start.subreaper if start is not None else None
    if problem and not _said_keeper_problem:
        _said_keeper_problem = True
        log.warning("sandbox: %s; a candidate's detached processes may outlive their run", problem)
    if kept is None:
        log.warning("sandbox: the keeper of a child was killed before it reported; what the child started may "
                    "still run")
        return
    if kept.left_count:
        log.warning("sandbox: a child left %d process(es) running, killed: %s", kept.left_count, "; ".join(kept.left))
    if kept.unkilled:
        log.error("sandbox: process(es) would not die within %g s of SIGKILL: %s", KILL_WITHIN_S,
                  "; ".join(kept.unkilled))


@dataclass(frozen=True)
class _Ending:
    """What is known of a child once it is gone."""

    returncode: int | None
    stdout: str
    stderr: str
    output_truncated: bool
    kept: KeeperEnd | None  # the keeper's last report


async def _run_in(child: _Child, task_frame: bytes, limits: SandboxLimits, task_dir: str,
                  origins: dict[str, str]) -> SandboxRun:
    child.cap_output(limits.output_bytes)
    started = time.monotonic()
    try:
        reply = await asyncio.wait_for(child.exchange(task_frame), limits.wall_time_s)
        duration_s = time.monotonic() - started
        await child.finish()
    except TimeoutError:
        await child.stop()
        message = f"ran past the wall-time limit of {limits.wall_time_s:g} s and was killed"
        return _sandbox_run("timeout", message, child.ending(), time.monotonic() - started)
    except BaseException:
        child.kill()  # cancelled: a spinning kernel cannot be interrupted, only killed
        await asyncio.shield(child.stop())
        raise
    ending = child.ending()
    if ending.kept is not None and ending.kept.reason == "disk":
        return _sandbox_run("disk-limit", _over_disk_limit(ending.kept), ending, duration_s)
    if reply is None:
        return _ran_from_exit(ending, duration_s, task_dir, origins)
    return _ran_from_reply(reply, ending, duration_s)


def _over_disk_limit(kept: KeeperEnd) -> str:
    return (f"took {kept.disk_bytes / 2**20:.0f} MiB of disk in its folders, over the limit of "
            f"{(kept.disk_limit or 0) / 2**20:.0f} MiB (limits.diskBytes); its processes were killed and its files "
            f"removed")


def _task_frame(task: SandboxTask, limits: SandboxLimits, task_dir: str) -> bytes:
    return encode_frame({"entry": task.entry, "args": task.args, "files": task.files, "origins": task.origins,
                         "preload": list(task.preload), "task_dir": task_dir,
                         "host_memory_bytes": limits.host_memory_bytes,
                         "gpu_memory_fraction": limits.gpu_memory_fraction, "disk_bytes": limits.disk_bytes})


def _sandbox_run(status: SandboxStatus, message: str, ending: _Ending, duration_s: float, *, value: Any = None,
             frames: list[TracebackFrame] | None = None, error_type: str | None = None) -> SandboxRun:
    code = ending.returncode
    return SandboxRun(status, message, value, ending.stdout, ending.stderr, ending.output_truncated,
                          duration_s, code if code is None or code >= 0 else None,
                          _signal_name(-code) if code is not None and code < 0 else None, frames or [], error_type)


def _ran_from_reply(reply: dict[str, Any], ending: _Ending, duration_s: float) -> SandboxRun:
    """The run as the child's reply says it ended; a reply that breaks its contract (the task's code can write
    to the child's result pipe) is a sandbox-error run naming the keys."""
    try:
        said = decode(ChildReply, reply)
    except ContractError as error:
        return _sandbox_run("sandbox-error", f"the sandbox's child sent a reply that breaks its contract: {error}",
                            ending, duration_s)
    return _sandbox_run(said.status, said.message, ending, duration_s, value=said.value, frames=said.traceback,
                        error_type=said.error_type)


def _ran_from_exit(ending: _Ending, duration_s: float, task_dir: str,
                       origins: dict[str, str]) -> SandboxRun:
    status, message = _classify_exit(ending.returncode, ending.stderr)
    return _sandbox_run(status, message, ending, duration_s, frames=_fault_frames(ending.stderr, task_dir, origins))


def _classify_exit(returncode: int | None, stderr: str) -> tuple[SandboxStatus, str]:
    """How a child that wrote no reply ended, told from its exit status and what it last wrote to stderr."""
    if returncode is None:
        return "sandbox-error", f"the candidate's process could not be reaped: {_tail(stderr)}"
    signal_number = -returncode
    memory_line = _line_with(stderr, OUT_OF_MEMORY_MARKERS)
    if memory_line and signal_number in (signal.SIGKILL, signal.SIGABRT):
        killed = f"killed by {_signal_name(signal_number)}"
        return "out-of-memory", f"{killed} after running out of host memory: {memory_line}"
    cuda_line = _line_with(stderr, CUDA_ERROR_MARKERS)
    if cuda_line and (signal_number == signal.SIGABRT or returncode > 0):
        return "cuda-error", f"ended ({_ending_words(returncode)}) after a CUDA error: {cuda_line}"
    if signal_number == signal.SIGXFSZ:
        return "disk-limit", "killed by SIGXFSZ: it wrote a file past the run's disk limit (limits.diskBytes)"
    if returncode < 0:
        return "signal", f"killed by {_signal_name(signal_number)}{_signal_hint(signal_number)}"
    said = f": {_tail(stderr)}" if stderr else ""
    return "sandbox-error", f"the candidate's process exited with code {returncode} before returning a result{said}"


def _ending_words(returncode: int) -> str:
    return f"exit code {returncode}" if returncode >= 0 else _signal_name(-returncode)


def _signal_hint(signal_number: int) -> str:
    if signal_number == signal.SIGKILL:
        return " (not by the sandbox: the system's out-of-memory killer is the usual sender)"
    try:
        return f" ({signal.strsignal(signal_number)})"
    except ValueError:
        return ""


def _signal_name(signal_number: int) -> str:
    try:
        return signal.Signals(signal_number).name
    except ValueError:
        return f"signal {signal_number}"


def _line_with(text: str, markers: tuple[str, ...]) -> str:
    """The last line of text that mentions one of the markers (case-insensitive), or ""."""
    return next((line.strip() for line in reversed(text.splitlines())
                 if any(marker in line.lower() for marker in markers)), "")


def _fault_frames(stderr: str, task_dir: str, origins: dict[str, str]) -> list[TracebackFrame]:
    """faulthandler's dump (most recent call first) of a child that crashed, as frames oldest first."""
    if _FAULT_STACK_HEADER not in stderr:
        return []
    dumped: list[tuple[str, int, str, str]] = []
    for line in stderr.rpartition(_FAULT_STACK_HEADER)[2].splitlines()[1:]:
        match = _FAULT_FRAME.match(line)
        if match is None:
            break  # the stack ends at the first line that is not a frame
        number = int(match["line"])
        dumped.append((match["file"], number, match["function"], _source_line(match["file"], number)))
    return user_frames(reversed(dumped), task_dir, origins)


def _source_line(file: str, number: int) -> str:
    try:
        with open(file, encoding="utf-8", errors="replace") as source:
            return next(itertools.islice(source, number - 1, None), "").strip()
    except OSError:
        return ""


def _start_failure(message: str) -> SandboxRun:
    return SandboxRun("sandbox-error", message, None, "", "", False, 0.0, None, None, [], None)


def _tail(text: str) -> str:
    return text[-STDERR_TAIL_CHARS:].strip()


async def _exit_status(process: asyncio.subprocess.Process, timeout_s: float | None) -> int | None:
    """The exit status once the child is reaped (None if not within timeout_s).

    Polled rather than awaited with wait(): wait() also waits for the output pipes, which a grandchild that
    escaped the process group may hold open.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while process.returncode is None and (deadline is None or time.monotonic() < deadline):
        await asyncio.sleep(EXIT_POLL_S)
    return process.returncode


def _child_environment(env: dict[str, str], home: str, task_dir: str) -> dict[str, str]:
    """The child's environment: the allow-list of isolation.py (no secrets), HOME and TMPDIR at its scratch folder
    (so every file of the run, the candidate's process's included, is under the one folder its keeper removes),
    this kernel_lsp first on its path (the child must run the worker's own code), and its task folder (the
    candidate's process it starts ahead sees that folder alone of the worker's)."""
    environment = with_package_on_path(candidate_environment(env, home, build_cache_root()))
    environment["TMPDIR"] = home
    environment[TASK_DIR_ENV] = task_dir
    return environment
