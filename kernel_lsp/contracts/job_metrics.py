"""What a job's Result carries in `metrics`, one class per job kind: built in one place, the kind's handler in the
worker (kinds/verify.py, kinds/profile.py through profile/worker_job.py, kinds/sanitize.py, kinds/cute_dsl.py,
worker/jobs.py for the worker's own kinds), encoded once by `contracts.codec` into the Result's map, and decoded
once where the Result arrives (each kind's outcome: `VerifyOutcome.of`, `ProfileOutcome.of`, `SanitizeOutcome.of`,
`CuteDslOutcome.of`; the doctor and the Ray actor for device-info). A Result's `metrics` on the wire is the encoded
form of its kind's class; a map that does not decode (a worker of another version) is a ContractError naming the
keys, which each outcome turns into its own "no result". Wire names are the ones these maps always had (camelCase:
`durationS`, `cudaAvailable`, `buildDirectory`, a CuTe DSL kernel's `stackBytes`; contracts.codec RENAMED). Stdlib
only, as the other contracts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kernel_lsp.contracts.cute_dsl_report import CuteDslStatus
from kernel_lsp.contracts.profile_report import ProfileReport
from kernel_lsp.contracts.sandbox_reply import SandboxStatus
from kernel_lsp.contracts.sanitize_report import SanitizeReport
from kernel_lsp.contracts.verify_report import Isolation, VerifyReport

Verdict = Literal["verified", "rejected", "unavailable"]


@dataclass(frozen=True)
class VerifyMetrics:
    """A "verify" job's: its verdict, its one line and its VerifyReport."""

    verdict: Verdict  # verified | rejected | unavailable (nothing could be verified: its finding says why)
    summary: str = ""  # the one line a code lens shows: 'correct 5/5 · 1.84× eager · 3.1 ms', or why not
    report: VerifyReport | None = None  # the judge's report; None: the run gave none (rejected or unavailable)
    duration_s: float | None = None  # the sandboxed run's wall time; None: not said


@dataclass(frozen=True)
class ProfileMetrics:
    """A "profile" job's: its ProfileReport and its one line."""

    profile: ProfileReport  # the report (ncu's, static or imported)
    summary: str = ""  # one line: the source and each kernel's bound, or why there is no profile


@dataclass(frozen=True)
class SanitizeMetrics:
    """A "sanitize" job's: its SanitizeReport and its one line."""

    sanitize: SanitizeReport  # each tool's run and errors, the library's, the problems
    summary: str = ""  # 'errors found: memcheck 1 · racecheck 0 · ...'


@dataclass(frozen=True)
class KernelResources:
    """What a compiled CuTe DSL kernel's cubin says of it (cuobjdump's resource usage and its SASS)."""

    arch: str  # the target the DSL compiled for: sm_90a
    registers: int  # per thread
    stack_bytes: int  # per thread
    local_bytes: int  # local memory per thread (spills, arrays kept in memory)
    shared_bytes: int  # static shared memory per block
    tensor_core: dict[str, int] | None  # tensor-core instruction -> count; None: no SASS read
    bulk_copies: int | None  # TMA instructions; None: no SASS read
    summary: str  # one line of the figures: 'sm_90a: 32 registers, 0 B static smem, ...'


@dataclass(frozen=True)
class CuteDslKernel:
    """One kernel the CuTe DSL generated, with its @cute.kernel function."""

    kernel: str  # the generated name
    function: str | None  # the @cute.kernel function it came from; None: not found among the file's
    resources: KernelResources | None  # None: its cubin was not kept or not read


@dataclass(frozen=True)
class CuteDslMetrics:
    """A "cute-dsl-check" job's: how the check ended, its one line and the kernels it compiled."""

    status: CuteDslStatus  # the report's status; stopped also where the check gave no report to read
    summary: str  # one line: the kernels compiled, the compile error, or why nothing was checked
    kernels: list[CuteDslKernel] = field(default_factory=list)  # each generated kernel
    version: str | None = None  # nvidia-cutlass-dsl's; None: not known
    isolation: Isolation | None = None  # how the process that ran the file was confined; None: not said


@dataclass(frozen=True)
class DeviceInfoMetrics:
    """A "device-info" job's, once torch is imported and CUDA initialised."""

    versions: dict[str, str | None]  # package versions, CUDA and the driver (None: not installed)
    cuda_available: bool  # torch sees a CUDA device
    device: dict[str, object] | None  # NVML's facts of the GPU (profilers.nvml.device_facts); None: no GPU seen


@dataclass(frozen=True)
class RunMetrics:
    """A "run-python" job's: how the sandboxed call ended (its value and output are the artifacts' sandbox run)."""

    duration_s: float  # the child's wall time
    status: SandboxStatus  # how the call ended: ok, python-exception, timeout, ...


@dataclass(frozen=True)
class BuildMetrics:
    """A "build-extension" job's."""

    duration_s: float  # the build's (or the cached load's) wall time
    status: SandboxStatus  # how the build ended: ok, compile-error, ...
    cached: bool  # the same content was built before: loaded, not built
    build_directory: str  # where the extension is, under the worker's cache
