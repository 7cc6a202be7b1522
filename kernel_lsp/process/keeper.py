"""The keeper: a small process between a parent and the program it runs, so that nothing the program starts
outlives it, and no folder of it outlives its parent (Linux).

`python -I -S keeper.py --control-fd C --report-fd R [--new-session] [--grace S] [--remove DIR]... -- PROGRAM...`
starts PROGRAM as its only child and stays its parent:

- It is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever PROGRAM starts, however it detaches (a new session,
  a double fork, another process group), is re-parented to the keeper when its own parent dies, so the whole tree
  is found in /proc by parent ids and killed. A process group is not enough (setsid() leaves it), a PID or user
  namespace would change what a candidate sees of /proc and broke CUDA IPC on the H200 (process/confine.py), and
  cgroups are writable only where someone delegated them: a subreaper needs no privilege and changes nothing the
  candidate sees.
- PROGRAM gets PR_SET_PDEATHSIG(SIGKILL): it dies with the keeper (the keeper has one thread, the one that forked).
- The control pipe is the lifeline: only the parent holds its other end. End of file (the parent died, of SIGKILL
  or SIGTERM alike, or closed it to stop the run) kills the whole tree and removes the --remove folders (the
  parent closes it only when it is done with them). JSON lines on it add folders to watch and to remove, and set
  a disk limit: when the watched folders, and the files the tree holds open after deleting them, take more, the
  tree is killed (checked every DISK_POLL_S while a limit is set, and once more when PROGRAM ends).
- When PROGRAM ends by itself, what it left running gets --grace seconds to end too; then it is killed, and named
  in the report (the judge rejects a candidate for it).
- SIGTERM to the keeper kills the tree too.

The report pipe gets two JSON lines: at the start {"child": pid, "subreaper": null, or why the tree cannot be
followed}, at the end {"status" (PROGRAM's exit code, negative for a signal), "reason" (null: it ended by itself;
"lifeline", "disk", "signal"), "left", "leftCount", "unkilled", "diskBytes", "diskLimit"}. Then the keeper exits
as PROGRAM did (the same code or signal), so its parent reads PROGRAM's ending from it. Stdlib only, and run as a
file with -I -S: it starts in about 10 ms and depends on nothing of the environment or of kernel_lsp.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import select
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the keeper itself runs with -I -S: nothing outside the stdlib at run time
    from kernel_lsp.contracts.keeper_report import KeeperEnd, KeeperStart

KEEPER_FILE = os.path.abspath(__file__)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
DEFAULT_GRACE_S = 1.0
KILL_WITHIN_S = 10.0  # a process in an uninterruptible driver call may take a while to die
DISK_POLL_S = 0.25
LINGER_POLL_S = 0.02
LISTED = 20  # processes named in a report; leftCount has them all
START_FIELD = 19  # starttime in /proc/PID/stat, counted after the ")" that ends the command name
EXIT_UNKNOWN = 125


def keeper_command(python: str, program: list[str], control_fd: int, report_fd: int, *, new_session: bool = False,
                   grace_s: float = DEFAULT_GRACE_S, remove: Iterable[str] = ()) -> list[str]:
    """The command that runs `program` under a keeper (see the module's docstring)."""
    return [python, "-I", "-S", KEEPER_FILE, f"--control-fd={control_fd}", f"--report-fd={report_fd}",
            *(["--new-session"] if new_session else []), f"--grace={grace_s}", *(f"--remove={path}" for path in remove),
            "--", *program]


class KeeperLink:
    """The parent's ends of a keeper's two pipes: the lifeline it writes to (closing it ends the run) and the
    report it reads. `child_fds` go to the keeper (pass_fds); `started()` closes them here once it runs."""

    def __init__(self) -> None:
        self._control_read, self._control = os.pipe()
        self._report, self._report_write = os.pipe()
        self._buffer = b""
        self._eof = False
        self.lines: list[dict] = []

    @property
    def child_fds(self) -> tuple[int, int]:
        return self._control_read, self._report_write

    def started(self) -> None:
        for fd in self.child_fds:
            _close(fd)

    def send(self, **message: object) -> None:
        """A control line (watch, remove, diskBytes); nothing if the keeper is gone."""
        try:
            os.write(self._control, json.dumps(message).encode() + b"\n")
        except OSError:
            pass

    def release(self) -> None:
        """Closes the lifeline: the keeper kills the tree and removes its folders (idempotent)."""
        if self._control >= 0:
            _close(self._control)
            self._control = -1

    def start(self, timeout_s: float | None = None) -> KeeperStart | None:
        """The keeper's first line, waiting for it; None if it never came or is not a KeeperStart."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.lines and not self._eof and self._report >= 0:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._pull(remaining)
            if remaining == 0.0:
                break
        return _decoded("KeeperStart", self.lines[0]) if self.lines and "child" in self.lines[0] else None

    def end(self) -> KeeperEnd | None:
        """The keeper's last line, read once the keeper has exited; None if it never wrote one (it was killed) or
        wrote one that is not a KeeperEnd (one forged in its sandbox, say): either way nothing is accounted for."""
        while self._report >= 0 and not self._eof and select.select([self._report], [], [], 0)[0]:
            self._pull(0)
        self._close_report()
        last = next((line for line in reversed(self.lines) if "status" in line), None)
        return _decoded("KeeperEnd", last) if last is not None else None

    def close(self) -> None:
        self.release()
        self._close_report()

    def _close_report(self) -> None:
        if self._report >= 0:
            _close(self._report)
            self._report = -1

    def _pull(self, timeout_s: float | None) -> None:
        if not select.select([self._report], [], [], timeout_s)[0]:
            return
        data = os.read(self._report, 65536)
        if not data:
            self._eof = True
            return
        *complete, self._buffer = (self._buffer + data).split(b"\n")
        for line in complete:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass


def _decoded(name: str, line: dict) -> Any:
    """A report line as its contract's class, None where it breaks the contract. Imported here, by the parent:
    this file also runs as the keeper itself, with -I -S, where neither kernel_lsp nor cattrs is importable."""
    from kernel_lsp.contracts import keeper_report
    from kernel_lsp.contracts.codec import ContractError, decode

    try:
        return decode(getattr(keeper_report, name), line)
    except ContractError:
        return None


def processes_isolation(start: KeeperStart | None, signal_scoped: bool) -> str:
    """The report's `isolation.processes`: whether what a candidate starts is bound to its keeper, said plainly.
    `signal_scoped`: the candidate cannot signal processes outside its Landlock domain (its keeper among them)."""
    if start is None:
        return "not isolated: its keeper did not start"
    if start.subreaper:
        return f"not isolated: {start.subreaper}"
    if not signal_scoped:
        return ("not isolated: it can kill its keeper (Landlock before ABI 6 cannot scope signals), and what it "
                "started would then be out of reach")
    return "isolated: whatever it starts is killed with it, and named if left running"


PROBE_PROGRAM = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"


def probe(python: str = sys.executable) -> dict[str, Any]:
    """A keeper over a program that leaves a process behind in a session of its own (kernel-lsp doctor's check):
    the keeper's first and last lines, and the processes it named that still run after it (none, if it works)."""
    link = KeeperLink()
    try:
        keeper = subprocess.Popen(keeper_command(python, [python, "-c", PROBE_PROGRAM], *link.child_fds, grace_s=0.1),
                                  pass_fds=link.child_fds)
    except BaseException:
        link.close()
        raise
    finally:
        link.started()
    keeper.wait()
    start, end = link.start(0), link.end()
    link.close()
    named = [int(line.split()[0]) for line in (end.left if end else [])]
    return {"start": start, "end": end, "running": [pid for pid in named if _start_time(pid) is not None]}


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


# ---- the keeper process --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    options = _arguments(argv)
    for fd in (options.control_fd, options.report_fd):
        os.set_inheritable(fd, False)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)  # SIGCHLD and SIGTERM wake the loop at once
    for number in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(number, lambda *_: None)
    subreaper = _become_subreaper()
    child = _spawn(options.program, options.new_session)
    _close_others({0, 1, 2, options.control_fd, options.report_fd, wake_read, wake_write})
    _write(options.report_fd, {"child": child, "subreaper": subreaper})
    keeper = Keeper(child, options)
    keeper.watch_until_done(wake_read)
    _write(options.report_fd, keeper.finish())
    _exit_like(keeper.returncode)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="keeper.py")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--report-fd", type=int, required=True)
    parser.add_argument("--new-session", action="store_true", help="the program leads a session of its own")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S)
    parser.add_argument("--remove", action="append", default=[], help="a folder removed when the lifeline ends")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    options.program = options.program[1:] if options.program[:1] == ["--"] else options.program
    if not options.program:
        parser.error("no program to run")
    return options


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _prctl(option: int, value: int) -> str | None:
    libc = _libc()
    if sys.platform != "linux" or libc is None or not hasattr(libc, "prctl"):
        return f"prctl is not available on {sys.platform}"
    if libc.prctl(option, value, 0, 0, 0) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def _become_subreaper() -> str | None:
    problem = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if problem is None and not os.path.isdir("/proc/self"):
        problem = "no /proc to find its processes in"
    return None if problem is None else f"the keeper cannot follow the processes it starts ({problem})"


