"""ProfileReports (contracts.profile_report) shaped from ncu launches or SASS/ptxas, and turned into findings.

A ProfileReport holds its source, gpu, ceilings, kernels (one KernelProfile per profiled launch or compiled kernel),
reference_kernels and problems; profilers' own types (Hint, SassStats, Ceilings, KernelPoint) become the contract's
here, and back (`roofline_ceilings`, `roofline_point`) for the chart. A report is encoded once where it leaves the
worker (worker_job.profile_job_result, in the job's ProfileMetrics) and read once where it arrives
(`received_metrics`, `received_report`). Torch-free: the server
and CLI import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TypeVar, get_args

from kernel_lsp.contracts.codec import ContractError, decode
from kernel_lsp.contracts.job_metrics import ProfileMetrics
from kernel_lsp.contracts.profile_report import (
    EnergyReading,
    KernelMetrics,
    KernelProfile,
    Metric,
    ProfileCeilings,
    ProfileHint,
    ProfileIsolation,
    ProfileProblem,
    ProfileReport,
    ProfileSource,
    ReferenceKernel,
    RooflinePoint,
    SassSummary,
)
from kernel_lsp.findings import SOURCE, Finding, Position, Range, Severity, path_to_uri
from kernel_lsp.profile.locations import Location
from profilers.hints import Hint
from profilers.hints.ncu_rules import ncu_hints
from profilers.hints.sass_rules import sass_hints
from profilers.ncu import (
    LAUNCH_STATISTICS,
    SPEED_OF_LIGHT,
    KernelLaunch,
    parse_details_csv,
    parse_raw_csv,
    with_raw,
)
from profilers.roofline import Ceilings, KernelPoint, classify_bound, kernel_point, theoretical_ceilings
from profilers.sass import SassStats

T = TypeVar("T")
SOURCES: tuple[str, ...] = get_args(ProfileSource)

# hints are advice about speed, never errors: a warning-level hint still shows as Information
FINDING_SEVERITY = {"warning": Severity.INFORMATION, "information": Severity.INFORMATION, "hint": Severity.HINT}


def finding_severity(hint: ProfileHint) -> Severity:
    """The severity a profile hint has wherever it is shown: the editor's diagnostic, `kernel-lsp profile`'s text
    and its JSON (`diagnostic_severity` beside the rule's own `severity`). The one place it is decided."""
    return FINDING_SEVERITY.get(hint.severity, Severity.HINT)


def profile_report(source: ProfileSource, kernels: list[KernelProfile], *, gpu: str | None = None,
                   ceilings: Ceilings | None = None, reference_kernels: list[ReferenceKernel] | None = None,
                   problems: list[ProfileProblem] | None = None) -> ProfileReport:
    return ProfileReport(source=source, gpu=gpu, ceilings=report_ceilings(ceilings) if ceilings else None,
                         kernels=kernels, reference_kernels=reference_kernels or [], problems=problems or [])


def received_report(data: object) -> ProfileReport:
    """A ProfileReport as it arrives (a job's `metrics.profile`, the disk cache's entry), decoded once. One that
    breaks the contract (a worker of another version) never fails its reader: what decodes on its own (each
    kernel, problem, reference kernel, the ceilings, the energies) is kept, and a `profile-contract` problem names
    every key that did not."""
    try:
        return decode(ProfileReport, data)
    except ContractError as exc:
        broken = ProfileProblem("profile-contract", f"the worker sent a report this client does not read in full "
                                                    f"(another version?): {exc}")
    wire = data if isinstance(data, Mapping) else {}
    source, gpu = wire.get("source"), wire.get("gpu")
    return ProfileReport(source=source if source in SOURCES else "ncu", gpu=gpu if isinstance(gpu, str) else None,
                         ceilings=_readable(ProfileCeilings, wire.get("ceilings")),
                         kernels=_each(KernelProfile, wire.get("kernels")),
                         reference_kernels=_each(ReferenceKernel, wire.get("reference_kernels")),
                         problems=[*_each(ProfileProblem, wire.get("problems")), broken],
                         energy=_readable(EnergyReading, wire.get("energy")),
                         isolation=_readable(ProfileIsolation, wire.get("isolation")),
                         reference_energy=_readable(EnergyReading, wire.get("reference_energy")))


def received_metrics(data: object) -> ProfileMetrics:
    """A "profile" job's metrics as they arrive, decoded once. Metrics that break the contract never fail their
    reader either: the report is read as `received_report` reads it, and a summary that is not text is left out."""
    try:
        return decode(ProfileMetrics, data)
    except ContractError:
        wire = data if isinstance(data, Mapping) else {}
        summary = wire.get("summary")
        return ProfileMetrics(received_report(wire.get("profile")), summary if isinstance(summary, str) else "")


def _readable(cls: type[T], value: object) -> T | None:
    try:
        return decode(cls, value)
    except ContractError:
        return None


def _each(cls: type[T], values: object) -> list[T]:
    items = [_readable(cls, value) for value in (values if isinstance(values, list) else [])]
    return [item for item in items if item is not None]


def problem_messages(report: ProfileReport) -> list[str]:
    """The messages of a report's problems, in order (what a person reads; never compared)."""
    return [problem.message for problem in report.problems]


# --- profilers' types as the contract's, and back ---------------------------------------------------------

def report_ceilings(ceilings: Ceilings) -> ProfileCeilings:
    return ProfileCeilings(gpu=ceilings.gpu, dram_bandwidth_gbs=ceilings.dram_bandwidth_gbs,
                           fp32_tflops=ceilings.fp32_tflops, tensor_tflops=ceilings.tensor_tflops, how=ceilings.how,
                           ridge_point=ceilings.ridge_point)


def roofline_ceilings(ceilings: ProfileCeilings) -> Ceilings:
    """The report's ceilings as the roofline draws them (the ridge point is theirs to derive)."""
    return Ceilings(gpu=ceilings.gpu, dram_bandwidth_gbs=ceilings.dram_bandwidth_gbs,
                    fp32_tflops=ceilings.fp32_tflops, tensor_tflops=ceilings.tensor_tflops, how=ceilings.how)


def report_point(point: KernelPoint) -> RooflinePoint:
    return RooflinePoint(kernel=point.kernel, duration_s=point.duration_s, dram_bytes=point.dram_bytes,
                         flops=point.flops, bytes_from=point.bytes_from, flops_from=point.flops_from,
                         byte_rate=point.byte_rate, flop_rate=point.flop_rate,
                         arithmetic_intensity=point.arithmetic_intensity)


def roofline_point(point: RooflinePoint) -> KernelPoint:
    """The report's point as the roofline draws it (its rates are the point's to derive)."""
    return KernelPoint(**{f.name: getattr(point, f.name) for f in fields(KernelPoint)})


# --- kernels from ncu -----------------------------------------------------------------------------------

def launch_profile(launch: KernelLaunch, ceilings: Ceilings | None = None,
                   gpu_state: dict[str, object] | None = None, sass: SassStats | None = None) -> KernelProfile:
    """One launch: its bound, ncu's metrics and hints (ncu's rules and ours), duration, roofline point, registers,
    occupancy, grid and block, and, when the kernel's SASS is known, its summary and the SASS rules' hints (those
    ncu did not already give)."""
    bound = classify_bound(launch)
    findings = [profile_hint(hint) for hint in ncu_hints(launch, ceilings, gpu_state)]
    duration = launch.value(SPEED_OF_LIGHT, "Duration")
    point = kernel_point(launch, ceilings)
    registers = launch.value(LAUNCH_STATISTICS, "Registers Per Thread")
    summary = None
    if sass is not None:
        summary = sass_summary(sass)
        given = {finding.code for finding in findings}
        extra = sass_hints(sass, None, memory_bound=bound.kind == "memory" if bound else None)
        findings += [profile_hint(h) for h in extra if h.code not in given]
    return KernelProfile(kernel=launch.base_name, name=launch.kernel_name, id=launch.id,
                         bound=bound.kind if bound else None, metrics=KernelMetrics(ncu_metrics(launch)),
                         findings=findings, duration_ms=duration * 1e3 if duration is not None else None,
                         point=report_point(point) if point else None,
                         registers=int(registers) if registers is not None else None,
                         occupancy_pct=launch.value("Occupancy", "Achieved Occupancy"),
                         grid=launch.grid_size, block=launch.block_size, sass=summary)


def ncu_metrics(launch: KernelLaunch) -> dict[str, dict[str, Metric]]:
    """Section -> metric name -> its value (a number in its unit, else the text ncu printed) and unit."""
    nested: dict[str, dict[str, Metric]] = {}
    for (section, name), metric in launch.metrics.items():
        number = metric.number
        nested.setdefault(section, {})[name] = Metric(metric.text if number is None else number, metric.unit)
    return nested


def imported_launches(details_csv: str, raw_csv: str | None = None) -> list[KernelLaunch]:
    """The launches of an `ncu --csv --page details` export, joined by launch ID with its `--page raw` export when
    given (DRAM bytes, local-memory counters, the device limits the ceilings come from). Both imports start here."""
    launches = parse_details_csv(details_csv)
    return with_raw(launches, parse_raw_csv(raw_csv)) if raw_csv else launches


def imported_kernels(details_csv: str, raw_csv: str | None = None) -> list[KernelProfile]:
    """`kernel-lsp profile --import-csv`: one KernelProfile per launch (every launch is printed), each with the
    theoretical ceilings its own device attributes imply."""
    return [launch_profile(launch, theoretical_ceilings(launch)) for launch in imported_launches(details_csv, raw_csv)]


NO_LAUNCHES = ProfileProblem("profile-no-launches", "the file holds no kernel launches: export it with "
                                                    "'ncu --import REPORT --csv --page details'")
NO_CEILINGS = ProfileProblem("profile-no-ceilings", "no roofline ceilings: import the raw page too "
                                                    "('ncu --import REPORT --csv --page raw')")


def imported_report(details_csv: str, raw_csv: str | None = None) -> ProfileReport:
    """The editor's import: a ProfileReport (source "import-csv") with one KernelProfile per kernel, its longest
    launch (where the time goes; the hover shows one card per kernel), under the first ceilings ncu's device
    attributes give."""
    launches = imported_launches(details_csv, raw_csv)
    ceilings = ncu_ceilings(launches, None)
    problems = [NO_LAUNCHES] if not launches else [NO_CEILINGS] if ceilings is None else []
    kernels = [launch_profile(launch, ceilings) for launch in longest_launch_per_kernel(launches)]
    return profile_report("import-csv", kernels, gpu=ceilings.gpu if ceilings else None, ceilings=ceilings,
                          problems=problems)


def longest_launch_per_kernel(launches: list[KernelLaunch]) -> list[KernelLaunch]:
    """One launch per kernel base name: the one that took longest, which is where the time goes."""
    chosen: dict[str, KernelLaunch] = {}
    for launch in launches:
        kept = chosen.get(launch.base_name)
        if kept is None or _duration(launch) > _duration(kept):
            chosen[launch.base_name] = launch
    return list(chosen.values())


def _duration(launch: KernelLaunch) -> float:
    return launch.value(SPEED_OF_LIGHT, "Duration") or 0.0


def ncu_ceilings(launches: list[KernelLaunch], measured: Ceilings | None) -> Ceilings | None:
    """The measured ceilings when there are some, else the first theoretical ones ncu's raw page gives."""
    if measured is not None:
        return measured
    return next((c for c in map(theoretical_ceilings, launches) if c is not None), None)


# --- SASS -----------------------------------------------------------------------------------------------

def sass_summary(stats: SassStats) -> SassSummary:
    """What the kernel's SASS holds, widths as string keys (JSON objects have no integer keys)."""
    return SassSummary(arch=stats.arch, instructions=stats.instruction_count,
                       global_loads={str(bits): n for bits, n in sorted(stats.global_loads.items())},
                       global_stores={str(bits): n for bits, n in sorted(stats.global_stores.items())},
                       local_loads=stats.local_loads, local_stores=stats.local_stores,
                       shared_loads=stats.shared_loads, shared_stores=stats.shared_stores,
                       tensor_core=dict(stats.tensor_core), fma=stats.fma_count, loops=stats.loop_count,
                       line_info=stats.has_line_info)


def profile_hint(hint: Hint, file: str | None = None, line: int | None = None) -> ProfileHint:
    """A Hint as a KernelProfile finding; file/line (1-based) where the hint has a place in the user's file."""
    placed = file is not None and line is not None
    return ProfileHint(code=hint.code, severity=hint.severity, message=hint.message,
                       estimated_speedup=hint.estimated_speedup, speedup_type=hint.speedup_type,
                       file=file if placed else None, line=line if placed else None)


# --- findings -------------------------------------------------------------------------------------------

def profile_findings(kernels: Sequence[KernelProfile], locations: dict[str, Location], fallback_file: str,
                     texts: dict[str, str] | None = None) -> list[Finding]:
    """One finding per kernel hint: on its source line when known (the line's code, from its indentation to its
    end, where `texts` holds the file: path -> text), else on the kernel's name, else on line 1; a kernel launched
    several times gives each distinct finding once."""
    findings: dict[tuple, Finding] = {}
    for kernel in kernels:
        where = locations.get(kernel.kernel)
        for hint in kernel.findings:
            if hint.file and hint.line:
                uri, rng = path_to_uri(hint.file), code_range((texts or {}).get(hint.file), hint.line - 1)
            elif where is not None:
                uri, rng = path_to_uri(where.file), where.range
            else:
                uri, rng = path_to_uri(fallback_file), Range.line(0)
            finding = Finding(uri, rng, finding_severity(hint), SOURCE, hint.code,
                              f"{kernel.kernel}: {hint.message}{gain_text(hint)}",
                              data={"kernel": kernel.kernel, "estimatedSpeedup": hint.estimated_speedup,
                                    "speedupType": hint.speedup_type, "producer": "profile"})
            findings.setdefault((uri, rng, finding.code, finding.message), finding)
    return list(findings.values())


def code_range(text: str | None, line: int) -> Range:
    """The code of a 0-based line, without its indentation and trailing spaces; the line's start without the text."""
    lines = text.splitlines() if text is not None else []
    if not 0 <= line < len(lines) or not lines[line].strip():
        return Range.line(line)
    code = lines[line].rstrip()
    return Range(Position(line, len(code) - len(code.lstrip())), Position(line, len(code)))


def gain_text(hint: ProfileHint) -> str:
    speedup = hint.estimated_speedup
    if speedup is None:
        return ""
    kind = hint.speedup_type
    return f" (estimated gain {speedup:.3g}%{f' {kind}' if kind and kind != 'estimate' else ''})"


def summary_line(report: ProfileReport) -> str:
    """'3 kernels (ncu on NVIDIA H200): vec_add memory bound 1.23 ms; ...' or what went wrong."""
    kernels = report.kernels
    if not kernels:
        return f"no kernel profiled: {'; '.join(problem_messages(report)) or 'none found'}"
    where = f"{report.source} on {report.gpu}" if report.gpu else report.source
    parts = [kernel_phrase(kernel) for kernel in kernels]
    return f"{len(kernels)} kernel{'s' if len(kernels) != 1 else ''} ({where}): {'; '.join(parts)}"


def kernel_phrase(kernel: KernelProfile) -> str:
    words = [kernel.kernel]
    if kernel.bound:
        words.append(f"{kernel.bound} bound")
    duration = kernel.duration_ms
    if duration is not None:
        words.append(f"{duration * 1e3:.3g} µs" if duration < 1 else f"{duration:.4g} ms")
    return " ".join(words)
