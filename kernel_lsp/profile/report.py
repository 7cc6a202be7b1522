"""ProfileReports (docs: ../shared PROFILE_CONTRACT) shaped from ncu launches or SASS/ptxas, and turned into findings.

A ProfileReport is a plain dict, msgpack and JSON safe: source, gpu, ceilings, kernels (one KernelProfile per
profiled launch or compiled kernel), reference_kernels, problems (contracts.profile_report.ProfileProblem, encoded:
`{"code", "message"}`). Torch-free: the server and CLI import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel_lsp.contracts.codec import ContractError, decode
from kernel_lsp.contracts.profile_report import ProfileProblem
from kernel_lsp.findings import SOURCE, Finding, Position, Range, Severity, path_to_uri
from kernel_lsp.profile.locations import Location
from profilers.hints import Hint
from profilers.hints.ncu_rules import kernel_report
from profilers.hints.sass_rules import sass_hints
from profilers.ncu import (
    LAUNCH_STATISTICS,
    SPEED_OF_LIGHT,
    KernelLaunch,
    parse_details_csv,
    parse_raw_csv,
    with_raw,
)
from profilers.roofline import Ceilings, kernel_point, theoretical_ceilings
from profilers.sass import SassStats

# hints are advice about speed, never errors: a warning-level hint still shows as Information
FINDING_SEVERITY = {"warning": Severity.INFORMATION, "information": Severity.INFORMATION, "hint": Severity.HINT}


def finding_severity(hint: dict[str, Any]) -> Severity:
    """The severity a profile hint has wherever it is shown: the editor's diagnostic, `kernel-lsp profile`'s text
    and its JSON (`diagnostic_severity` beside the rule's own `severity`). The one place it is decided."""
    return FINDING_SEVERITY.get(hint.get("severity"), Severity.HINT)


def profile_report(source: str, kernels: list[dict[str, Any]], *, gpu: str | None = None,
                   ceilings: Ceilings | None = None, reference_kernels: list[dict[str, Any]] | None = None,
                   problems: list[ProfileProblem] | None = None) -> dict[str, Any]:
    return {"source": source, "gpu": gpu, "ceilings": ceilings.to_dict() if ceilings else None,
            "kernels": kernels, "reference_kernels": reference_kernels or [],
            "problems": wire_problems(problems or [])}


def wire_problems(problems: list[ProfileProblem]) -> list[dict[str, str]]:
    """Problems as a report carries them."""
    return [{"code": p.code, "message": p.message} for p in problems]


def report_problems(report: Mapping[str, Any]) -> list[ProfileProblem]:
    """A ProfileReport's problems, typed; one that breaks the contract (a worker of another version) is said as a
    problem of its own rather than lost."""
    problems = []
    for item in report.get("problems") or []:
        try:
            problems.append(decode(ProfileProblem, item))
        except ContractError as exc:
            problems.append(ProfileProblem("profile-contract", f"a problem the worker sent in another form: {exc}"))
    return problems


def problem_messages(report: Mapping[str, Any]) -> list[str]:
    """The messages of a report's problems, in order (what a person reads; never compared)."""
    return [problem.message for problem in report_problems(report)]


# --- kernels from ncu -----------------------------------------------------------------------------------

def launch_profile(launch: KernelLaunch, ceilings: Ceilings | None = None, gpu_state: dict[str, Any] | None = None,
                   sass: SassStats | None = None) -> dict[str, Any]:
    """kernel_report plus duration, roofline point, registers, occupancy, grid and block, and, when the kernel's
    SASS is known, its summary and the SASS rules' hints (those ncu did not already give)."""
    profile = kernel_report(launch, ceilings, gpu_state)
    duration = launch.value(SPEED_OF_LIGHT, "Duration")
    point = kernel_point(launch, ceilings)
    registers = launch.value(LAUNCH_STATISTICS, "Registers Per Thread")
    profile.update(duration_ms=duration * 1e3 if duration is not None else None,
                   point=point.to_dict() if point else None,
                   registers=int(registers) if registers is not None else None,
                   occupancy_pct=launch.value("Occupancy", "Achieved Occupancy"),
                   grid=list(launch.grid_size), block=list(launch.block_size))
    if sass is not None:
        profile["sass"] = sass_summary(sass)
        given = {finding["code"] for finding in profile["findings"]}
        extra = sass_hints(sass, None, memory_bound=profile["bound"] == "memory" if profile["bound"] else None)
        profile["findings"] += [hint_dict(h) for h in extra if h.code not in given]
    return profile


def imported_launches(details_csv: str, raw_csv: str | None = None) -> list[KernelLaunch]:
    """The launches of an `ncu --csv --page details` export, joined by launch ID with its `--page raw` export when
    given (DRAM bytes, local-memory counters, the device limits the ceilings come from). Both imports start here."""
    launches = parse_details_csv(details_csv)
    return with_raw(launches, parse_raw_csv(raw_csv)) if raw_csv else launches


def imported_kernels(details_csv: str, raw_csv: str | None = None) -> list[dict[str, Any]]:
    """`kernel-lsp profile --import-csv`: one KernelProfile per launch (every launch is printed), each with the
    theoretical ceilings its own device attributes imply."""
    return [launch_profile(launch, theoretical_ceilings(launch)) for launch in imported_launches(details_csv, raw_csv)]


NO_LAUNCHES = ProfileProblem("profile-no-launches", "the file holds no kernel launches: export it with "
                                                    "'ncu --import REPORT --csv --page details'")
NO_CEILINGS = ProfileProblem("profile-no-ceilings", "no roofline ceilings: import the raw page too "
                                                    "('ncu --import REPORT --csv --page raw')")


def imported_report(details_csv: str, raw_csv: str | None = None) -> dict[str, Any]:
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

def sass_summary(stats: SassStats) -> dict[str, Any]:
    """What the kernel's SASS holds, widths as string keys (JSON objects have no integer keys)."""
    return {"arch": stats.arch, "instructions": stats.instruction_count,
            "global_loads": {str(bits): n for bits, n in sorted(stats.global_loads.items())},
            "global_stores": {str(bits): n for bits, n in sorted(stats.global_stores.items())},
            "local_loads": stats.local_loads, "local_stores": stats.local_stores,
            "shared_loads": stats.shared_loads, "shared_stores": stats.shared_stores,
            "tensor_core": dict(stats.tensor_core), "fma": stats.fma_count, "loops": stats.loop_count,
            "line_info": stats.has_line_info}


def hint_dict(hint: Hint, file: str | None = None, line: int | None = None) -> dict[str, Any]:
    """A Hint as a KernelProfile finding; file/line (1-based) where the hint has a place in the user's file."""
    finding: dict[str, Any] = {"code": hint.code, "severity": hint.severity, "message": hint.message,
                               "estimated_speedup": hint.estimated_speedup, "speedup_type": hint.speedup_type}
    if file is not None and line is not None:
        finding.update(file=file, line=line)
    return finding


# --- findings -------------------------------------------------------------------------------------------

def profile_findings(report: dict[str, Any], locations: dict[str, Location], fallback_file: str,
                     texts: dict[str, str] | None = None) -> list[Finding]:
    """One finding per kernel hint: on its source line when known (the line's code, from its indentation to its
    end, where `texts` holds the file: path -> text), else on the kernel's name, else on line 1; a kernel launched
    several times gives each distinct finding once."""
    findings: dict[tuple, Finding] = {}
    for kernel in report["kernels"]:
        where = locations.get(kernel["kernel"])
        for hint in kernel["findings"]:
            if hint.get("file") and hint.get("line"):
                uri, rng = path_to_uri(hint["file"]), code_range((texts or {}).get(hint["file"]), hint["line"] - 1)
            elif where is not None:
                uri, rng = path_to_uri(where.file), where.range
            else:
                uri, rng = path_to_uri(fallback_file), Range.line(0)
            finding = Finding(uri, rng, finding_severity(hint), SOURCE, hint["code"],
                              f"{kernel['kernel']}: {hint['message']}{gain_text(hint)}",
                              data={"kernel": kernel["kernel"], "estimatedSpeedup": hint["estimated_speedup"],
                                    "speedupType": hint["speedup_type"], "producer": "profile"})
            findings.setdefault((uri, rng, finding.code, finding.message), finding)
    return list(findings.values())


def code_range(text: str | None, line: int) -> Range:
    """The code of a 0-based line, without its indentation and trailing spaces; the line's start without the text."""
    lines = text.splitlines() if text is not None else []
    if not 0 <= line < len(lines) or not lines[line].strip():
        return Range.line(line)
    code = lines[line].rstrip()
    return Range(Position(line, len(code) - len(code.lstrip())), Position(line, len(code)))


def gain_text(hint: dict[str, Any]) -> str:
    speedup = hint.get("estimated_speedup")
    if speedup is None:
        return ""
    kind = hint.get("speedup_type")
    return f" (estimated gain {speedup:.3g}%{f' {kind}' if kind and kind != 'estimate' else ''})"


def summary_line(report: dict[str, Any]) -> str:
    """'3 kernels (ncu on NVIDIA H200): vec_add memory bound 1.23 ms; ...' or what went wrong."""
    kernels = report["kernels"]
    if not kernels:
        return f"no kernel profiled: {'; '.join(problem_messages(report)) or 'none found'}"
    where = f"{report['source']} on {report['gpu']}" if report.get("gpu") else report["source"]
    parts = [kernel_phrase(kernel) for kernel in kernels]
    return f"{len(kernels)} kernel{'s' if len(kernels) != 1 else ''} ({where}): {'; '.join(parts)}"


def kernel_phrase(kernel: dict[str, Any]) -> str:
    words = [kernel["kernel"]]
    if kernel.get("bound"):
        words.append(f"{kernel['bound']} bound")
    duration = kernel.get("duration_ms")
    if duration is not None:
        words.append(f"{duration * 1e3:.3g} µs" if duration < 1 else f"{duration:.4g} ms")
    return " ".join(words)
