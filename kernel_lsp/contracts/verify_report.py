"""The VerifyReport: what the judge returns through the sandbox's pipe, what a "verify" job's result carries in
`metrics.report`, and what bench.json keeps per problem. Defined once, here; `contracts.codec` turns a received
dict into these classes (refusing unknown keys and wrong types, naming them) and back into the wire's dict.

The wire keeps the names tools and users already read (snake_case, `compileError`). Stdlib only: the candidate's
process imports `Timing` and the judge `Comparison`, and neither should import a codec to do so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

# why speedups timed on the CPU are kept out of every summary, table and plot: the report's `not_comparable_reason`
CPU_NOT_COMPARABLE = ("timed on the CPU (Triton's interpreter, eager PyTorch on the CPU): its speedups vary 2x "
                      "between runs and say nothing of a GPU")


def not_comparable_on(device: str | None) -> str | None:
    """Why speedups timed on `device` cannot stand beside a GPU's (CPU_NOT_COMPARABLE on the CPU); None where they
    can. The one rule behind every report's marking (this VerifyReport's, a bench or campaign problem's)."""
    return CPU_NOT_COMPARABLE if device == "cpu" else None


@dataclass(frozen=True)
class Comparison:
    """A candidate's output against the reference's: the first failing leaf, or how close they were."""

    ok: bool  # every element within its dtype's tolerance
    reason: str  # '' when ok; else 'shape'|'dtype'|'device'|'nan'|'inf'|'mismatch'|'type'|'structure'
    max_abs_error: float
    max_rel_error: float
    worst_index: tuple[int, ...] | None  # where the largest error is, in the failing output
    worst_expected: float | None  # the reference's value there
    worst_actual: float | None  # the candidate's value there
    mismatched: int  # elements outside the tolerance
    total: int  # elements compared
    message: str  # the comparison said in one line, as findings show it


@dataclass(frozen=True)
class Timing:
    """One contender's timed calls (the candidate, or a baseline) by the judge's clock."""

    device: str  # 'cuda' | 'cpu'
    clock: str  # 'judge-wall' (rounds of batches by the judge's own clock); older caches: 'cuda-events'
    calls: int  # timed calls
    warmup: int  # the warm-up calls that ran
    median_ms: float  # per call, over the rounds' samples
    mean_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    spread: float  # (p90 - p10) / median
    input_sets: int  # input sets the timed calls cycled through, each refreshed between rounds
    l2_flushed: bool  # the L2 cache flushed between batches (CUDA)
    busy_ms: float = 0.0  # all calls' times added up, warm-up included
    # by the judge's clock (JUDGE_CLOCK): rounds of `batch` calls each, one sample (milliseconds per call) a round
    rounds: int = 0
    batch: int = 0
    round_trip_ms: float = 0.0  # a request's round trip to the process that ran the calls (0: the judge's own)
    samples_ms: tuple[float, ...] = ()
    median_interval_ms: tuple[float, float] | None = None  # 95% bootstrap interval of the median
    check_ms: tuple[float, ...] | None = None  # a cached baseline: the check rounds that confirmed it (else absent)
    # the candidate returned one buffer on successive calls, so each timed call's output was copied as it returned
    # (a later call overwrites it): those copies are in its time
    reused_output: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Correctness:
    trials: int  # correctness runs, each on a fresh input set
    passed: int  # of them, those within tolerance
    distributions: list[str]  # the input distribution of each trial, in order
    worst: Comparison | None
    weights: str  # how the reference's weights reached the candidate ("state_dict: 2 of 2 tensors loaded")


@dataclass(frozen=True)
class IntegrityProblem:
    code: str  # integrity-* (verify/verdict.py knows each one's severity)
    message: str


@dataclass(frozen=True)
class Work:
    """The own kernels' share of the recorded runs' time (the candidate's word), and library work beside them."""

    own_share: float  # own_ms / total_ms
    own_ms: float  # in the candidate's own kernels
    total_ms: float  # in all the recorded runs' kernels (or interpreted launches on the CPU)
    how: str  # how the time was measured
    library: list[str]  # the costliest library kernels
    reference_main: str | None  # the reference's main operation, looked up when the share was under the limit
    library_work: str | None  # the integrity-library-work message, or None


@dataclass(frozen=True)
class Kernels:
    custom: list[str]  # the candidate's own kernels that ran
    stock: list[str]  # library kernels that ran (torch's, cuBLAS', ...)
    how: str  # how launches were intercepted (triton-launcher, cuda-driver, ...) or "none"
    work: Work | None
    output_from_kernel: bool | None = None  # None: not checked (a failed trial) or nothing own intercepted


