"""The rubric: one number per evaluated candidate, from what the worker reported and nothing else.

An evaluation is a dict:
    compile   {"compiled": bool, "errors": int, "first_error"?: str}  (absent when no separate compile step ran)
    verdict   "verified" | "rejected" | "unavailable"                  (the verify job's metrics)
    summary   the verify job's one-line summary
    report    the VerifyReport (docs/ARCHITECTURE.md), None when the run itself failed
    energy?   {"candidate_mj_per_call": float, "reference_mj_per_call": float}  (added when the profile tool read
              both on a GPU; the loop then scores the node again)
    sanitize? compute-sanitizer's check of a verified candidate (agent/safety.py): its `errors` on the candidate's
              lines, or why it did not run

Score 0, with the reason, for: a compile failure, no verdict yet, an unavailable verdict, a rejected verdict, any
integrity problem, failed trials, or compute-sanitizer errors in the candidate's kernels (outcome "unsafe": a kernel
that reads past an allocation or races passes its trials by luck). A speedup in such a report never counts. A check
that could not run (no GPU, no compute-sanitizer, a tool stopped before it found anything) changes nothing.

A verified candidate scores
    raw   = W_EAGER * log2(speedup_eager) + W_COMPILE * log2(speedup_compile) + W_ENERGY * log2(energy_saving)
    score = log2(1 + 2 ** raw)
where energy_saving = reference energy per call / candidate energy per call, and a term whose number the worker did
not measure is left out. The score is 1 for a candidate exactly as fast as its baselines, about raw when raw is
large (the log scale), and tends to 0 without reaching it as the candidate gets slower, so every verified candidate
outranks every reject. Within one pass the baselines are fixed (speedup_compile = speedup_eager × t_compile /
t_eager), so without the energy term the score rises with the candidate's speed alone: one slower than eager scores
below any faster one. A verified candidate that was not timed scores UNTIMED_SCORE: above every reject, below one
timed as fast as eager.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kernel_lsp.agent.evaluation import report_of
from kernel_lsp.agent.safety import error_line, sanitizer_errors
from kernel_lsp.contracts.verify_report import VerifyReport
from kernel_lsp.verify.verdict import correctness_code

W_EAGER = 1.0
W_COMPILE = 0.5  # beating torch.compile counts, but less than beating eager, which is what users compare first
W_ENERGY = 0.25  # a tie-breaker between kernels of similar speed, not a reason to accept a slower one
UNTIMED_SCORE = 0.5
MIN_VERIFIED_SCORE = 1e-9  # 2 ** raw underflows for absurdly slow candidates; they still outrank a reject

OUTCOMES = ("verified", "compile-error", "unverified", "unavailable", "rejected", "integrity", "unsafe")


@dataclass(frozen=True)
class RubricScore:
    """score >= 0; parts: the weighted log2 terms and raw; reason: one line ('verified 1.4× eager', 'rejected: ...');
    outcome: one of OUTCOMES."""

    score: float
    parts: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    outcome: str = "unverified"

    @property
    def verified(self) -> bool:
        return self.outcome == "verified"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(evaluation: dict[str, Any]) -> RubricScore:
    """The rubric score of one evaluation (module docstring)."""
    compile_result = evaluation.get("compile")
    if compile_result is not None and not compile_result.get("compiled", False):
        return RubricScore(0.0, reason=compile_error_reason(compile_result), outcome="compile-error")
    verdict = evaluation.get("verdict")
    if verdict is None:
        return RubricScore(0.0, reason="compiled, not verified", outcome="unverified")
    if verdict == "unavailable":
        return RubricScore(0.0, reason=unavailable_reason(evaluation), outcome="unavailable")
    report = report_of(evaluation)
    if report is not None and report.integrity:
        return RubricScore(0.0, reason=rejected_reason(evaluation, report), outcome="integrity")
    if verdict != "verified" or report is None or report.verdict != "verified" or not all_trials_passed(report):
        return RubricScore(0.0, reason=rejected_reason(evaluation, report), outcome="rejected")
    errors = sanitizer_errors(evaluation)
    if errors:
        return RubricScore(0.0, reason=unsafe_reason(errors), outcome="unsafe")
    return verified_score(report, evaluation.get("energy"))


def compile_error_reason(compile_result: dict[str, Any]) -> str:
    first = str(compile_result.get("first_error") or "").strip().splitlines()
    if first:
        return f"compile error: {first[0][:200]}"
    errors = compile_result.get("errors", 0)
    return f"compile error: {errors} error{'s' if errors != 1 else ''}"


def unavailable_reason(evaluation: dict[str, Any]) -> str:
    summary = evaluation.get("summary") or ""
    return summary if summary.startswith("not verified") else f"not verified: {summary or 'no reason given'}"


def all_trials_passed(report: VerifyReport) -> bool:
    trials = report.correctness.trials
    return trials > 0 and report.correctness.passed == trials


def reject_codes(report: VerifyReport | None) -> list[str]:
    """The finding codes behind a reject: the failed trials' code first, then each integrity problem's."""
    if report is None:
        return []
    codes = []
    correctness = report.correctness
    if correctness.passed != correctness.trials:
        codes.append(correctness_code(correctness.worst.reason if correctness.worst else "mismatch"))
    return codes + [problem.code for problem in report.integrity]


def rejected_reason(evaluation: dict[str, Any], report: VerifyReport | None) -> str:
    codes = reject_codes(report)
    if report is not None and codes:
        correctness = report.correctness
        failed = correctness.passed != correctness.trials
        counts = f" (correct {correctness.passed}/{correctness.trials})" if failed else ""
        return f"rejected: {', '.join(codes)}{counts}"
    summary = evaluation.get("summary") or "no report"
    return summary if summary.startswith("rejected") else f"rejected: {summary}"


def unsafe_reason(errors: list[dict[str, Any]]) -> str:
    """'unsafe: line 13: compute-sanitizer memcheck: Invalid __global__ read ... (and 1 more error)'."""
    more = len(errors) - 1
    return f"unsafe: {error_line(errors[0])}" + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


def measured(value: Any) -> float | None:
    """A ratio the worker measured: a finite positive number, else None (the term is left out)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def energy_saving(energy: dict[str, Any] | None) -> float | None:
    """Reference energy per call over the candidate's; above 1 when the candidate uses less."""
    if not energy:
        return None
    candidate = measured(energy.get("candidate_mj_per_call"))
    reference = measured(energy.get("reference_mj_per_call"))
    return reference / candidate if candidate and reference else None


