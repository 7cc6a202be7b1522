"""A campaign's table as the papers report theirs, one row per KernelBench level (and L1+L2, and all):

- fast_0 (correct), fast_1, fast_1.5 and fast_2 against eager PyTorch and against torch.compile, as fractions of the
  level's problems (KernelBench; CUDA Agent's "faster than compile" per level is fast_1 against compile). A speedup
  counts only where the verifier's 95% interval lies wholly above p (bench/metrics.py faster_than);
- the geometric mean speedup with every failure counted as 1x (over all the level's problems, as KernelPro reports
  it), and over the correct problems only;
- the arithmetic mean speedup over the correct problems (CuTeGen's figure, which it gives over L1+L2);
- tokens and dollars per solved (correct) problem.

Speedups timed on the CPU (Triton's interpreter, eager PyTorch on the CPU) say nothing of a GPU: a correct problem
whose speedups are not comparable (`speedup_comparable` false) counts in fast_0 alone, as 1x in the geomean over all
problems, and nowhere else; `cpu_timed` says how many, and the table, its text and its plot say so beside the
figures. Pure functions, no torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kernel_lsp.bench.metrics import FAST_P_THRESHOLDS, ProblemResult, _p_key, faster_than
from kernel_lsp.bench.report import aligned

P_KEYS = tuple(_p_key(p) for p in FAST_P_THRESHOLDS)  # "0", "1", "1.5", "2": the keys of LevelFigures.fast
BOTH_LOW_LEVELS = "L1+L2"
ALL = "all"


@dataclass(frozen=True)
class LevelFigures:
    level: str  # "1", "2", "3", "other" (no level in its path), "L1+L2", "all"
    problems: int
    correct: int
    cpu_timed: int  # correct problems whose speedups were timed on the CPU: in fast_0 only
    fast: dict[str, dict[str, float]]  # baseline -> p ("0", "1", "1.5", "2") -> fraction of the level's problems
    geomean_all: dict[str, float | None]  # baseline -> geometric mean, every failure (and untimed) as 1x
    geomean_correct: dict[str, float | None]  # baseline -> geometric mean over the correct, GPU-timed problems
    mean_correct: dict[str, float | None]  # baseline -> arithmetic mean over the same (CuTeGen)
    tokens: int
    dollars: float
    tokens_per_solved: float | None
    dollars_per_solved: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_speedup(result: ProblemResult, baseline: str) -> float | None:
    """The problem's speedup over `baseline` when it is correct and comparable (timed on a GPU); None otherwise."""
    value = result.speedup.get(baseline)
    if not result.compared or not value or value <= 0:
        return None
    return float(value)


def level_figures(level: str, results: list[ProblemResult], costs: list[dict[str, Any]],
                  baselines: list[str]) -> LevelFigures:
    """The figures of one row over `results`, with `costs` their passes' spend (model_calls, tokens, dollars)."""
    count = len(results)
    correct = sum(r.correct for r in results)
    fast: dict[str, dict[str, float]] = {}
    geomean_all: dict[str, float | None] = {}
    geomean_correct: dict[str, float | None] = {}
    mean_correct: dict[str, float | None] = {}
    for baseline in baselines:
        speedups = [gpu_speedup(r, baseline) for r in results]
        timed = [s for s in speedups if s is not None]
        fast[baseline] = {key: sum(r.correct if p == 0 else s is not None and faster_than(r, baseline, p)
                                   for r, s in zip(results, speedups)) / count if count else 0.0
                          for key, p in zip(P_KEYS, FAST_P_THRESHOLDS)}
        geomean_all[baseline] = _geomean([s if s is not None else 1.0 for s in speedups]) if count else None
        geomean_correct[baseline] = _geomean(timed) if timed else None
        mean_correct[baseline] = sum(timed) / len(timed) if timed else None
    tokens = int(sum(c.get("tokens", c.get("input_tokens", 0) + c.get("output_tokens", 0)) for c in costs))
    dollars = float(sum(c.get("dollars", 0.0) for c in costs))
    return LevelFigures(level=level, problems=count, correct=correct,
                        cpu_timed=sum(r.correct and not r.speedup_comparable for r in results), fast=fast,
                        geomean_all=geomean_all, geomean_correct=geomean_correct, mean_correct=mean_correct,
                        tokens=tokens, dollars=round(dollars, 6),
                        tokens_per_solved=tokens / correct if correct else None,
                        dollars_per_solved=dollars / correct if correct else None)


