"""The ProfileReport: what a "profile" job's result carries in `metrics.profile` (profile.report and
profile.worker_job build it in the worker; kinds.profile.ProfileOutcome decodes it in the server, the CLI and the
agent), what `kernel-lsp profile --format json` prints, and what the measuring sandbox child returns to the worker
(`ProfileMeasurements`). Defined once, here; `contracts.codec` decodes a received dict into these classes (refusing
unknown keys and wrong types, naming them) and encodes them back into the wire's dict.

Its problems carry a code (what a reader branches on: the server's note or warning, the agent's "no news") and a
message (what a person reads). The wire keeps the names tools and users already read (snake_case). A field whose
source does not give it is absent from the wire, not null: ncu's figures of a kernel (`duration_ms`, `point`,
`occupancy_pct`, `grid`, `block`) and a static profile's place (`arch`, `file`, `line`) come as a group each, a GPU
run's `energy`, `isolation` and `reference_energy` too (codec.ABSENT_TOGETHER). Stdlib only, as verify_report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kernel_lsp.contracts.verify_report import Isolation

ProfileSource = Literal["ncu", "static", "import-csv"]
HintSeverity = Literal["warning", "information", "hint"]
BoundKind = Literal["memory", "compute", "latency"]


@dataclass(frozen=True)
class ProfileProblem:
    code: str  # one of PROBLEM_CODES
    message: str  # a sentence for a person: never compared by code that reads it


# code -> what it means (docs/reference/findings.md lists them, generated from it)
PROBLEM_CODES: dict[str, str] = {
    "profile-on-cpu": "asked for on the CPU (device cpu): the static profile (ptxas and SASS) instead of ncu",
    "profile-no-gpu": "no GPU visible to the worker: the static profile instead of ncu, energy and reference times",
    "profile-cuda-file": "a .cu file profiled statically (by the server, or a file without main())",
    "profile-program-static": "a program (its own main()) profiled statically: no worker connected to a GPU yet",
    "profile-static-stands-in": "ncu profiled no kernel: the static profile stands in",
    "profile-no-cuda-source": "the candidate holds no CUDA source to compile: nothing to profile statically",
    "profile-tool-missing": "nvcc or torch's headers were not found: no static profile",
    "profile-build-failed": "nvcc could not build a unit or the program (its errors are on their lines)",
    "profile-bad-header": "a `// kernel-lsp:` header line of a program does not parse",
    "profile-no-sass": "no SASS of a binary (cuobjdump or nvdisasm missing or failed): ptxas figures only",
    "profile-ncu-failed": "ncu did not profile the candidate (its message says why)",
    "profile-candidate-failed": "the candidate did not run in the measuring sandbox",
    "profile-worker-package": "a package the candidate imports is missing where the worker runs (the message gives "
                              "its install command): the environment's problem, not the candidate's",
    "profile-no-reference": "no reference measurements: its Model could not be built or its forward failed",
    "profile-no-energy": "no energy reading (not a GPU, NVML unavailable, a GPU named by UUID)",
    "profile-no-ceilings": "no measured roofline ceilings (ncu's theoretical ones stand in, or an import lacks them)",
    "profile-no-launches": "an imported ncu export holds no kernel launches",
    "profile-not-isolated": "the candidate ran without full isolation",
    "profile-contract": "a report, or a part of one, the worker sent in a form this client does not read (another "
                        "version): what could be read is kept",
}

# why the profile is static where the caller or this machine chose it: a note, not a warning, and no news to the
# agent that asked
NOTE_CODES = frozenset({"profile-on-cpu", "profile-no-gpu", "profile-cuda-file", "profile-program-static"})


@dataclass(frozen=True)
class Metric:
    """One figure of an ncu section (profilers.ncu.Metric on the wire)."""

    value: float | str  # the number in `unit`, or the text as ncu printed it when it is not a number
    unit: str  # as ncu printed it ('%', 'Gbyte/second', 'usecond', '' for a count)


@dataclass(frozen=True)
class PtxasFigures:
    """ptxas's figures of one kernel (a static profile's one section, `ptxas`)."""

    arch: str | None  # sm_90, ...
    registers: int | None  # per thread
    stack_frame: int  # bytes
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    shared_bytes: int  # static shared memory
    barriers: int


@dataclass(frozen=True)
class KernelMetrics:
    """A kernel's figures: on the wire one object, section -> metric -> {value, unit} from ncu, or `ptxas` -> its
    figures in a static profile (codec reads and writes the two as one object)."""

    sections: dict[str, dict[str, Metric]] = field(default_factory=dict)  # ncu: section -> metric name -> Metric
    ptxas: PtxasFigures | None = None  # static: the `ptxas` entry


@dataclass(frozen=True)
class ProfileHint:
    """A hint on a kernel (profilers.hints.Hint on the wire, without the figures its rule looked at)."""

    code: str  # stable: hint-*, ncu-<RuleName>
    severity: HintSeverity  # the rule's own; the editor shows every hint as Information or Hint
    message: str
    estimated_speedup: float | None  # percent of the kernel's time fixing it could save, when known
    speedup_type: str | None  # ncu's "global" (of the kernel's time) or "local" (of one unit's), "estimate" (ours)
    file: str | None = None  # the source file and its 1-based line, where the hint has a place there
    line: int | None = None


@dataclass(frozen=True)
class SassSummary:
    """What a kernel's SASS holds (profilers.sass.SassStats, counted)."""

    arch: str | None
    instructions: int  # without the NOP padding
    global_loads: dict[str, int]  # width in bits (a string: JSON has no integer keys) -> count
    global_stores: dict[str, int]
    local_loads: int  # LDL: spills or arrays placed in local memory
    local_stores: int
    shared_loads: int
    shared_stores: int
    tensor_core: dict[str, int]  # opcode -> count: HMMA, HGMMA, ...
    fma: int
    loops: int
    line_info: bool  # built with -lineinfo: instructions know their source line


