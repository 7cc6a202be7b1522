"""The rubric: zero with the reason for every reject kind, a positive log-scale score for verified candidates only."""

from __future__ import annotations

import math
from typing import Any

import pytest

from kernel_lsp.agent.rubric import UNTIMED_SCORE, W_COMPILE, W_EAGER, score
from tests.reports import verify_report

COMPILED = {"compiled": True, "errors": 0}


def verified(eager: float | None = 1.0, compile_: float | None = None, **report: Any) -> dict[str, Any]:
    body = verify_report(**{"verdict": "verified", "device": "cuda", "correctness": {"trials": 5, "passed": 5},
                            "integrity": [], "speedup": {"eager": eager, "compile": compile_}, **report})
    return {"compile": COMPILED, "verdict": body["verdict"], "summary": "correct 5/5", "report": body}


def rejected(passed: int = 5, integrity: list[dict[str, str]] | None = None, eager: float = 50.0) -> dict[str, Any]:
    evaluation = verified(eager=eager, compile_=40.0, integrity=integrity or [],
                          correctness={"trials": 5, "passed": passed, "worst": {"reason": "mismatch"}})
    evaluation["verdict"] = evaluation["report"]["verdict"] = "rejected"
    return evaluation


def test_a_compile_failure_scores_zero_and_says_so() -> None:
    result = score({"compile": {"compiled": False, "errors": 2, "first_error": "k.cu(3): error: x undefined\nmore"}})
    assert (result.score, result.outcome) == (0.0, "compile-error")
    assert result.reason == "compile error: k.cu(3): error: x undefined"  # the first line of the first error
    assert score({"compile": {"compiled": False, "errors": 1}}).reason == "compile error: 1 error"


def test_a_candidate_compiled_but_not_verified_scores_zero() -> None:
    result = score({"compile": COMPILED})
    assert (result.score, result.outcome) == (0.0, "unverified")


def test_unavailable_scores_zero_with_the_workers_reason() -> None:
    result = score({"verdict": "unavailable", "summary": "not verified: no GPU", "report": None})
    assert (result.score, result.outcome, result.reason) == (0.0, "unavailable", "not verified: no GPU")


def test_a_mismatch_scores_zero_even_with_a_large_speedup_in_the_report() -> None:
    result = score(rejected(passed=3))
    assert (result.score, result.outcome) == (0.0, "rejected")
    assert result.reason == "rejected: verify-mismatch (correct 3/5)"
    assert result.parts == {}


@pytest.mark.parametrize("code", ["integrity-input-mutated", "integrity-other-stream", "integrity-below-floor",
                                  "integrity-timer-patched", "integrity-no-custom-kernel"])
def test_every_integrity_reject_scores_zero(code: str) -> None:
    result = score(rejected(integrity=[{"code": code, "message": "..."}]))
    assert (result.score, result.outcome, result.reason) == (0.0, "integrity", f"rejected: {code}")


def test_a_run_that_crashed_without_a_report_scores_zero() -> None:
    result = score({"verdict": "rejected", "summary": "rejected: timeout (see problems)", "report": None})
    assert (result.score, result.outcome, result.reason) == (0.0, "rejected", "rejected: timeout (see problems)")


def test_nothing_counts_that_the_worker_did_not_verify() -> None:
    claims_verified = verified(eager=10.0)
    claims_verified["report"]["verdict"] = "rejected"  # the job's verdict and its report disagree: refuse
    assert score(claims_verified).score == 0.0
    integrity_in_verified = verified(eager=10.0, integrity=[{"code": "integrity-thread", "message": "..."}])
    assert score(integrity_in_verified).outcome == "integrity"
    failed_trials = verified(eager=10.0, correctness={"trials": 5, "passed": 4})
    assert score(failed_trials).score == 0.0
    unknown = verified(eager=10.0)
    unknown["verdict"] = "probably fine"
    assert score(unknown).score == 0.0


def test_as_fast_as_the_baselines_scores_one_and_the_formula_holds() -> None:
    assert score(verified(eager=1.0, compile_=1.0)).score == pytest.approx(1.0)
    result = score(verified(eager=2.0, compile_=0.5))
    raw = W_EAGER * 1 + W_COMPILE * -1
    assert result.parts == pytest.approx({"eager": W_EAGER, "compile": -W_COMPILE, "raw": raw})
    assert result.score == pytest.approx(math.log2(1 + 2 ** raw))
    assert result.reason == "verified 2× eager, 0.5× compile"


def test_the_score_rises_with_speed_on_a_log_scale() -> None:
    speeds = [0.01, 0.25, 0.5, 0.9, 1.0, 1.1, 1.5, 2.0, 4.0, 16.0, 1e6]
    scores = [score(verified(eager=s, compile_=s * 0.7)).score for s in speeds]
    assert scores == sorted(scores) and len(set(scores)) == len(scores)
    doubling = score(verified(eager=1024.0)).score - score(verified(eager=512.0)).score
    assert doubling == pytest.approx(W_EAGER, abs=0.01)  # far above the baselines, one doubling adds W_EAGER


def test_a_verified_candidate_slower_than_eager_scores_above_zero_but_below_any_faster_one() -> None:
    slow = score(verified(eager=0.9, compile_=0.9 * 0.6)).score
    barely_faster = score(verified(eager=1.01, compile_=1.01 * 0.6)).score
    assert 0 < slow < barely_faster
    assert 0 < score(verified(eager=1e-300)).score < slow


def test_a_verified_candidate_that_was_not_timed_sits_between_rejects_and_eager_speed() -> None:
    result = score(verified(eager=None))
    assert (result.score, result.reason, result.outcome) == (UNTIMED_SCORE, "verified, not timed", "verified")
    assert 0 < result.score < score(verified(eager=1.0)).score


def test_a_speedup_that_is_not_a_finite_positive_number_is_left_out() -> None:
    for bogus in (float("nan"), float("inf"), -2.0, 0, "3.0", True):
        assert "compile" not in score(verified(eager=1.5, compile_=bogus)).parts


def test_the_energy_term_counts_when_both_energies_are_present() -> None:
    frugal = verified(eager=1.0, compile_=1.0)
    frugal["energy"] = {"candidate_mj_per_call": 5.0, "reference_mj_per_call": 10.0}
    result = score(frugal)
    assert result.parts["energy"] > 0 and result.score > score(verified(eager=1.0, compile_=1.0)).score
    assert "0.5× the reference's energy per call" in result.reason
    half = verified(eager=1.0)
    half["energy"] = {"candidate_mj_per_call": 5.0, "reference_mj_per_call": None}
    assert "energy" not in score(half).parts


def test_cpu_speedups_are_marked_as_such() -> None:
    assert score(verified(eager=1.4, device="cpu")).reason == "verified 1.4× eager (CPU)"