def _spawn(program: list[str], new_session: bool) -> int:
    keeper = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        for number in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; the program starts as exec leaves it
            signal.signal(number, signal.SIG_DFL)
        if new_session:
            os.setsid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == keeper:  # else the keeper died before the death signal was armed
            os.execv(program[0], program)
    except BaseException:  # noqa: BLE001 - whatever failed, this forked copy must never return into the keeper
        pass
    os._exit(127)


def _close_others(keep: set[int]) -> None:
    """The fds the parent passed for the program (its frame pipes) are the program's: held here too, they would
    keep the parent from seeing end of file when the program dies."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        if int(name) not in keep:
            _close(int(name))


def _write(fd: int, message: dict) -> None:
    try:
        os.write(fd, json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the parent is gone: nobody to tell


class Keeper:
    """The keeper's state: its child, the folders it answers for, why it is ending."""

    def __init__(self, child: int, options: argparse.Namespace) -> None:
        self.child = child
        self.me = os.getpid()
        self.control = options.control_fd
        self.new_session = options.new_session
        self.grace_s = options.grace
        self.remove: list[str] = list(options.remove)
        self.watch: list[str] = []
        self.disk_limit: int | None = None
        self.disk_bytes = 0
        self.status: int | None = None  # the child's wait status, once reaped
        self.reason: str | None = None  # why the keeper ends the tree itself
        self._pending = b""
        self._next_poll = 0.0

    @property
    def returncode(self) -> int | None:
        return None if self.status is None else os.waitstatus_to_exitcode(self.status)

    def watch_until_done(self, wake: int) -> None:
        """Until the child ends, the lifeline ends, SIGTERM arrives or the disk limit is passed."""
        selector = selectors.DefaultSelector()
        selector.register(wake, selectors.EVENT_READ)
        selector.register(self.control, selectors.EVENT_READ)
        while self.status is None and self.reason is None:
            timeout = None if self.disk_limit is None else max(0.0, self._next_poll - time.monotonic())
            for key, _ in selector.select(timeout):
                if key.fd == wake:
                    if signal.SIGTERM in os.read(wake, 512):
                        self.reason = "signal"
                elif not self._read_control():
                    selector.unregister(self.control)
                    self.reason = "lifeline"
            self._reap()
            if self.reason is None:
                self._check_disk(final=False)

    def finish(self) -> dict:
        """Ends what is left of the tree; the report's last line."""
        left: dict[int, tuple[int, str]] = {}
        if self.reason is None:  # the child ended by itself: what it started may finish, briefly
            left = self._linger()
            self._check_disk(final=True, pids=left)
        named = _described(left)  # before they are killed: a dead process has no command line left to read
        ended = self.reason is None and not left and self.status is not None
        unkilled = {} if ended else self._kill_tree()  # nothing lives: no second look
        if self.reason == "lifeline":
            for path in self.remove:
                shutil.rmtree(path, ignore_errors=True)
        return {"status": self.returncode, "reason": self.reason, "left": named, "leftCount": len(left),
                "unkilled": _described(unkilled), "diskBytes": self.disk_bytes, "diskLimit": self.disk_limit}

    def _read_control(self) -> bool:
        data = os.read(self.control, 65536)
        if not data:
            return False
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            self.watch += [str(path) for path in message.get("watch", [])]
            self.remove += [str(path) for path in message.get("remove", [])]
            if "diskBytes" in message:
                self.disk_limit = None if message["diskBytes"] is None else int(message["diskBytes"])
                self._next_poll = 0.0
        return True

    def _reap(self) -> int:
        """Collects every child that ended: the program, and the orphans re-parented here; how many."""
        reaped = 0
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return reaped
            if pid == 0:
                return reaped
            reaped += 1
            if pid == self.child:
                self.status = status

    def _living(self) -> dict[int, tuple[int, str]]:
        """The living descendants, or none once that is sure. One /proc listing is not proof of none: a process
        that forks and exits while it is read (a new pid every few milliseconds) can be missed. But a process
        whose ancestors here are all gone is the keeper's child, so its exit is reaped here: a listing with none
        alive and no child reaped just after it has missed nobody."""
        while True:
            alive = descendants(self.me)
            if self._reap() == 0 or alive:
                return alive

    def _check_disk(self, final: bool, pids: Iterable[int] | None = None) -> None:
        if self.disk_limit is None or (not final and time.monotonic() < self._next_poll):
            return
        self._next_poll = time.monotonic() + DISK_POLL_S
        used = disk_use(self.watch, [*descendants(self.me), self.child] if pids is None else pids)
        self.disk_bytes = max(self.disk_bytes, used)
        if used > self.disk_limit:
            self.reason = "disk"

    def _linger(self) -> dict[int, tuple[int, str]]:
        deadline = time.monotonic() + self.grace_s
        while True:
            self._reap()
            alive = self._living()
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(LINGER_POLL_S)

    def _kill_tree(self) -> dict[int, tuple[int, str]]:
        """SIGKILL to every descendant until none is left (each round finds what forked meanwhile, re-parented
        here); what still lives after KILL_WITHIN_S."""
        if self.new_session and self.status is None:
            try:
                os.killpg(self.child, signal.SIGKILL)  # the program's own group at once, before the /proc walk
            except OSError:
                pass
        deadline = time.monotonic() + KILL_WITHIN_S
        pause = 0.001
        while True:
            self._reap()
            alive = self._living()
            if self.status is None:
                alive[self.child] = (0, alive.get(self.child, (0, ""))[1])  # also where there is no /proc
            if not alive or time.monotonic() >= deadline:
                return alive
            for pid, (start, _) in alive.items():
                _kill(pid, start)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every living process below `root`, from /proc: pid -> (start time, command name). A thread group whose
    leader has exited while its other threads run still counts."""
    children: dict[int, list[int]] = {}
    seen: dict[int, tuple[str, int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                text = file.read().decode("utf-8", "replace")
        except OSError:
            continue
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        seen[pid] = (fields[0], int(fields[START_FIELD]), head.partition("(")[2])
    found: dict[int, tuple[int, str]] = {}
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        state, start, name = seen[pid]
        if state not in "ZX" or _threads_left(pid):
            found[pid] = (start, name)
    return found


def _threads_left(pid: int) -> bool:
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return int(file.read().decode("utf-8", "replace").rpartition(")")[2].split()[START_FIELD])
    except (OSError, IndexError, ValueError):
        return None


def _kill(pid: int, start: int) -> None:
    """SIGKILL to the process seen as (pid, start time), never to another that took its pid since: through a
    pidfd, after checking the start time again (0: the keeper's own child, whose pid is held until reaped)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        pidfd = None  # no pidfd here (Linux before 5.3): the same check, with a window between it and the kill
    try:
        if start == 0 or _start_time(pid) == start:
            if pidfd is None:
                os.kill(pid, signal.SIGKILL)
            else:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        if pidfd is not None:
            os.close(pidfd)


def disk_use(folders: Iterable[str], pids: Iterable[int]) -> int:
    """Bytes on disk under `folders` (each inode once, symbolic links not followed) and in the regular files the
    processes `pids` hold open after deleting them (an unlinked temporary file takes room until closed)."""
    seen: set[tuple[int, int]] = set()
    total = 0

    def add(status: os.stat_result) -> None:
        nonlocal total
        key = (status.st_dev, status.st_ino)
        if key not in seen:
            seen.add(key)
            total += status.st_blocks * 512

    stack = [folder for folder in folders]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                add(entry.stat(follow_symlinks=False))
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
            except OSError:
                continue
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if os.readlink(path).endswith(" (deleted)"):
                    status = os.stat(path)
                    if stat.S_ISREG(status.st_mode):
                        add(status)
            except OSError:
                continue
    return total


def _described(processes: dict[int, tuple[int, str]]) -> list[str]:
    return [f"{pid} {_command_line(pid) or name}" for pid, (_, name) in sorted(processes.items())[:LISTED]]


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return " ".join(file.read().decode("utf-8", "replace").replace("\0", " ").split())[:120]
    except OSError:
        return ""


def _exit_like(returncode: int | None) -> None:
    """Exits as the program did: its exit code, or its signal (no core file of the keeper)."""
    if returncode is None:
        os._exit(EXIT_UNKNOWN)
    if returncode >= 0:
        os._exit(returncode)
    number = -returncode
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.set_wakeup_fd(-1)
    if number not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    time.sleep(1)  # a signal that does not end a process by default falls through
    os._exit(128 + number)


if __name__ == "__main__":
    main()