def soft_positive(raw: float) -> float:
    """log2(1 + 2**raw), written so that large raw does not overflow."""
    if raw > 0:
        return raw + math.log2(1 + 2 ** -raw)
    return max(math.log2(1 + 2 ** raw), MIN_VERIFIED_SCORE)


def verified_score(report: VerifyReport, energy: dict[str, Any] | None) -> RubricScore:
    speedups = report.speedup
    eager = measured(speedups.get("eager"))
    if eager is None:
        return RubricScore(UNTIMED_SCORE, reason="verified, not timed", outcome="verified")
    compiled = measured(speedups.get("compile"))
    saving = energy_saving(energy)
    parts = {"eager": W_EAGER * math.log2(eager)}
    if compiled is not None:
        parts["compile"] = W_COMPILE * math.log2(compiled)
    if saving is not None:
        parts["energy"] = W_ENERGY * math.log2(saving)
    raw = sum(parts.values())
    cpu = " (CPU)" if report.device == "cpu" else ""
    reason = f"verified {eager:.3g}× eager{cpu}"
    if compiled is not None:
        reason += f", {compiled:.3g}× compile"
    if saving is not None:
        reason += f", {1 / saving:.3g}× the reference's energy per call"
    return RubricScore(soft_positive(raw), {**parts, "raw": raw}, reason, "verified")
