"""The "cute-dsl-check" job kind, both sides: a Python file's CuTe DSL kernels compiled without launching them.

The DSL compiles on a machine without a GPU (kernel_lsp/verify/cute_dsl.py runs the file in a sandboxed child with
the launch replaced by a record), so this is the compile check of `@cute.kernel`/`@cute.jit` code everywhere: its
compile error on the user's line (the deepest frame in the user's files, the calls that led there as related
information), and each compiled kernel's figures on its function's name, read from the cubin the DSL's own ptxas
made (cuobjdump --dump-resource-usage: registers, stack, local memory, shared memory; the SASS: tensor-core and
TMA instructions, the widest global access). The DSL carries a newer ptxas than the toolkit may have (its PTX can be
of a later ISA version), so its cubin, not a ptxas run here, is the source. The worker runs the check on the CPU
and never waits for the GPU.

Client side (server, agent): `cute_dsl_job`, `CuteDslOutcome.of`. Worker side: `handle`, registered under
"cute-dsl-check" by kernel_lsp/commands/worker.py.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.config import Settings
from kernel_lsp.contracts.codec import ContractError, decode, encode
from kernel_lsp.contracts.cute_dsl_report import CompiledFunction, CuteDslReport
from kernel_lsp.contracts.job_metrics import CuteDslKernel, CuteDslMetrics, KernelResources
from kernel_lsp.contracts.verify_report import Isolation
from kernel_lsp.findings import Finding, Range, Related, Severity, path_to_uri
from kernel_lsp.jobs.cache import cache_key
from kernel_lsp.jobs.files import gather_files
from kernel_lsp.profile.locations import kernel_locations
from kernel_lsp.candidate.kernels import cute_kernel_function
from kernel_lsp.worker.jobs import SOURCE, JobContext, sandbox_run_finding, sandbox_limits
from kernel_lsp.worker.protocol import Job, Result
from kernel_lsp.worker.sandbox import SandboxRun, SandboxTask
from profilers.sass import (
    ResourceUsage,
    SassStats,
    SassToolFailed,
    SassToolMissing,
    resource_usage_for_cubin,
    sass_stats_for_cubin,
)

KIND = "cute-dsl-check"
WALL_TIME_S = 180.0  # an import of the DSL (~1 s), the file's own imports and one forward on the CPU
DEFAULT_ARCH = "sm_90a"
MAX_RELATED = 8


def dsl_arch(settings: Settings) -> str:
    """The DSL's target from the `arch` setting: Hopper's and Blackwell's own instructions (WGMMA, TMA, tcgen05)
    need the 'a' variant, which the DSL expects (sm_90 -> sm_90a)."""
    arch = settings.compile.arch[0] if settings.compile.arch else DEFAULT_ARCH
    return f"{arch}a" if arch in ("sm_90", "sm_100", "sm_101", "sm_103", "sm_120") else arch


def cute_dsl_job(candidate: Path, reference: Path | None = None, arch: str = DEFAULT_ARCH,
                 texts: Mapping[Path, str] | None = None) -> Job:
    """The check of `candidate` (its files as jobs.files gathers them; `texts` overrides disk); a KernelBench
    candidate without get_inputs takes them from `reference`."""
    files = gather_files(candidate, reference, texts)
    config: dict[str, Any] = {"candidate": files.candidate, "origins": files.origins, "arch": arch,
                              "reference": files.reference}
    return Job(KIND, files.texts, config, cache_key(KIND, files.texts, config))


@dataclass(frozen=True)
class CuteDslOutcome:
    status: str  # ok | compile-error | stopped | no-dsl | unsupported | failed (the job itself)
    summary: str
    findings: list[Finding]
    kernels: list[CuteDslKernel]  # each generated kernel, its @cute.kernel function and its cubin's figures
    isolation: Isolation | None  # how the process that ran the file was confined; None: not said

    @classmethod
    def of(cls, result: Result) -> CuteDslOutcome:
        findings = [Finding.from_dict(f) for f in result.findings]
        if result.status != "ok":
            message = f"the CuTe DSL check {result.status}: {result.error or 'no message'}"
            return cls("failed", message, findings, [], None)
        try:
            metrics = decode(CuteDslMetrics, result.metrics)
        except ContractError as exc:  # a worker of another version
            return cls("failed", f"the worker's CuTe DSL check is not in the form this client reads: {exc}",
                       findings, [], None)
        return cls(metrics.status, metrics.summary, findings, metrics.kernels, metrics.isolation)

    @property
    def compile_errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.ERROR]


# ---- the worker's side ---------------------------------------------------------------------------------------


async def handle(job: Job, context: JobContext) -> Result:
    """On the CPU, never holding the GPU slot: nothing is launched."""
    config = job.config
    origins: dict[str, str] = config.get("origins") or {}
    candidate = config["candidate"]
    task = SandboxTask(entry="kernel_lsp.verify.cute_dsl:check_confined", files=job.source_files, origins=origins,
                       args={"candidate": candidate, "reference": config.get("reference"),
                             "arch": config.get("arch") or DEFAULT_ARCH, "uses_cuda": False})
    await context.progress(f"compiling the CuTe DSL kernels of {candidate} (no launch)")
    ran = await context.sandbox.run(task, sandbox_limits({"wallTimeS": WALL_TIME_S}))
    candidate_uri = path_to_uri(origins.get(candidate, candidate))
    if ran.status != "ok":  # the child itself died or hung (a crash in the DSL's native code, say)
        return _stopped(sandbox_run_finding(ran, task), ran)
    try:
        report = decode(CuteDslReport, ran.value)
    except ContractError as error:  # the process that built it ran the user's file: its word, which did not hold
        return _stopped(Finding(candidate_uri, Range.line(0), Severity.INFORMATION, SOURCE, "cute-dsl-contract",
                                f"the CuTe DSL check's report broke its contract: {error}"), ran)
    locations = kernel_locations({name: text for name, text in job.source_files.items()
                                  if name != config.get("reference")}, origins)
    kernels, problems = await asyncio.to_thread(_kernel_facts, report.kernels,
                                                config.get("arch") or DEFAULT_ARCH, set(locations))
    findings = _report_findings(report, origins, candidate_uri) + _resource_findings(kernels, locations)
    findings += [Finding(candidate_uri, Range.line(0), Severity.INFORMATION, SOURCE, "cute-dsl-resources", problem)
                 for problem in problems]
    metrics = CuteDslMetrics(report.status, _summary(report, kernels), kernels, report.version, report.isolation)
    return _result(metrics, findings, ran)


def _stopped(finding: Finding, ran: SandboxRun) -> Result:
    """A check that gave no report to read: its one finding, the status "stopped"."""
    return _result(CuteDslMetrics("stopped", finding.message), [finding], ran)


def _result(metrics: CuteDslMetrics, findings: list[Finding], ran: SandboxRun) -> Result:
    """The job's Result: its CuteDslMetrics encoded into `metrics`, the child's stderr's tail."""
    return Result("ok", [f.to_dict() for f in findings], encode(metrics), {"stderr": ran.stderr[-4000:]})