def level_table(results: list[ProblemResult], costs: list[dict[str, Any]],
                baselines: list[str]) -> list[LevelFigures]:
    """One row per level present (in order; problems without one as "other"), then L1+L2 where both low levels
    are present, then all of them."""
    if len(costs) != len(results):
        raise ValueError(f"{len(results)} results but {len(costs)} costs")
    by_level: dict[str, list[int]] = {}
    for index, result in enumerate(results):
        by_level.setdefault(str(result.level) if result.level is not None else "other", []).append(index)
    order = sorted((name for name in by_level if name.isdigit()), key=int) + (["other"] if "other" in by_level else [])

    def row(name: str, indices: list[int]) -> LevelFigures:
        return level_figures(name, [results[i] for i in indices], [costs[i] for i in indices], baselines)

    rows = [row(name, by_level[name]) for name in order]
    if "1" in by_level and "2" in by_level:
        rows.append(row(BOTH_LOW_LEVELS, by_level["1"] + by_level["2"]))
    if len(order) > 1:
        rows.append(row(ALL, list(range(len(results)))))
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# ---- as text, Markdown and a plot ---------------------------------------------------------------------------


def _share(value: float) -> str:
    return f"{100 * value:.0f}%"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def table_rows(rows: list[LevelFigures], baseline: str) -> list[list[str]]:
    """The rows against one baseline: a header, then one per level."""
    header = ["level", "problems", *(f"fast_{key}" for key in P_KEYS), "geomean (fail=1x)", "geomean (correct)",
              "mean (correct)"]
    body = [[row.level, str(row.problems), *(_share(row.fast[baseline][key]) for key in P_KEYS),
             _times(row.geomean_all[baseline]), _times(row.geomean_correct[baseline]),
             _times(row.mean_correct[baseline])] for row in rows]
    return [header, *body]


def cost_rows(rows: list[LevelFigures]) -> list[list[str]]:
    return [["level", "solved", "tokens", "dollars", "tokens/solved", "$/solved"],
            *([row.level, str(row.correct), _count(row.tokens), _money(row.dollars), _count(row.tokens_per_solved),
               _money(row.dollars_per_solved)] for row in rows)]


BASELINE_WORDS = {"eager": "eager PyTorch", "compile": "torch.compile"}
CPU_TIMED_NOTE = ("{n} correct problem(s) were timed on the CPU (Triton's interpreter): their speedups are not "
                  "comparable, so they count in fast_0 and as 1x in the geomean over all problems, and in no other "
                  "column")
CPU_TIMED_PLOT = "{n} correct problem(s) timed on the CPU: speedups not comparable, in fast_0 only"


def cpu_timed(rows: list[LevelFigures]) -> int:
    """Correct problems whose speedups were not comparable, each counted once (in its level's row)."""
    return sum(row.cpu_timed for row in rows if row.level not in (BOTH_LOW_LEVELS, ALL))


def papers_markdown(rows: list[LevelFigures], baselines: list[str]) -> str:
    """The table as Markdown: one table per baseline, then the cost."""
    parts = ["# Campaign, per level", ""]
    for baseline in baselines:
        parts += [f"## Against {BASELINE_WORDS.get(baseline, baseline)}", "", *_markdown(table_rows(rows, baseline)),
                  ""]
    parts += ["## Cost", "", *_markdown(cost_rows(rows)), ""]
    parts.append("fast_p: the share of the level's problems verified correct with a speedup over p whose 95% interval "
                 "lies wholly above p. geomean (fail=1x): over every problem, a failure counted as 1x. mean "
                 "(correct): the arithmetic mean over the correct problems (CuTeGen's figure over L1+L2).")
    cpu = cpu_timed(rows)
    if cpu:
        parts += ["", CPU_TIMED_NOTE.format(n=cpu) + "."]
    return "\n".join(parts) + "\n"