@dataclass(frozen=True)
class Timings:
    candidate: Timing | None
    eager: Timing | None  # the reference as written
    compile: Timing | None  # the reference under torch.compile
    compile_error: str | None  # `compileError` on the wire
    cached: dict[str, bool]  # baseline kind -> its figures came from the judge's cache
    skipped: dict[str, str]  # baseline kind -> why it was not timed (compile on the CPU)
    schedule: dict[str, str] | None = None  # baseline kind -> why its fresh timing was not cached (else absent)


@dataclass(frozen=True)
class GpuStates:
    """NVML's readings (clocks, power, temperature, clock-event reasons, ...) before and after the timing, as
    profilers.nvml names them; `{"unavailable": why}` where there are none."""

    before: dict[str, object]  # read before the timed rounds
    after: dict[str, object]  # read after them


@dataclass(frozen=True)
class Floor:
    """The physical floor: the problem's bytes and FLOPs over the device's measured peaks."""

    bytes: int  # each input read once, each output written once
    flops: int  # floating-point operations FlopCounterMode counts on the reference (0 for elementwise)
    floor_ms: float  # the least time those bytes and FLOPs take at the device's peaks
    bandwidth_gbs: float  # the device's measured copy bandwidth
    peak_tflops: float  # the device's measured peak
    schedule: str | None = None  # why the peaks were not fit to cache (else absent)
    datasheet: str | None = None  # why the datasheet bandwidth stands in for the measured one (else absent)


@dataclass(frozen=True)
class DeviceFacts:
    """What the agent's prompt says of the GPU (the judge's view of it)."""

    name: str
    arch: str  # sm_90, ...
    sms: int  # streaming multiprocessors
    memory_bytes: int
    shared_per_block_optin: int | None = None  # shared memory a block may opt into
    registers_per_sm: int | None = None
    l2_bytes: int | None = None


@dataclass(frozen=True)
class Isolation:
    """How the candidate's process was confined: "isolated: ..." or "not isolated: why", per aspect."""

    files: str  # Landlock: where it may write
    network: str  # seccomp: sockets refused
    processes: str | None = None  # from its keeper
    namespaces: str | None = None  # bubblewrap's namespaces


@dataclass(frozen=True)
class VerifyReport:
    """A candidate's verdict and, when it passed, its timings. Where `speedup_comparable` is false (a run on the
    CPU) the speedups stay here, for the agent's ranking within one pass, and no summary, table or plot shows them
    as speedups."""

    verdict: Literal["verified", "rejected"]
    device: str  # cuda | cpu: where the candidate ran
    correctness: Correctness
    integrity: list[IntegrityProblem]  # each check the candidate failed, once per code
    kernels: Kernels  # what ran during the trials
    timing: Timings | None  # None (with gpu, floor and the speedups) unless the candidate passed and was timed
    speedup: dict[str, float | None]  # baseline kind -> the candidate's speedup over it
    interval: dict[str, tuple[float, float]]  # baseline kind -> the speedup's 95% interval
    significant: dict[str, bool]  # baseline kind -> the interval leaves out 1x
    gpu: GpuStates | None
    floor: Floor | None
    device_facts: DeviceFacts | None
    isolation: Isolation
    shared_memory_poison: str | None  # "filled", or why every SM's shared memory was not (CUDA only)
    free_memory_poison: str | None  # "covered", or why the poisoned free memory fell short (CUDA only)
    duration_s: float = 0.0  # the judge's whole run
    phases_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds (where the time went)
    speedup_comparable: bool = True  # false (run on the CPU): speedup, interval, significant are no GPU figures
    not_comparable_reason: str | None = None  # why not (timed on the CPU); None when speedup_comparable

    def __post_init__(self) -> None:
        # the marking follows from where the candidate ran, whatever was passed or decoded: a report written
        # before these fields is marked too, and no reader needs a rule of its own
        reason = not_comparable_on(self.device)
        object.__setattr__(self, "speedup_comparable", reason is None)
        object.__setattr__(self, "not_comparable_reason", reason)


@dataclass(frozen=True)
class Unavailable:
    """Nothing could be verified (no device, no sandbox, a reference that fails): why."""

    reason: str
    verdict: Literal["unavailable"] = "unavailable"
