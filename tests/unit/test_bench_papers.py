"""The campaign's table per level as the papers report it (kernel_lsp/bench/papers.py): fast_p against each baseline
with significant speedups only, the geomean with failures as 1x and over the correct, CuTeGen's mean over L1+L2,
the cost per solved problem, and CPU timings kept out of every speedup column."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree

import pytest

from kernel_lsp.bench.metrics import ProblemResult
from kernel_lsp.bench.papers import level_table, papers_markdown, papers_svg, papers_text, table_rows


def result(level, verdict="verified", eager=None, compile_=None, device="cuda", interval=None) -> ProblemResult:
    speedup = {k: v for k, v in (("eager", eager), ("compile", compile_)) if v is not None}
    return ProblemResult(candidate="c.py", reference="r.py", level=level, problem_id=1, name="p", verdict=verdict,
                         device=device if verdict == "verified" else None, speedup=speedup,
                         interval=interval or {})


def cost(dollars: float, tokens: int) -> dict:
    return {"dollars": dollars, "tokens": tokens, "model_calls": 3}


RESULTS = [
    result(1, eager=3.0, compile_=2.5),  # fast_2 against both
    result(1, eager=1.2, compile_=0.8, interval={"eager": [1.1, 1.3], "compile": [0.7, 0.9]}),
    result(1, eager=1.05, compile_=1.02, interval={"eager": [0.98, 1.12], "compile": [0.9, 1.1]}),  # not significant
    result(1, verdict="rejected"),
    result(2, eager=2.0, compile_=1.6),
    result(2, verdict="unavailable"),
    result(2, eager=40.0, compile_=30.0, device="cpu"),  # the interpreter's ratio: in fast_0 only
    result(3, eager=0.5, compile_=0.4),
]
COSTS = [cost(1.0, 1000), cost(1.0, 1000), cost(1.0, 1000), cost(2.0, 3000), cost(0.5, 500), cost(0.5, 500),
         cost(1.0, 1000), cost(4.0, 8000)]


def by_level():
    return {row.level: row for row in level_table(RESULTS, COSTS, ["eager", "compile"])}


def test_each_level_then_l1_l2_then_all():
    rows = level_table(RESULTS, COSTS, ["eager", "compile"])
    assert [row.level for row in rows] == ["1", "2", "3", "L1+L2", "all"]
    assert [(row.problems, row.correct, row.cpu_timed) for row in rows] == [
        (4, 3, 0), (3, 2, 1), (1, 1, 0), (7, 5, 1), (8, 6, 1)]


def test_fast_p_counts_significant_gpu_speedups_over_all_the_levels_problems():
    one = by_level()["1"]
    assert one.fast["eager"] == {"0": 0.75, "1": 0.5, "1.5": 0.25, "2": 0.25}  # 1.05x (interval holds 1x) is out
    assert one.fast["compile"] == {"0": 0.75, "1": 0.25, "1.5": 0.25, "2": 0.25}
    two = by_level()["2"]
    assert two.fast["eager"] == pytest.approx({"0": 2 / 3, "1": 1 / 3, "1.5": 1 / 3, "2": 0.0})  # 2.0 is not > 2
    assert by_level()["3"].fast["eager"]["1"] == 0.0


def test_the_geomeans_and_the_mean_keep_cpu_timings_out():
    two = by_level()["2"]
    assert two.geomean_correct["eager"] == pytest.approx(2.0)  # the CPU's 40x is not a GPU speedup
    assert two.geomean_all["eager"] == pytest.approx(2.0 ** (1 / 3))  # failure and CPU-timed as 1x
    assert two.mean_correct["eager"] == pytest.approx(2.0)
    low = by_level()["L1+L2"]
    timed = [3.0, 1.2, 1.05, 2.0]
    assert low.mean_correct["eager"] == pytest.approx(sum(timed) / 4)  # CuTeGen's mean over L1+L2
    assert low.geomean_correct["eager"] == pytest.approx(math.prod(timed) ** (1 / 4))
    assert low.geomean_all["eager"] == pytest.approx(math.prod(timed) ** (1 / 7))


def test_cost_per_solved_problem():
    one, three, every = by_level()["1"], by_level()["3"], by_level()["all"]
    assert (one.tokens, one.dollars, one.tokens_per_solved, one.dollars_per_solved) == (6000, 5.0, 2000, 5.0 / 3)
    assert (three.tokens_per_solved, three.dollars_per_solved) == (8000, 4.0)
    assert every.dollars == pytest.approx(11.0) and every.dollars_per_solved == pytest.approx(11.0 / 6)
    none = level_table([result(1, verdict="rejected")], [cost(2.0, 10)], ["eager"])[0]
    assert none.dollars_per_solved is None and none.tokens_per_solved is None and none.geomean_correct["eager"] is None
    with pytest.raises(ValueError):
        level_table(RESULTS, COSTS[:2], ["eager"])


def test_one_level_alone_gets_no_summary_rows_and_problems_without_a_level_are_other():
    assert [row.level for row in level_table(RESULTS[:4], COSTS[:4], ["eager"])] == ["1"]
    rows = level_table([result(None, eager=2.0), result(3, eager=1.0)], [cost(1, 1), cost(1, 1)], ["eager"])
    assert [row.level for row in rows] == ["3", "other", "all"]


def test_markdown_text_and_plot():
    rows = level_table(RESULTS, COSTS, ["eager", "compile"])
    markdown = papers_markdown(rows, ["eager", "compile"])
    assert "## Against eager PyTorch" in markdown and "## Against torch.compile" in markdown
    assert "| 1 | 4 | 75% | 50% | 25% | 25% |" in markdown
    assert "1 correct problem(s) were timed on the CPU" in markdown
    assert table_rows(rows, "eager")[0][:6] == ["level", "problems", "fast_0", "fast_1", "fast_1.5", "fast_2"]
    text = papers_text(rows, ["eager", "compile"])
    assert text[0] == "per level, against eager PyTorch:" and any(line.startswith("L1+L2") for line in text)
    svg = ElementTree.fromstring(papers_svg(rows, ["eager", "compile"]))
    bars = [e for e in svg.iter() if e.tag.endswith("rect") and e.find("{http://www.w3.org/2000/svg}title") is not None]
    assert len(bars) == 5 * len(rows)  # fast_0, then fast_1 and fast_2 against each baseline, per row
    titles = [bar.find("{http://www.w3.org/2000/svg}title").text for bar in bars]
    assert "level 1: fast_1 vs eager 50%" in titles and "level 1: fast_0 75%" in titles
    note = "1 correct problem(s) timed on the CPU: speedups not comparable, in fast_0 only"
    assert note in "".join(svg.itertext())  # the plot says so beside its bars
    assert "timed on the CPU" not in papers_svg(level_table(RESULTS[:6], COSTS[:6], ["eager"]), ["eager"])