def papers_text(rows: list[LevelFigures], baselines: list[str]) -> list[str]:
    """The table as aligned text lines (the CLI's)."""
    lines: list[str] = []
    for baseline in baselines:
        lines += [f"per level, against {BASELINE_WORDS.get(baseline, baseline)}:", *aligned(table_rows(rows, baseline))]
    lines += ["cost per level:", *aligned(cost_rows(rows))]
    cpu = cpu_timed(rows)
    if cpu:
        lines.append(CPU_TIMED_NOTE.format(n=cpu))
    return lines


def _markdown(table: list[list[str]]) -> list[str]:
    header, *body = table
    return ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|",
            *("| " + " | ".join(cells) + " |" for cells in body)]


PLOT_WIDTH, PLOT_HEIGHT, PLOT_MARGIN = 720, 280, 48
PLOT_COLORS = {("eager", "1"): "#3b6fb6", ("eager", "2"): "#9bb7e0", ("compile", "1"): "#d9822b",
               ("compile", "2"): "#efc08f"}


def papers_svg(rows: list[LevelFigures], baselines: list[str]) -> str:
    """Per level: fast_0 (grey), then fast_1 and fast_2 against each baseline, as bars from 0 to 100%; under them,
    in red, how many correct problems' speedups were not comparable (their bars beyond fast_0 are not measured)."""
    series = [("0", None)] + [(p, baseline) for baseline in baselines for p in ("1", "2")]
    width, height = PLOT_WIDTH - 2 * PLOT_MARGIN, PLOT_HEIGHT - 2 * PLOT_MARGIN
    slot = width / max(len(rows), 1)
    bar = slot * 0.8 / len(series)
    shapes = [f"<text x='4' y='{PLOT_MARGIN + height * (1 - f) + 4:.1f}'>{100 * f:.0f}%</text>" for f in (0, 0.5, 1)]
    for i, row in enumerate(rows):
        x0 = PLOT_MARGIN + i * slot + slot * 0.1
        for j, (p, baseline) in enumerate(series):
            value = row.fast[baseline or baselines[0]][p] if baselines else row.correct / max(row.problems, 1)
            color = "#888" if baseline is None else PLOT_COLORS.get((baseline, p), "#555")
            top = PLOT_MARGIN + height * (1 - value)
            label = "fast_0" if baseline is None else f"fast_{p} vs {baseline}"
            shapes.append(f"<rect x='{x0 + j * bar:.1f}' y='{top:.1f}' width='{bar * 0.92:.1f}' "
                          f"height='{max(PLOT_MARGIN + height - top, 0.5):.1f}' fill='{color}'>"
                          f"<title>level {row.level}: {label} {100 * value:.0f}%</title></rect>")
        shapes.append(f"<text x='{x0:.1f}' y='{PLOT_HEIGHT - PLOT_MARGIN + 16:.1f}'>level {row.level}</text>")
    legend_x = PLOT_WIDTH - PLOT_MARGIN - 150
    for k, (p, baseline) in enumerate(series):
        color = "#888" if baseline is None else PLOT_COLORS.get((baseline, p), "#555")
        label = "fast_0 (correct)" if baseline is None else f"fast_{p} vs {baseline}"
        shapes.append(f"<rect x='{legend_x}' y='{6 + 13 * k}' width='10' height='10' fill='{color}'/>"
                      f"<text x='{legend_x + 15}' y='{15 + 13 * k}'>{label}</text>")
    cpu = cpu_timed(rows)
    if cpu:
        shapes.append(f"<text x='{PLOT_MARGIN}' y='{PLOT_HEIGHT - 6}' fill='#b3261e' font-weight='bold'>"
                      f"{CPU_TIMED_PLOT.format(n=cpu)}</text>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{PLOT_WIDTH}' height='{PLOT_HEIGHT}' "
            f"viewBox='0 0 {PLOT_WIDTH} {PLOT_HEIGHT}' font-size='11'>"
            f"<rect x='{PLOT_MARGIN}' y='{PLOT_MARGIN}' width='{width}' height='{height}' fill='none' stroke='#ccc'/>"
            f"{''.join(shapes)}</svg>")
