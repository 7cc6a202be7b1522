"""The judge's handle on the candidate's process (kernel_lsp.candidate.side): start it, ask it, read its answers.

The process is started at the very beginning of a verification, so that its imports overlap the reference's
set-up. It runs under a keeper of its own (process/keeper.py), a child of the judge: when it ends, whatever it
started and left running (a daemon, a process in a new session, a double fork) is killed and named, and the judge
rejects the candidate for it; when the judge dies, the keeper kills it all. It gets a scratch folder of its own as
HOME and TMPDIR, and may write only there, in the build caches, /dev and /proc (process/confine.py).

A request may have a time limit (CallLimit, from the reference's own time: verify/judge.py HangLimits): past it, the candidate
hangs, and its process and everything it started are killed (the run's `timeout`). If it dies without answering
(a segfault, an illegal address that aborts, the out-of-memory killer), the judge ends the same way (same signal
or exit code, the candidate's own stderr already in the shared stderr), so the sandbox reports the candidate's
crash exactly as it would have reported it in one process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from kernel_lsp.process.confine import SIGNAL_SCOPE_ABI, landlock_abi
from kernel_lsp.process.frames import read_frame, write_frame
from kernel_lsp.process.isolation import (BUILD_CACHES, build_cache_root, candidate_environment, judge_build_root,
                                         with_package_on_path)
from kernel_lsp.contracts.candidate_replies import ErrorReply, RunFailure
from kernel_lsp.contracts.codec import ContractError, decode
from kernel_lsp.contracts.keeper_report import KeeperEnd
from kernel_lsp.process.keeper import KILL_WITHIN_S, KeeperLink, keeper_command, processes_isolation
from kernel_lsp.process.namespaces import (TASK_DIR_ENV, SandboxPlan, isolation_status, make_readable, prepare_writable,
                                           sandbox_command)

SIDE_MODULE = "kernel_lsp.candidate.side"
ALWAYS_WRITABLE = ("/dev", "/proc")  # device nodes CUDA opens read-write; CUDA's driver writes under /proc/self
LEFT_GRACE_S = 1.0  # what the candidate's process started may take this long to end after it
CLOSE_S = 5.0  # the process exits by itself when asked; past this it is killed
KEEPER_START_S = 30.0
PROFILING_PARAMS = "/proc/driver/nvidia/params"  # the driver's RmProfilingAdminOnly
INHERITED_LIMITS = ("RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_AS")  # what a task sets in the sandbox child
Reply = TypeVar("Reply")
Said = Mapping[str, object]  # a reply as it came off the pipe: the candidate's word until decoded (decoded_reply)


def candidate_launch(home: Path, caches: Path | None = None) -> tuple[dict[str, str], list[str]]:
    """How a candidate's process is started: its environment (the allow-list of process/isolation.py, so no
    secret, with HOME and TMPDIR at `home` and this kernel_lsp on its path) and the folders it may write once
    confined (`home`, the build caches, /dev and /proc). The candidate's process of a verification or a
    profile and the program ncu profiles all start this way; the baselines' process (BaselineProcess) too, with
    the judge's build caches as `caches` (no candidate can write those)."""
    environment = with_package_on_path(candidate_environment(os.environ, str(home), caches or build_cache_root()))
    environment["HOME"] = environment["TMPDIR"] = str(home)
    writable = [str(home), *ALWAYS_WRITABLE]
    for name in BUILD_CACHES:  # the candidates' folders (candidate_environment), never the judge's
        Path(environment[name]).mkdir(parents=True, exist_ok=True)
        writable.append(environment[name])
    return environment, writable


def task_folders(files: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What a candidate's process reads of the host besides the system: the task folder (the sandbox child's, made
    with it, else the current folder) and the folders of the task's files."""
    task = os.environ.get(TASK_DIR_ENV) or os.getcwd()
    return tuple(dict.fromkeys([task, *(os.path.dirname(os.path.abspath(file)) for file in files)]))


def in_sandbox(command: list[str], writable: list[str], readable: tuple[str, ...], allow_network: bool) -> list[str]:
    """`command` started in the candidate's sandbox (process/namespaces.py; the caller has checked that one starts
    here): it writes `writable` (the sandbox's user owns them), reads `readable` and the system, nothing else."""
    own = tuple(folder for folder in writable if folder not in ALWAYS_WRITABLE)
    prepare_writable(own)
    make_readable(readable)
    return sandbox_command(command, SandboxPlan(writable=own, readable=readable, network=allow_network))


