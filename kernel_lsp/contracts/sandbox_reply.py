"""What a sandbox's child (`python -m kernel_lsp.worker.child`) tells the worker on its result pipe, typed: the
ready frame once it waits for a task, then one reply for its task. The child builds them and writes each as a
plain map (`frame`: it imports the stdlib and msgpack only, so no codec); the worker's Sandbox decodes them with
contracts.codec. The child runs the task's code in its own process, so a reply is that code's word until it decodes:
one that breaks the contract is a sandbox-error run, never a failure of the worker. Stdlib only, as the other
contracts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

# how a sandboxed run ended; a job's finding for a run that failed is `run-<status>`
SandboxStatus = Literal["ok", "compile-error", "python-exception", "cuda-error", "out-of-memory", "timeout",
                        "signal", "disk-limit", "sandbox-error"]


@dataclass(frozen=True)
class TracebackFrame:
    """One frame of a failure's traceback, as the user should see it: a task file under the user's real path."""

    file: str
    line: int
    function: str
    text: str


@dataclass(frozen=True)
class ChildReady:
    """The child's first frame: started, preloaded, waiting for its task."""

    ready: int  # the child's pid
    confinement: dict[str, str] | None = None  # a confined child's Landlock and seccomp ("files", "network")


@dataclass(frozen=True)
class ChildReply:
    """How the task ended in the child: its entry's value, or why there is none."""

    status: SandboxStatus  # ok, or how the entry failed (python-exception, cuda-error, ...; sandbox-error: the child's)
    message: str  # why, for every status but ok
    value: object = None  # what the entry returned (ok only): msgpack's types, as the entry gave them
    error_type: str | None = None  # the exception's class
    traceback: list[TracebackFrame] = field(default_factory=list)  # oldest first, the user's frames only


def frame(message: ChildReady | ChildReply) -> dict[str, object]:
    """`message` as the child writes it: a map of its fields, the traceback's frames as maps, the value untouched
    (msgpack says whether it can carry it; a deep copy of the entry's value could run the entry's code)."""
    wire = {item.name: getattr(message, item.name) for item in dataclasses.fields(message)}
    if isinstance(message, ChildReply):
        wire["traceback"] = [dataclasses.asdict(item) for item in message.traceback]
    return wire