def _report_findings(report: CuteDslReport, origins: dict[str, str], candidate_uri: str) -> list[Finding]:
    status = report.status
    if status in ("no-dsl", "unsupported"):
        return [Finding(candidate_uri, Range.line(0), Severity.INFORMATION, SOURCE, "cute-dsl-unavailable",
                        str(report.message))]
    if status == "ok":
        if report.kernels:
            return []
        return [Finding(candidate_uri, Range.line(0), Severity.INFORMATION, SOURCE, "cute-dsl-not-reached",
                        "no @cute.jit function was called while importing this file and running ModelNew's forward "
                        "on get_inputs(): nothing of the CuTe DSL was compiled, so nothing was checked")]
    user = [frame for frame in report.frames if frame.file in origins]
    where = user[-1] if user else None
    uri = path_to_uri(origins[where.file]) if where else candidate_uri
    rng = Range.line(max(where.line - 1, 0)) if where else Range.line(0)
    related = tuple(Related(path_to_uri(origins[f.file]), Range.line(max(f.line - 1, 0)),
                            f"called from here: {f.text or f.function}") for f in user[-1 - MAX_RELATED:-1])
    message = " ".join((report.message or "").split())
    if status == "compile-error":
        return [Finding(uri, rng, Severity.ERROR, SOURCE, "cute-dsl-error", f"CuTe DSL: {message}", related,
                        data={"errorType": report.error_type, "version": report.version})]
    reached = "after some kernels compiled" if report.kernels else "before any CuTe DSL kernel compiled"
    return [Finding(uri, rng, Severity.INFORMATION, SOURCE, "cute-dsl-not-reached",
                    f"the CuTe DSL check stopped {reached} ({report.stage}): {report.error_type}: "
                    f"{message}. Without a GPU the check runs forward on CPU tensors; code that needs CUDA "
                    "(.cuda(), torch.cuda.current_stream()) stops it there", related)]


