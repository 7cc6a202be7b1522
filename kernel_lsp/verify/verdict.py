"""A VerifyReport as the user sees it: findings on the candidate's lines and the one-line summary of a code lens.

The server and the CLI import it (no torch); the report comes from kernel_lsp.verify.run in a sandbox child,
decoded by contracts.codec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict

from kernel_lsp.candidate.shared_fill import FILLED
from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.verify_report import Isolation, VerifyReport
from kernel_lsp.findings import SOURCE, Finding, Range, Severity
from kernel_lsp.sources import parse_python

COVERED = "covered"  # the report's free_memory_poison when every run's output fit the block poisoned for it

OUTPUT_REASONS = {"shape", "dtype", "device", "type", "structure"}


def forward_range(candidate_text: str) -> Range:
    """Where verdicts about the candidate's results belong: ModelNew.forward's name, else ModelNew, else line 1."""
    model_new = parse_python(candidate_text).kernelbench.model_new
    if model_new is None:
        return Range.line(0)
    return model_new.forward.name_range if model_new.forward is not None else model_new.name_range


def correctness_code(reason: str) -> str:
    if reason in ("nan", "inf"):
        return "verify-nan"
    return "verify-output" if reason in OUTPUT_REASONS else "verify-mismatch"


def report_findings(report: VerifyReport, candidate_uri: str, candidate_text: str) -> list[Finding]:
    """One finding for failed trials (the worst one's numbers) and one per integrity problem."""
    where = forward_range(candidate_text)
    findings = []
    correctness = report.correctness
    worst = correctness.worst
    failed = correctness.trials - correctness.passed
    if failed and worst:
        message = (f"{failed} of {correctness.trials} trials failed "
                   f"(inputs: {', '.join(correctness.distributions)}); worst: {worst.message}")
        findings.append(Finding(candidate_uri, where, Severity.ERROR, SOURCE, correctness_code(worst.reason),
                                message, data={"worst": encode(worst)}))
    for problem in report.integrity:
        findings.append(Finding(candidate_uri, where, Severity.ERROR, SOURCE, problem.code, problem.message))
    library_work = report.kernels.work.library_work if report.kernels.work else None
    if library_work:
        findings.append(Finding(candidate_uri, where, Severity.WARNING, SOURCE, LIBRARY_WORK, library_work))
    gaps = isolation_gaps(report.isolation)
    if gaps:
        findings.append(Finding(candidate_uri, where, Severity.WARNING, SOURCE, "verify-not-isolated",
                                "the candidate ran without full isolation: " + "; ".join(gaps)))
    unpoisoned = report.shared_memory_poison
    if unpoisoned is not None and unpoisoned != FILLED:
        findings.append(Finding(candidate_uri, where, Severity.WARNING, SOURCE, "verify-shared-unpoisoned",
                                f"shared memory was not poisoned before the runs ({unpoisoned}): a kernel that "
                                f"reads shared memory it never wrote could pass"))
    short = report.free_memory_poison
    if short is not None and short != COVERED:
        findings.append(Finding(candidate_uri, where, Severity.WARNING, SOURCE, "verify-poison-short",
                                f"the free device memory could not be poisoned for the whole output ({short}): an "
                                f"output the candidate never writes may read zeros instead of NaN, and then fails "
                                f"as a mismatch rather than integrity-uninitialized-output, or passes where zeros "
                                f"are right"))
    timed = report.timing.candidate if report.timing else None
    if timed is not None and timed.reused_output:
        findings.append(Finding(candidate_uri, where, Severity.INFORMATION, SOURCE, "verify-output-copied",
                                "forward returns the same output tensor on every call, so a later call overwrites "
                                "an earlier answer: each timed call's output was copied as it returned, to be "
                                "checked, and those copies (one pass over the output each) are in its time"))
    disturbed = judge_disturbances(report)
    if disturbed:
        findings.append(Finding(candidate_uri, where, Severity.WARNING, SOURCE, "verify-judge-disturbed",
                                "figures measured in this run were used but not cached, and may be off: "
                                + "; ".join(disturbed)))
    return findings


LIBRARY_WORK = "integrity-library-work"
# verified, yet no verified candidate for the agent's reward, bench and campaign (a warning for a person)
REWARD_REJECTS = (LIBRARY_WORK,)


def own_share_shown(report: VerifyReport) -> str | None:
    """'own kernels 93%': the share of the recorded runs' device time in the candidate's own kernels (its process's
    profiler, so its word); None without one."""
    if report.kernels.work is None or report.device == "cpu":
        return None  # on the CPU the interpreter's wall time says nothing of a GPU's split
    share = report.kernels.work.own_share
    return f"own kernels {share:.0%}" if share >= 0.01 or share == 0 else "own kernels <1%"


def judge_disturbances(report: VerifyReport) -> list[str]:
    """Why figures measured in this run were not cached: the judge's scheduling was disturbed while it timed a
    baseline or measured the device's peaks, or the measured bandwidth was far under the datasheet's."""
    schedule = (report.timing.schedule if report.timing else None) or {}
    notes = [f"the {kind} baseline: {why}" for kind, why in schedule.items()]
    if report.floor is not None:
        notes += [f"the device's peaks: {why}" for why in (report.floor.schedule, report.floor.datasheet) if why]
    return notes


def isolation_gaps(isolation: Isolation | Mapping[str, object] | None) -> list[str]:
    """What the candidate's process was not kept from (files, network, ...), as a report's isolation says (a
    VerifyReport's, or the plain mapping of a profile's or a sandbox run's)."""
    parts = asdict(isolation) if isinstance(isolation, Isolation) else dict(isolation or {})
    return [f"{part}: {status}" for part, status in parts.items()
            if isinstance(status, str) and not status.startswith("isolated")]


def readable_ms(ms: float) -> str:
    return f"{ms * 1000:.3g} µs" if ms < 1 else f"{ms:.3g} ms"


CPU_TIMINGS = "run on the CPU: timings not comparable"


def best_so_far(speedup_eager: float | None, verified: int = 0, cpu: bool = False) -> str | None:
    """An optimize pass's best so far, as its progress (editor and CLI) and the campaign line say it: the speedup
    against eager on a GPU; on the CPU (Triton's interpreter) the count of verified candidates, since the
    interpreter's times say nothing of a GPU (as the code lens's CPU_TIMINGS). None when nothing verified."""
    if cpu:
        if not verified:
            return None
        plural = "s" if verified != 1 else ""
        return f"best: verified (CPU: timings not comparable; {verified} candidate{plural} verified)"
    return f"best {speedup_eager:.3g}× eager" if speedup_eager is not None else None


def summary(verdict: str, report: VerifyReport | None, reason: str = "") -> str:
    """The code lens title: 'correct 5/5 · 1.84× eager · ≈1× compile · 3.1 ms' or why not (≈1×: the speedup's
    95% interval holds 1x). A report whose speedups are not comparable (a run on the CPU: Triton's interpreter,
    eager PyTorch on the CPU) shows no times or speedups: they vary 2× between runs and say nothing of a GPU."""
    if verdict == "unavailable" or report is None:
        return f"not verified: {reason}" if verdict == "unavailable" else f"rejected: {reason}"
    correctness = report.correctness
    counts = f"correct {correctness.passed}/{correctness.trials}"
    if verdict != "verified":
        problems = [p.code for p in report.integrity]
        if correctness.passed < correctness.trials:
            problems.insert(0, correctness_code(correctness.worst.reason if correctness.worst else "mismatch"))
        return f"rejected · {counts} · {', '.join(problems)}"
    parts = [counts]
    if not report.speedup_comparable:
        parts.append(CPU_TIMINGS)  # the figures stay in the report, marked; as ratios they would only mislead
    else:
        for kind in ("eager", "compile"):
            value = report.speedup.get(kind)
            if value is not None:
                # a difference the rounds could not tell from noise (its interval holds 1x) is shown as such
                shown = "≈1" if report.significant.get(kind) is False else f"{value:.3g}"
                parts.append(f"{shown}× {kind}")
            elif report.timing is not None and kind in report.timing.skipped:  # asked for, not timed: said
                parts.append(f"{kind} not timed")
        if report.timing is not None and report.timing.candidate is not None:
            parts.append(readable_ms(report.timing.candidate.median_ms))
        share = own_share_shown(report)
        if share:
            parts.append(share)
    if isolation_gaps(report.isolation):
        parts.append("not isolated")
    return " · ".join(parts)
