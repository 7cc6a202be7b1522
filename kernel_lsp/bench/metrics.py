"""KernelBench's metrics over one bench run: fast_p, geometric mean speedups, verdict counts.

fast_p (KernelBench): the fraction of ALL problems in the run that are verified correct and have a speedup
greater than p over the baseline; fast_0 is the correct rate. Where the verdict states the speedup's 95% interval
(verify/run.py measure), only a speedup whose whole interval lies above p counts: a difference the rounds could
not tell from noise is no speedup, and `not_significant` says how many such speedups over 1x were left out.
Pure functions, no torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

FAST_P_THRESHOLDS = (0.0, 1.0, 1.5, 2.0)
VERDICTS = ("verified", "rejected", "unavailable")


@dataclass(frozen=True)
class ProblemResult:
    """One candidate's outcome; `report` is the job's full VerifyReport (None when the run itself failed)."""

    candidate: str
    reference: str
    level: int | None
    problem_id: int | None
    name: str
    verdict: str  # verified | rejected | unavailable
    device: str | None = None
    speedup: dict[str, float | None] = field(default_factory=dict)  # baseline -> candidate's speedup over it
    interval: dict[str, list[float] | None] = field(default_factory=dict)  # baseline -> its 95% interval
    candidate_ms: float | None = None
    reason: str | None = None  # why it was rejected or could not be verified
    summary: str | None = None  # the code lens line
    report: dict[str, Any] | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        return self.verdict == "verified"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProblemResult:
        return cls(**data)


@dataclass(frozen=True)
class GeometricMean:
    value: float | None  # None when no correct problem has a speedup for this baseline
    over: int  # how many correct problems it is taken over


@dataclass(frozen=True)
class BenchMetrics:
    problems: int
    counts: dict[str, int]  # verdict -> how many
    fast_p: dict[str, dict[float, float | None]]  # baseline -> p -> fraction
    geomean: dict[str, GeometricMean]  # baseline -> geometric mean speedup over correct problems
    not_significant: dict[str, int] = field(default_factory=dict)  # baseline -> speedups > 1x not counted

    def to_dict(self) -> dict[str, Any]:
        return {"problems": self.problems, "counts": dict(self.counts),
                "fast_p": {b: {_p_key(p): v for p, v in by_p.items()} for b, by_p in self.fast_p.items()},
                "geomean_speedup": {b: asdict(g) for b, g in self.geomean.items()},
                "not_significant": dict(self.not_significant)}


def fast_p(results: list[ProblemResult], baseline: str, p: float) -> float | None:
    """Fraction of all problems verified correct with speedup > p; None for an empty run."""
    if not results:
        return None
    if p == 0:
        hits = sum(r.correct for r in results)  # a correct kernel's speedup is always > 0, timed or not
    else:
        hits = sum(r.correct and faster_than(r, baseline, p) for r in results)
    return hits / len(results)


def faster_than(result: ProblemResult, baseline: str, p: float) -> bool:
    """The speedup is over p, and so is its whole interval where the verdict states one."""
    interval = result.interval.get(baseline)
    above = (result.speedup.get(baseline) or 0.0) > p
    return above and (not interval or interval[0] > p)


def not_significant(results: list[ProblemResult], baseline: str) -> int:
    """Correct problems whose speedup is over 1x but whose interval holds 1x: not counted in fast_p."""
    return sum(r.correct and (r.speedup.get(baseline) or 0.0) > 1 and not faster_than(r, baseline, 1.0)
               for r in results)


def geometric_mean_speedup(results: list[ProblemResult], baseline: str) -> GeometricMean:
    speedups = [r.speedup[baseline] for r in results if r.correct and (r.speedup.get(baseline) or 0) > 0]
    if not speedups:
        return GeometricMean(None, 0)
    return GeometricMean(math.exp(sum(math.log(s) for s in speedups) / len(speedups)), len(speedups))


def verdict_counts(results: list[ProblemResult]) -> dict[str, int]:
    return {verdict: sum(r.verdict == verdict for r in results) for verdict in VERDICTS}


def bench_metrics(results: list[ProblemResult], baselines: list[str],
                  thresholds: tuple[float, ...] = FAST_P_THRESHOLDS) -> BenchMetrics:
    return BenchMetrics(
        problems=len(results),
        counts=verdict_counts(results),
        fast_p={b: {p: fast_p(results, b, p) for p in thresholds} for b in baselines},
        geomean={b: geometric_mean_speedup(results, b) for b in baselines},
        not_significant={b: not_significant(results, b) for b in baselines},
    )


def fast_p_curve(results: list[ProblemResult], baseline: str) -> list[tuple[float, float]]:
    """(p, fast_p) at 0 and at every speedup of a correct problem: the steps of the curve, p ascending."""
    steps = sorted({0.0, *(r.speedup[baseline] for r in results if r.correct and r.speedup.get(baseline))})
    return [(p, fast_p(results, baseline, p) or 0.0) for p in steps]


def _p_key(p: float) -> str:
    return f"{p:g}"  # "0", "1", "1.5", "2": JSON keys as a reader writes them