def _kernel_facts(compiled: list[CompiledFunction], arch: str, functions: set[str]
                  ) -> tuple[list[CuteDslKernel], list[str]]:
    """Each generated kernel with its @cute.kernel function and what its cubin says of it."""
    kernels: list[CuteDslKernel] = []
    problems: list[str] = []
    for entry in compiled:
        usage: dict[str, ResourceUsage] = {}
        stats: dict[str, SassStats] = {}
        if entry.cubin:
            with tempfile.TemporaryDirectory(prefix="kernel-lsp-cute-dsl-") as directory:
                cubin = Path(directory) / "kernels.cubin"
                cubin.write_bytes(entry.cubin)
                try:
                    usage = {u.name: u for u in resource_usage_for_cubin(cubin)}
                    stats = {s.mangled: s for s in sass_stats_for_cubin(cubin)}
                except (SassToolMissing, SassToolFailed) as exc:
                    problems.append(f"no figures for the CuTe DSL kernels: {exc}")
        for name in entry.kernels:
            kernels.append(CuteDslKernel(name, cute_kernel_function(name, functions),
                                         _facts(usage.get(name), stats.get(name), arch)))
    return kernels, list(dict.fromkeys(problems))


def _facts(usage: ResourceUsage | None, stats: SassStats | None, arch: str) -> KernelResources | None:
    if usage is None:
        return None
    parts = [f"{usage.registers} registers"]
    parts += [f"{usage.stack} B stack"] if usage.stack else []
    parts += [f"{usage.local} B local memory"] if usage.local else []
    parts.append(f"{usage.shared} B static smem")
    if stats is not None:
        tensor = ", ".join(f"{op} ×{n}" for op, n in sorted(stats.tensor_core.items()))
        parts.append(f"tensor cores: {tensor}" if tensor else "no tensor-core instruction")
        parts += [f"TMA ×{stats.bulk_copies}"] if stats.bulk_copies else []
        parts += [f"widest global access {stats.widest_global_bits} bits"] if stats.global_accesses else []
    return KernelResources(arch, usage.registers, usage.stack, usage.local, usage.shared,
                           dict(stats.tensor_core) if stats else None, stats.bulk_copies if stats else None,
                           f"{arch}: " + ", ".join(parts))


def _resource_findings(kernels: list[CuteDslKernel], locations: Mapping[str, Any]) -> list[Finding]:
    """One Information finding per @cute.kernel function with its kernels' figures, a Warning when one uses local
    memory."""
    by_function: dict[str, list[tuple[str, KernelResources]]] = {}
    for kernel in kernels:
        if kernel.function in locations and kernel.resources is not None:
            by_function.setdefault(kernel.function, []).append((kernel.kernel, kernel.resources))
    findings = []
    for function, entries in by_function.items():
        location = locations[function]
        uri = path_to_uri(location.file)
        summary = "; ".join(r.summary for _, r in entries)
        more = f" ({len(entries)} specializations)" if len(entries) > 1 else ""
        findings.append(Finding(uri, location.range, Severity.INFORMATION, SOURCE, "ptxas-resources",
                                f"{function}: {summary}{more}",
                                data={"kernel": function, "generated": [name for name, _ in entries]}))
        for _, r in entries:
            if r.local_bytes:
                findings.append(Finding(
                    uri, location.range, Severity.WARNING, SOURCE, "ptxas-spill",
                    f"{function} uses {r.local_bytes} bytes of local memory per thread on {r.arch} "
                    f"({r.registers} registers): spilled registers or an array the compiler could not keep in "
                    "registers; local memory is as slow as global memory", data={"kernel": function}))
    return findings


def _summary(report: CuteDslReport, kernels: list[CuteDslKernel]) -> str:
    status = report.status
    if status == "ok":
        return (f"CuTe DSL {report.version}: {len(kernels)} kernel(s) compiled" if kernels
                else "CuTe DSL: nothing compiled")
    if status == "compile-error":
        return f"CuTe DSL compile error: {' '.join(str(report.message).split())[:200]}"
    return report.message or f"CuTe DSL check {status}"
