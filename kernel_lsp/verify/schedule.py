"""Whether the judge's own process is fit to measure: the scheduling it started with is still its own.

A candidate's processes once reniced the judge to 19, pinned it to one CPU with sched_setaffinity and spun there:
the judge's eager baseline went from 0.0107 ms to 32 ms and its measured copy bandwidth from ~160 to 11 GB/s, and
those figures, cached, made later candidates look faster. The candidate's processes now die with it (a PID
namespace of their own), but the judge also checks itself before and after it measures anything it caches.

The scheduling the judge started with is recorded when this module is first imported (in the sandbox child, the
judge imports verify/run.py, and through it this module, before any candidate code runs) or at the first call:
the nice value, CPU affinity and scheduling policy of the process's main thread, its autogroup's nice, and its
RLIMIT_CPU and RLIMIT_RTTIME. `judge_schedule()` compares every thread of the process with that record (nice and
policy from /proc/self/task/<tid>/stat, affinity from sched_getaffinity(tid)); `restore_schedule()` puts back
what it can (a higher priority only with CAP_SYS_NICE or a high enough RLIMIT_NICE: root, in practice).

Limitation: a worker that was itself reniced before this process started passes that on, and it is recorded as
the start; the record cannot tell a user's own `nice kernel-lsp worker` from that. Stdlib only; Linux (elsewhere
the checks that cannot be made are skipped).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

TASKS = Path("/proc/self/task")
AUTOGROUP = Path("/proc/self/autogroup")
# /proc/<pid>/task/<tid>/stat fields after "pid (comm) ", counted from the state (field 3 of proc(5))
NICE_FIELD = 19 - 3
POLICY_FIELD = 41 - 3
LIMITS = {name: getattr(resource, name) for name in ("RLIMIT_CPU", "RLIMIT_RTTIME") if hasattr(resource, name)}
POLICY_NAMES = {getattr(os, name): name for name in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO",
                                                     "SCHED_RR") if hasattr(os, name)}
LOWER_POLICIES = {getattr(os, name) for name in ("SCHED_BATCH", "SCHED_IDLE") if hasattr(os, name)}


@dataclass(frozen=True)
class Schedule:
    """How the judge is scheduled: what it started with, or how one thread is scheduled now."""

    nice: int
    affinity: frozenset[int] | None  # None where sched_getaffinity does not exist
    policy: int | None
    autogroup_nice: int | None = None  # None without CONFIG_SCHED_AUTOGROUP
    limits: tuple[tuple[str, tuple[int, int]], ...] = ()  # (name, (soft, hard)) of RLIMIT_CPU, RLIMIT_RTTIME


@dataclass(frozen=True)
class Thread:
    tid: int
    name: str
    nice: int | None
    policy: int | None
    affinity: frozenset[int] | None


_started: Schedule | None = None


def record_schedule() -> Schedule:
    """Take the record the later checks compare with (again, replacing the one taken at import)."""
    global _started
    leader = thread_state(os.getpid())  # the main thread: the record is the process's, whichever thread imports
    assert leader is not None  # thread_state reads the main thread through the system calls without /proc
    _started = Schedule(nice=leader.nice if leader.nice is not None else 0, affinity=leader.affinity,
                        policy=leader.policy, autogroup_nice=autogroup_nice(), limits=current_limits())
    return _started


def started_schedule() -> Schedule:
    return _started if _started is not None else record_schedule()


def judge_schedule() -> str | None:
    """None when this process is scheduled as it started (every thread: its nice no higher, its policy the same,
    its CPU affinity no narrower; the autogroup's nice no higher; RLIMIT_CPU and RLIMIT_RTTIME not lowered),
    else a sentence saying what differs."""
    start = started_schedule()
    problems = [problem for thread in threads() for problem in thread_problems(thread, start)]
    group_nice = autogroup_nice()
    if group_nice is not None and start.autogroup_nice is not None and group_nice > start.autogroup_nice:
        problems.append(f"its autogroup runs at nice {group_nice} (it started at {start.autogroup_nice})")
    now = dict(current_limits())
    for name, (soft, hard) in start.limits:
        if name in now and (below(now[name][0], soft) or below(now[name][1], hard)):
            problems.append(f"its {name} was lowered to {readable_limit(now[name])} (it started with "
                            f"{readable_limit((soft, hard))})")
    if not problems:
        return None
    return "the judge's process is not scheduled as it started: " + "; ".join(problems)


def thread_problems(thread: Thread, start: Schedule) -> list[str]:
    who = f"thread {thread.tid} ({thread.name})"
    problems = []
    if thread.nice is not None and thread.nice > start.nice:
        problems.append(f"{who} runs at nice {thread.nice} (the judge started at {start.nice})")
    if lower_policy(thread.policy, start.policy):
        problems.append(f"{who} runs under {policy_name(thread.policy)} (the judge started under "
                        f"{policy_name(start.policy)})")
    if thread.affinity is not None and start.affinity is not None and not thread.affinity >= start.affinity:
        problems.append(f"{who} may run on CPU {readable_cpus(thread.affinity)} only (the judge started with "
                        f"CPU {readable_cpus(start.affinity)})")
    return problems


def lower_policy(policy: int | None, started: int | None) -> bool:
    """SCHED_BATCH or SCHED_IDLE where the judge started under another policy."""
    return policy is not None and policy != started and policy in LOWER_POLICIES


def restore_schedule() -> list[str]:
    """Put back, for every thread, the nice, the policy and the CPU affinity the judge started with (where they
    are worse now), and the autogroup's nice and the CPU-time limits; what could not be put back, one sentence
    each (empty when everything is as it started). Raising a priority back needs CAP_SYS_NICE (or RLIMIT_NICE),
    and raising a hard limit CAP_SYS_RESOURCE: as any user but root, those fail and are named."""
    start = started_schedule()
    failed: list[str] = []
    for thread in threads():
        who = f"thread {thread.tid} ({thread.name})"
        if lower_policy(thread.policy, start.policy) and start.policy is not None:
            attempt(failed, f"{who}: {policy_name(thread.policy)} cannot be changed back to "
                            f"{policy_name(start.policy)}",
                    lambda tid=thread.tid: os.sched_setscheduler(tid, start.policy, os.sched_param(0)))
        if thread.nice is not None and thread.nice > start.nice:
            attempt(failed, f"{who}: nice {thread.nice} cannot be lowered back to {start.nice}{unprivileged()}",
                    lambda tid=thread.tid: os.setpriority(os.PRIO_PROCESS, tid, start.nice))
        if thread.affinity is not None and start.affinity is not None and not thread.affinity >= start.affinity:
            attempt(failed, f"{who}: CPU affinity {readable_cpus(thread.affinity)} cannot be widened back to "
                            f"{readable_cpus(start.affinity)}",
                    lambda tid=thread.tid: os.sched_setaffinity(tid, start.affinity))
    group_nice = autogroup_nice()
    if group_nice is not None and start.autogroup_nice is not None and group_nice > start.autogroup_nice:
        attempt(failed, f"the autogroup's nice {group_nice} cannot be lowered back to "
                        f"{start.autogroup_nice}{unprivileged()}",
                lambda: AUTOGROUP.write_text(str(start.autogroup_nice), encoding="ascii"))
    now = dict(current_limits())
    for name, (soft, hard) in start.limits:
        if name in now and (below(now[name][0], soft) or below(now[name][1], hard)):
            attempt(failed, f"{name} {readable_limit(now[name])} cannot be raised back to "
                            f"{readable_limit((soft, hard))}",
                    lambda which=LIMITS[name], limit=(soft, hard): resource.setrlimit(which, limit))
    return failed


def attempt(failed: list[str], what: str, action) -> None:
    try:
        action()
    except (OSError, ValueError) as exc:
        if not isinstance(exc, ProcessLookupError):  # the thread ended meanwhile: nothing left to restore
            failed.append(f"{what} ({exc.strerror or exc})" if isinstance(exc, OSError) else f"{what} ({exc})")


def unprivileged() -> str:
    return " (raising a priority needs root or CAP_SYS_NICE)" if os.geteuid() != 0 else ""


# --- reading the scheduling of the threads ---------------------------------------------------------------------

def threads() -> list[Thread]:
    """Every thread of this process now; one that ends while being read is left out."""
    try:
        tids = sorted(int(entry.name) for entry in TASKS.iterdir() if entry.name.isdigit())
    except OSError:
        tids = [os.getpid()]  # no /proc: the main thread's scheduling through the system calls
    return [thread for thread in map(thread_state, tids) if thread is not None]


def thread_state(tid: int) -> Thread | None:
    """How thread tid is scheduled; None when it has ended (the main thread is read through the system calls
    where /proc cannot be read)."""
    fields = stat_fields(tid)
    if fields is None and tid != os.getpid():
        return None
    name, rest = fields if fields is not None else ("main", [])
    nice = int(rest[NICE_FIELD]) if len(rest) > NICE_FIELD else thread_nice(tid)
    policy = int(rest[POLICY_FIELD]) if len(rest) > POLICY_FIELD else thread_policy(tid)
    return Thread(tid=tid, name=name, nice=nice, policy=policy, affinity=thread_affinity(tid))


def stat_fields(tid: int) -> tuple[str, list[str]] | None:
    """The thread's name and its stat fields from the state on; the name may hold spaces and parentheses."""
    try:
        text = (TASKS / str(tid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    opening, closing = text.find("("), text.rfind(")")
    if opening < 0 or closing < opening:
        return None
    return text[opening + 1:closing], text[closing + 1:].split()


def thread_nice(tid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)  # on Linux, PRIO_PROCESS with a thread id is that thread's
    except OSError:
        return None


def thread_affinity(tid: int) -> frozenset[int] | None:
    if not hasattr(os, "sched_getaffinity"):
        return None
    try:
        return frozenset(os.sched_getaffinity(tid))
    except OSError:
        return None


def thread_policy(tid: int) -> int | None:
    if not hasattr(os, "sched_getscheduler"):
        return None
    try:
        return os.sched_getscheduler(tid)
    except OSError:
        return None


def autogroup_nice() -> int | None:
    """The nice of this process's autogroup ("/autogroup-141 nice 0"), or None without autogroups."""
    try:
        words = AUTOGROUP.read_text(encoding="ascii", errors="replace").split()
    except OSError:
        return None
    if len(words) >= 3 and words[1] == "nice":
        try:
            return int(words[2])
        except ValueError:
            return None
    return None


def current_limits() -> tuple[tuple[str, tuple[int, int]], ...]:
    limits = []
    for name, which in LIMITS.items():
        if which is None:
            continue
        try:
            limits.append((name, tuple(resource.getrlimit(which))))
        except (OSError, ValueError):
            continue
    return tuple(limits)  # type: ignore[return-value]


# --- words ---------------------------------------------------------------------------------------------------

def below(value: int, recorded: int) -> bool:
    """A limit lower than the recorded one; RLIM_INFINITY (-1) is above any number."""
    if value == recorded:
        return False
    if recorded == resource.RLIM_INFINITY:
        return True
    return value != resource.RLIM_INFINITY and value < recorded


def readable_limit(limit: tuple[int, int]) -> str:
    def one(value: int) -> str:
        return "unlimited" if value == resource.RLIM_INFINITY else str(value)
    soft, hard = limit
    return one(soft) if soft == hard else f"{one(soft)} (hard {one(hard)})"


def policy_name(policy: int | None) -> str:
    return POLICY_NAMES.get(policy, f"policy {policy}") if policy is not None else "an unknown policy"


def readable_cpus(cpus: frozenset[int]) -> str:
    """0-3,6: runs of consecutive CPUs as ranges."""
    ordered, runs = sorted(cpus), []
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{low}" if low == high else f"{low}-{high}" for low, high in runs) or "none"


record_schedule()  # at import: in the judge, before any candidate code has run (see the module's docstring)
