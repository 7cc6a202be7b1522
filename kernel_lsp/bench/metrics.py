"""KernelBench's metrics over one bench run: fast_p, geometric mean speedups, verdict counts.

fast_p (KernelBench): the fraction of ALL problems in the run that are verified correct and have a speedup
greater than p over the baseline; fast_0 is the correct rate. Where the verdict states the speedup's 95% interval
(verify/run.py measure), only a speedup whose whole interval lies above p counts: a difference the rounds could
not tell from noise is no speedup, and `not_significant` says how many such speedups over 1x were left out.
A problem whose speedups are not comparable (timed on the CPU: `speedup_comparable` false, as its VerifyReport's)
counts in fast_0 alone, and in no geometric mean; `not_comparable` says how many there were.
Pure functions, no torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, get_args

from kernel_lsp.contracts.job_metrics import Verdict
from kernel_lsp.contracts.verify_report import not_comparable_on

FAST_P_THRESHOLDS = (0.0, 1.0, 1.5, 2.0)
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)  # a verify job's verdicts, in the order the counts show them
NOT_COMPARABLE = ("speedups timed on the CPU are not comparable: those problems count in fast_0 alone and in no "
                  "geometric mean, and no speedup of theirs is shown")


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
    speedup_comparable: bool = True  # false: `speedup` and `interval` are no GPU figures (timed on the CPU)
    not_comparable_reason: str | None = None  # why not; None when speedup_comparable

    def __post_init__(self) -> None:
        # from where it ran, as a VerifyReport's marking: bench.json files written before the fields are marked too
        reason = not_comparable_on(self.device)
        object.__setattr__(self, "speedup_comparable", reason is None)
        object.__setattr__(self, "not_comparable_reason", reason)

    @property
    def correct(self) -> bool:
        return self.verdict == "verified"

    @property
    def compared(self) -> bool:
        """Verified, with speedups that may stand beside a GPU's: the problems whose speedups enter the figures."""
        return self.correct and self.speedup_comparable

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
    not_comparable: int = 0  # correct problems whose speedups are not comparable: in fast_0 only

    @property
    def speedup_comparable(self) -> bool:
        """Every correct problem's speedups entered the figures (none was timed on the CPU)."""
        return self.not_comparable == 0

    @property
    def figures(self) -> bool:
        """fast_p beyond 0 and the geometric means say something of the run: some correct problem's speedups are
        comparable, or none was left out (an all-CPU run's would be zeros and blanks that read as measured)."""
        return self.speedup_comparable or self.counts.get("verified", 0) > self.not_comparable

    def to_dict(self) -> dict[str, Any]:
        return {"problems": self.problems, "counts": dict(self.counts),
                "fast_p": {b: {_p_key(p): v for p, v in by_p.items()} for b, by_p in self.fast_p.items()},
                "geomean_speedup": {b: asdict(g) for b, g in self.geomean.items()},
                "not_significant": dict(self.not_significant),
                "speedup_comparable": self.speedup_comparable, "not_comparable": self.not_comparable,
                "not_comparable_reason": NOT_COMPARABLE if self.not_comparable else None}


def fast_p(results: list[ProblemResult], baseline: str, p: float) -> float | None:
    """Fraction of all problems verified correct with speedup > p (a comparable one, for p > 0); None for an empty
    run."""
    if not results:
        return None
    if p == 0:
        hits = sum(r.correct for r in results)  # a correct kernel's speedup is always > 0, timed or not
    else:
        hits = sum(r.compared and faster_than(r, baseline, p) for r in results)
    return hits / len(results)


def faster_than(result: ProblemResult, baseline: str, p: float) -> bool:
    """The speedup is over p, and so is its whole interval where the verdict states one."""
    interval = result.interval.get(baseline)
    above = (result.speedup.get(baseline) or 0.0) > p
    return above and (not interval or interval[0] > p)


def not_significant(results: list[ProblemResult], baseline: str) -> int:
    """Correct problems whose comparable speedup is over 1x but whose interval holds 1x: not counted in fast_p."""
    return sum(r.compared and (r.speedup.get(baseline) or 0.0) > 1 and not faster_than(r, baseline, 1.0)
               for r in results)


def geometric_mean_speedup(results: list[ProblemResult], baseline: str) -> GeometricMean:
    speedups = [r.speedup[baseline] for r in results if r.compared and (r.speedup.get(baseline) or 0) > 0]
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
        not_comparable=sum(r.correct and not r.speedup_comparable for r in results),
    )


def fast_p_curve(results: list[ProblemResult], baseline: str) -> list[tuple[float, float]]:
    """(p, fast_p) at 0 and at every comparable speedup of a correct problem: the steps of the curve, p
    ascending."""
    steps = sorted({0.0, *(r.speedup[baseline] for r in results if r.compared and r.speedup.get(baseline))})
    return [(p, fast_p(results, baseline, p) or 0.0) for p in steps]


def _p_key(p: float) -> str:
    return f"{p:g}"  # "0", "1", "1.5", "2": JSON keys as a reader writes them