def tool_in_sandbox(argv: list[str], writable: list[str], readable: tuple[str, ...], allow_network: bool,
                    counters: bool = False) -> tuple[list[str], str]:
    """A tool that runs a candidate (ncu, compute-sanitizer, a standalone program's run) with the candidate in the
    candidate's sandbox where one starts here, and how it runs ("isolated: ..." or why not). The tool writes its
    reports in `writable` folders the candidate, confined inside by Landlock to its own, cannot write. With
    `counters` (ncu), a driver that keeps performance counters for root keeps the tool out of the sandbox."""
    status = tool_isolation(counters)
    if not status.startswith("isolated"):
        return argv, status
    return in_sandbox(argv, writable, readable, allow_network), status


def tool_isolation(counters: bool = False) -> str:
    """Whether a tool that runs a candidate runs it in the sandbox here (tool_in_sandbox), said plainly."""
    status = isolation_status()
    if status.startswith("isolated") and counters and counters_admin_only():
        return ("not isolated: the NVIDIA driver lets only root read performance counters (RmProfilingAdminOnly: "
                "1), and the sandbox never runs as root: ncu and its program run confined by Landlock and seccomp "
                "only; 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' lets the sandbox profile")
    return status


def counters_admin_only() -> bool:
    try:
        return "RmProfilingAdminOnly: 1" in Path(PROFILING_PARAMS).read_text()
    except OSError:
        return False


def candidate_process(allow_network: bool, device: str,
                      files: tuple[str, ...] = ()) -> contextlib.AbstractContextManager[CandidateProcess]:
    """The candidate's process for one task: the one this sandbox child started while it waited
    (candidate/prestart.py) if it suits, else a new one; closed and its scratch folder removed afterwards.
    For the CPU it runs Triton's interpreter (TRITON_INTERPRET=1), which Triton reads when it is imported: the
    process must start with it. `files`: the task's files it loads (their folders are readable in its sandbox,
    besides the task folder)."""
    return _task_process(CandidateProcess, allow_network, device, files)


def baseline_process(device: str, files: tuple[str, ...] = ()) -> contextlib.AbstractContextManager[BaselineProcess]:
    """The baselines' process for one verification (verify/rounds.py measure), as candidate_process has it (taken
    from prestart on a machine with a GPU only), never with the network; killed at once if it was never asked
    anything (the candidate was not timed: it may still be importing torch)."""
    return _task_process(BaselineProcess, False, device, files)


@contextlib.contextmanager
def _task_process(kind: type[CandidateProcess], allow_network: bool, device: str,
                  files: tuple[str, ...]) -> Iterator[Any]:
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    prestart = sys.modules.get("kernel_lsp.candidate.prestart")  # imported only where the worker preloads it
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    readable = task_folders(files)
    process = prestart.take(allow_network, interpret, readable, kind.baselines) if prestart is not None else None
    if process is None:
        process = kind(Path(tempfile.mkdtemp(prefix=kind.scratch_prefix)), allow_network, readable)
    try:
        yield process
    finally:
        if kind.baselines and not process.wall_s:
            process.kill()
        process.close()
        shutil.rmtree(process.scratch, ignore_errors=True)


class CandidateFailed(Exception):
    """The candidate raised in its own process, hung, or answered against the contract; `sandbox_failure` is how
    (the sandbox child reports it)."""

    def __init__(self, failure: RunFailure) -> None:
        super().__init__(failure.message or "the candidate failed")
        self.sandbox_failure = failure


def decoded_reply(cls: type[Reply], op: str, reply: object) -> Reply:
    """The candidate's process's reply to `op` as `cls` (contracts/candidate_replies.py). The candidate's code runs
    in that process and can write any frame: a reply that breaks the contract is the candidate's failure of the
    request (CandidateFailed, naming the contract and each bad key), never the judge's."""
    try:
        return decode(cls, reply)
    except ContractError as exc:
        raise CandidateFailed(broken_reply(op, str(exc))) from None


def broken_reply(op: str, why: str) -> RunFailure:
    return RunFailure("python-exception", f"the candidate's process answered {op!r} against its contract ({why})",
                      "ContractError")


def reply_failure(op: str, reply: Said) -> RunFailure:
    """How a request failed, as its {"error": ...} reply says (a reply that breaks ErrorReply's contract is a
    failure all the same, named so)."""
    try:
        return decode(ErrorReply, reply).error
    except ContractError as exc:
        return broken_reply(op, str(exc))


@dataclass(frozen=True)
class CallLimit:
    """How long one request may take before the candidate is said to hang: `what` it asked, `why` this long."""

    seconds: float
    what: str
    why: str