@dataclass(frozen=True)
class RooflinePoint:
    """A launch on the roofline (profilers.roofline.KernelPoint on the wire, its derived rates included)."""

    kernel: str
    duration_s: float
    dram_bytes: float | None  # bytes read and written
    flops: float | None
    bytes_from: str  # "ncu DRAM counters", "DRAM Throughput % of the bandwidth ceiling", "unknown: ..."
    flops_from: str  # "ncu FLOP counters" or why there are none
    byte_rate: float | None  # bytes per second
    flop_rate: float | None  # FLOP per second
    arithmetic_intensity: float | None  # FLOP per DRAM byte


@dataclass(frozen=True)
class ProfileCeilings:
    """The roofline's ceilings (profilers.roofline.Ceilings on the wire, its ridge point included)."""

    gpu: str
    dram_bandwidth_gbs: float  # bytes read + written per second, GB/s
    fp32_tflops: float
    tensor_tflops: float | None  # fp16/bf16 tensor cores; None when unknown
    how: str  # measured (how), or ncu's theoretical figures
    ridge_point: float  # FLOP per DRAM byte above which the fp32 rate, not bandwidth, caps a kernel


@dataclass(frozen=True)
class ReferenceKernel:
    """A PyTorch kernel of the reference's forward (profilers.torch_kernels.KernelTime on the wire)."""

    name: str  # as torch's profiler names it
    device_ms: float  # summed over its launches in one forward call
    calls: int  # launches per forward call


@dataclass(frozen=True, kw_only=True)
class EnergyReading:
    """Energy per forward call from NVML's counter, around a loop of calls (the whole GPU's energy)."""

    mj_per_call: float
    calls: int  # forward calls in the loop
    seconds: float  # the loop's length
    average_power_w: float | None = None  # read in the measuring process (absent when read in the candidate's)
    how: str


@dataclass(frozen=True, kw_only=True)
class ProfileIsolation:
    """How the candidate's process was confined while measured, and ncu's run of it: "isolated: ..." or
    "not isolated: why", per aspect."""

    files: str  # Landlock: where it may write
    network: str  # seccomp: sockets refused
    processes: str | None = None  # from its keeper
    namespaces: str | None = None  # bubblewrap's namespaces
    ncu: str  # ncu and its program (in the sandbox where the driver lets it read the counters)


@dataclass(frozen=True, kw_only=True)
class KernelProfile:
    """One profiled launch (ncu) or compiled kernel (static)."""

    kernel: str  # the base name: where hints and hover find it
    name: str  # the full (demangled) name
    id: int  # ncu's launch ID; static: its place in the report
    bound: BoundKind | None  # from ncu's Speed Of Light; None in a static profile
    metrics: KernelMetrics
    findings: list[ProfileHint]
    duration_ms: float | None = None  # ncu: the launch's duration
    point: RooflinePoint | None = None  # ncu: where it sits on the roofline
    registers: int | None  # per thread
    occupancy_pct: float | None = None  # ncu: achieved occupancy
    grid: tuple[int, int, int] | None = None  # ncu: the launch's grid
    block: tuple[int, int, int] | None = None  # ncu: the launch's block
    sass: SassSummary | None = None  # where the kernel's SASS was read
    energy_mj_per_call: float | None = None  # a GPU run read its energy: of the whole forward call, not this kernel
    arch: str | None = None  # static: the architecture compiled for
    file: str | None = None  # static: the file that defines it
    line: int | None = None  # static: its 1-based line there (None when its name was not found)


@dataclass(frozen=True, kw_only=True)
class ProfileReport:
    source: ProfileSource  # ncu | static (ptxas and SASS, no GPU run) | import-csv (an ncu export)
    gpu: str | None  # its name, as NVML or ncu's device attributes give it; None in a static profile
    ceilings: ProfileCeilings | None  # measured, else ncu's theoretical ones
    kernels: list[KernelProfile]  # one per profiled launch (ncu) or compiled kernel (static)
    reference_kernels: list[ReferenceKernel]  # the reference's forward, per call: what the candidate replaces
    problems: list[ProfileProblem]  # what kept the profile from being complete (PROBLEM_CODES)
    energy: EnergyReading | None = None  # a GPU run: the candidate's forward call
    isolation: ProfileIsolation | None = None  # a GPU run: how the candidate's process was confined
    reference_energy: EnergyReading | None = None  # a GPU run: the reference's forward on the same inputs


@dataclass(frozen=True)
class ProfileMeasurements:
    """What the measuring sandbox child (profile.measure.measure_candidate) returns to the worker: what needs torch,
    measured before ncu runs the candidate."""

    extensions: list[str]  # the candidate's own extension libraries (cuobjdump reads their SASS)
    reference_kernels: list[ReferenceKernel]
    energy: EnergyReading | None  # the candidate's forward call
    reference_energy: EnergyReading | None  # the reference's, read the same way
    ceilings: ProfileCeilings | None  # measured (None: ncu's theoretical ones stand in)
    gpu_state: dict[str, object]  # NVML's readings as verify.baselines.gpu_state names them: free-form, its own word
    problems: list[ProfileProblem]
    isolation: Isolation  # how the candidate's process was confined
