"""What the candidate's process (candidate/side.py) answers the judge, typed: how it loaded the candidate
(`LoadReply`), what it changed in itself (`ProcessReport`), the kernels its trials launched (`Recording`), its timed calls' outputs and recordings
(`TimedReport`), one run's output (`ForwardReply`, `AgainReply`, `SettleReply`), the output-from-kernel check's
runs (`AblationReply`, candidate/ablation.py), and how a request failed
(`ErrorReply`, a `RunFailure` as process/failures.failure_parts describes an exception; the sandbox's child reports
its own failures with it too). The side writes each as a plain map (`frame`: stdlib only, as the candidate's
process needs nothing more); the judge decodes each where it arrives (candidate/handle.py `decoded_reply`). The
candidate's own code runs in that process and can write any frame, so a reply is its word until it decodes: one
that breaks its contract is the candidate's failure of that request, never the judge's. Wire keys are the field
names. Stdlib only, as the other contracts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

# how an exception ended a run (process/failures.classify_exception), or the judge's hang limit ("timeout")
FailureStatus = Literal["compile-error", "python-exception", "cuda-error", "out-of-memory", "disk-limit", "timeout"]
Frame = tuple[str, int, str, str]  # file, line, function, source text
Launch = tuple[str, int | None, str, float | None]  # a trial's launch: name, stream, source, seconds
TimedLaunch = tuple[str, int | None, str]  # a recorded timed call's launch: name, stream, source


@dataclass(frozen=True)
class RunFailure:
    """How an exception ended a request (or a sandboxed run): its status, message, type and frames."""

    status: FailureStatus
    message: str
    error_type: str | None = None  # the exception's class, module-qualified unless a builtin
    frames: list[Frame] = field(default_factory=list)  # oldest first


@dataclass(frozen=True)
class ErrorReply:
    """The reply of a request that raised: the judge reports it as the candidate's own failure."""

    error: RunFailure


@dataclass(frozen=True)
class LoadReply:
    """The candidate's model built and the reference's weights loaded into it (op_load)."""

    weights: str  # how the weights were loaded (shown in the report as said)
    seconds: dict[str, float] = field(default_factory=dict)  # where its time went, by phase (shown, never decides)


@dataclass(frozen=True)
class ProcessReport:
    """What the candidate changed in its process since before its import (op_report)."""

    timers: list[str]  # timing functions replaced
    torch: list[str]  # torch's own functions and settings changed
    threads: list[str]  # threads it started that are still alive


@dataclass(frozen=True)
class RecordedWindow:
    """What one recorded run launched (candidate/kernels.py Window)."""

    launches: list[Launch]
    current_stream: int | None = None  # the profiler's id of the run's current stream
    seconds: float | None = None  # the window's wall time


@dataclass(frozen=True)
class Recording:
    """The trials' recording session at its end (op_record, on=False): how launches were observed, one window a
    recorded run."""

    how: str  # 'profiler' | 'triton-launcher' | 'none'
    reason: str | None  # why nothing could observe launches, when how is 'none'
    windows: list[RecordedWindow]


@dataclass(frozen=True)
class KeptOutput:
    """The output of the timed call the judge chose for an input set, kept as it returned."""

    set: int  # the input set
    call: int  # the call's index
    output: object  # the output's descriptor (candidate/exchange.py), read by the exchange
    plain: bool  # every tensor of it is a plain torch.Tensor


@dataclass(frozen=True)
class RecordedCall:
    """An extra call between the timed batches, under a kernel recording (op_record_call)."""

    call: int
    how: str
    reason: str | None
    launches: list[TimedLaunch]
    current_stream: int | None = None


@dataclass(frozen=True)
class TimedReport:
    """The end of the timing in the candidate's process (op_timed_report)."""

    kept: list[KeptOutput]
    recorded: list[RecordedCall]
    reused_output: bool = False  # the model returned one buffer on successive calls (its word: costs it time only)


@dataclass(frozen=True)
class ForwardReply:
    """One run of forward (op_forward)."""

    output: object  # the output's descriptor (candidate/exchange.py)
    plain: bool
    threads: list[str]  # threads the run started
    seconds: dict[str, float] = field(default_factory=dict)  # where its time went, by phase (shown, never decides)
    shared_fill: str | None = None  # CUDA: "filled", or why shared memory was not; None off CUDA
    poisoned_bytes: int | None = None  # CUDA: the largest block of free memory poisoned (0 off CUDA)


@dataclass(frozen=True)
class AgainReply:
    """forward once more on new values in old places (op_again)."""

    output: object
    plain: bool
    reused: bool = False  # how="storage": the new inputs took the old copies' addresses


@dataclass(frozen=True)
class SettleReply:
    """The run's pending work is over (op_settle): the output sent again where a copy crossed, else none."""

    output: object = None


@dataclass(frozen=True)
class AblationReply:
    """forward plainly, then with every result of the candidate's own code destroyed, pass by pass (op_ablate)."""

    changed: bool  # the output changed in every pass
    changed_by: dict[str, bool]  # per pass ("nan", "finite", "+inf", "-inf")
    launches: int  # own launches and calls intercepted in a forward (the fewest of the passes)
    destroyed: int  # results overwritten in a forward (the fewest of the passes)
    names: list[str]  # what was intercepted
    stock: list[str]  # the ATen operators of the last ablated run


ABSENT_WHEN_NONE: dict[type, tuple[str, ...]] = {SettleReply: ("output",)}  # the wire has no key for them then


def frame(reply: object) -> dict[str, object]:
    """`reply` as the side writes it: a map of its fields (nested replies as maps, tuples as they are: msgpack
    writes arrays), other values untouched (an output's descriptor is the exchange's)."""
    absent = ABSENT_WHEN_NONE.get(type(reply), ())
    return {item.name: _plain(getattr(reply, item.name)) for item in dataclasses.fields(reply)
            if not (item.name in absent and getattr(reply, item.name) is None)}


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return frame(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