class CandidateProcess:
    """The candidate's process under its keeper, both in the candidate's sandbox (process/namespaces.py) where it
    can start: `namespaces` says how it runs ("isolated: ..." or what is missing). `readable`: the folders of the
    task's files (by default the sandbox child's task folder, TASK_DIR_ENV, else the current folder)."""

    baselines = False  # the baselines' process (BaselineProcess): side.py skips what only a candidate needs
    scratch_prefix = "kernel-lsp-judge-"  # its scratch folder's, under the temporary folder

    def __init__(self, scratch: Path, allow_network: bool, readable: tuple[str, ...] | None = None) -> None:
        self.scratch = scratch  # the caller removes it once the process is closed
        self.home = scratch / "candidate-home"
        self.exchange_folder = self.home / "exchange"
        self.exchange_folder.mkdir(parents=True, exist_ok=True)
        environment, writable = candidate_launch(self.home, self.caches())
        self.interpret = environment.get("TRITON_INTERPRET") == "1"  # Triton reads it once, at import
        self.namespaces = isolation_status()
        sandboxed = self.namespaces.startswith("isolated")
        request_read, self._requests = os.pipe()
        self._replies, reply_write = os.pipe()
        # device memory crosses as file descriptors over this socket: legacy CUDA IPC does not cross PID namespaces
        self.channel, channel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if sandboxed else (None, None)
        child_fds = (request_read, reply_write, *([channel_end.fileno()] if channel_end else []))
        self.link = KeeperLink()
        command = [sys.executable, "-P", "-m", SIDE_MODULE, "--requests-fd", str(request_read),
                   "--replies-fd", str(reply_write), "--exchange", str(self.exchange_folder),
                   *([f"--channel-fd={channel_end.fileno()}"] if channel_end else []),
                   *(f"--writable={folder}" for folder in writable), *(["--allow-network"] if allow_network else []),
                   *(["--baselines"] if self.baselines else [])]
        command = keeper_command(sys.executable, command, *self.link.child_fds, grace_s=LEFT_GRACE_S)
        self.readable = readable if readable is not None else task_folders()
        if sandboxed:
            command = in_sandbox(command, writable, self.readable, allow_network)
        try:
            self.process = subprocess.Popen(  # the keeper, whose one child is the candidate's process
                command, stdin=subprocess.DEVNULL, env=environment, pass_fds=(*child_fds, *self.link.child_fds))
        except BaseException:
            self.link.close()
            if self.channel is not None:
                self.channel.close()
            raise
        finally:
            os.close(request_read)
            os.close(reply_write)
            if channel_end is not None:
                channel_end.close()
            self.link.started()
        self.confinement: dict[str, str] | None = None
        self._pending_ready: Said | None = None  # the ready frame, when inherit_limits read it first
        self.kept: KeeperEnd | None = None  # the keeper's last report, once closed (None: it was killed)
        self.wall_s: dict[str, float] = {}  # per op, the judge's clock from request to reply

    def caches(self) -> Path | None:
        """The build caches' root (None: the candidates')."""
        return None

    def ready(self) -> dict[str, str]:
        """Waits for the process to be up and confined; how it is confined (files, network, processes)."""
        if self.confinement is None:
            ready, self._pending_ready = self._pending_ready or self._read(None), None
            confinement = dict(ready["confinement"])
            scoped = confinement["files"].startswith("isolated") and landlock_abi() >= SIGNAL_SCOPE_ABI
            confinement["processes"] = processes_isolation(self.link.start(KEEPER_START_S), scoped)
            confinement["namespaces"] = self.namespaces
            self.confinement = confinement
        return self.confinement

    def reads(self, folders: tuple[str, ...]) -> bool:
        """Whether each of `folders` lies in a folder this process may read (a process started ahead of its task
        serves only a task whose files it can see)."""
        return all(any(Path(folder).is_relative_to(own) for own in self.readable) for folder in folders)

    def inherit_limits(self) -> bool:
        """A process started ahead of its task gets the file size and memory limits the task set in this process
        since (a process started now inherits them). The process sets them itself, before any of the candidate's
        code runs: from outside, prlimit needs CAP_SYS_RESOURCE over a process of another user (the sandbox's).
        False when it did not answer so (no candidate code ran yet: the caller starts another, and this process
        must not end the way it did, as it would for a candidate's death)."""
        limits = {name: list(resource.getrlimit(getattr(resource, name))) for name in INHERITED_LIMITS}
        try:
            if self.confinement is None:
                ready = read_frame(self._replies, time.monotonic() + KEEPER_START_S)
                if ready is None or "confinement" not in ready:
                    return False
                self._pending_ready = ready
            write_frame(self._requests, {"op": "limit", "limits": limits})
            reply = read_frame(self._replies, time.monotonic() + KEEPER_START_S)
        except (OSError, TimeoutError, ValueError):
            return False
        return reply is not None and "error" not in reply

    def ask(self, op: str, limit: CallLimit | None = None, **fields: Any) -> Said:
        """One request and its reply, a map not yet decoded (the caller decodes what it reads: decoded_reply);
        raises CandidateFailed when the candidate raised, hung past `limit`, or answered no map."""
        self.ready()
        started = time.perf_counter()
        deadline = None if limit is None else time.monotonic() + limit.seconds
        try:
            write_frame(self._requests, {"op": op, **fields})
        except BrokenPipeError:
            self._died()
        try:
            reply = self._read(deadline)
        except TimeoutError:
            self._hung(limit)
        except ValueError as exc:  # not msgpack: the candidate wrote on the pipe
            raise CandidateFailed(broken_reply(op, f"not a msgpack frame: {exc}")) from None
        self.wall_s[op] = time.perf_counter() - started
        if not isinstance(reply, Mapping):
            raise CandidateFailed(broken_reply(op, f"expected a map, got {type(reply).__name__}"))
        if "error" in reply:
            raise CandidateFailed(reply_failure(op, reply))
        return reply

    def kill(self) -> None:
        """The keeper kills the process and everything it started."""
        self.link.release()

    def close(self) -> None:
        """Asks the process to exit, and reads what its keeper found left running after it (then killed)."""
        try:
            write_frame(self._requests, {"op": "exit"})
        except OSError:
            pass
        try:
            self.process.wait(CLOSE_S + LEFT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            try:
                self.process.wait(KILL_WITHIN_S + CLOSE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()  # the candidate's process dies with its keeper
                self.process.wait()
        self.kept = self.link.end()
        self.link.close()
        if self.channel is not None:
            self.channel.close()
        for fd in (self._requests, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass

    def _read(self, deadline: float | None) -> Said:
        reply = read_frame(self._replies, deadline)
        if reply is None:
            self._died()
        return reply

    def _hung(self, limit: CallLimit) -> NoReturn:
        self.kill()
        self.process.wait()
        raise CandidateFailed(RunFailure("timeout", f"{limit.what} did not return within {limit.seconds:.3g} s "
                                                    f"({limit.why}): the candidate hangs; its process and everything "
                                                    "it started were killed"))

    def _died(self) -> NoReturn:
        """The candidate's process ended without answering: this process ends the same way."""
        returncode = self.process.wait()  # the keeper's, which exits as the candidate's process did
        ended = self.link.end()  # in the sandbox, bwrap exits 128+N for a signal N: the keeper's report says which
        if ended is not None and ended.status is not None:
            returncode = ended.status
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        faulthandler.disable()  # the candidate's own dump is the last one on stderr, as the sandbox expects
        if returncode < 0:
            if -returncode not in (signal.SIGKILL, signal.SIGSTOP):  # these two take no handler
                signal.signal(-returncode, signal.SIG_DFL)
            os.kill(os.getpid(), -returncode)
            time.sleep(5)  # a signal that does not end a process by default (SIGCHLD...) falls through
        os._exit(returncode if returncode >= 0 else 1)


class BaselineFailed(Exception):
    """The baselines' process hung or died: the baselines are not timed (the candidate is not to blame)."""


class BaselineProcess(CandidateProcess):
    """A process of the candidate's kind (candidate/side.py, in the same sandbox, started the same way) that runs
    the reference's model, eager and compiled, for the baselines' batches (verify/rounds.py measure): the
    baselines pay what the candidate pays (a process's round trip, its sandbox) and are timed by the same
    protocol. Only the reference's code runs in it, with the judge's build caches (a candidate could plant a slow
    artifact in its own, keyed as the reference's compile would look it up). Its hang or death is its own failure,
    not the candidate's: BaselineFailed, where the candidate's process would end the judge as it ended."""

    baselines = True
    scratch_prefix = "kernel-lsp-baselines-"

    def caches(self) -> Path | None:
        return judge_build_root()

    def _hung(self, limit: CallLimit) -> NoReturn:
        self.kill()
        self.process.wait()
        raise BaselineFailed(f"the baselines' process did not answer within {limit.seconds:.3g} s ({limit.what})")

    def _died(self) -> NoReturn:
        returncode = self.process.wait()
        raise BaselineFailed(f"the baselines' process ended without answering (exit status {returncode})")
