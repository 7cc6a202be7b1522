"""A bench run as a text table, as bench.json (everything) and as bench.html (one file, plots as inline SVG).

Speedups that are not comparable (timed on the CPU: a problem's `speedup_comparable` false) are shown nowhere as
figures: their rows say "cpu", the summary says why (NOT_SHOWN), and the figures and plots leave them out (fast_0
alone counts them); with no other correct problem, the figures and plots are left out whole. bench.json keeps
the ratios, each problem and the metrics marked."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from kernel_lsp.bench.metrics import BenchMetrics, ProblemResult, fast_p_curve

COLORS = {"eager": "#3b6fb6", "compile": "#d9822b"}
SVG_WIDTH, SVG_HEIGHT, MARGIN = 720, 260, 48
NOTE_CHARS = 100  # the text table's reason column is cut here; bench.json and bench.html keep it whole


# ---- text ----------------------------------------------------------------------------------------------------


def text_report(results: list[ProblemResult], metrics: BenchMetrics) -> str:
    baselines = list(metrics.fast_p)
    header = ["level", "id", "name", "verdict", "device", "ms", *(f"x{b}" for b in baselines), "note"]
    rows = [[_or_dash(r.level), _or_dash(r.problem_id), r.name, r.verdict, r.device or "-",
             *_timed(r.speedup_comparable, [r.candidate_ms, *(r.speedup.get(b) for b in baselines)]),
             _cut(r.reason or "")] for r in results]
    return "\n".join(aligned([header, *rows]) + [""] + metrics_lines(metrics, "candidate"))


def _timed(comparable: bool, figures: list[float | None]) -> list[str]:
    """A row's time and speedups; those that are not comparable show as "cpu" (bench.json keeps them, marked)."""
    return [_number(value) if comparable or value is None else "cpu" for value in figures]


NOT_SHOWN = ("timed on the CPU (Triton's interpreter, eager PyTorch on the CPU): times and speedups say nothing of a "
             "GPU and vary between runs, so none are shown and none enter fast_p beyond fast_0 or a geometric mean; "
             "the JSON keeps them, marked \"speedup_comparable\": false")


def metrics_lines(metrics: BenchMetrics, noun: str) -> list[str]:
    """The verdict counts, the fast_p table and the geometric means, under a run's table; where speedups were
    not comparable, a note, and the figures only when other problems' speedups are in them."""
    baselines = list(metrics.fast_p)
    counts = metrics.counts
    lines = [f"{metrics.problems} {noun}{'s' if metrics.problems != 1 else ''}: {counts['verified']} verified, "
             f"{counts['rejected']} rejected, {counts['unavailable']} unavailable"]
    if not metrics.speedup_comparable:
        lines.append(f"{metrics.not_comparable} correct {noun}{'s' if metrics.not_comparable != 1 else ''} "
                     + NOT_SHOWN)
    if baselines and metrics.figures:
        thresholds = list(next(iter(metrics.fast_p.values())))
        table = [["fast_p", *(f"p={p:g}" for p in thresholds)]]
        table += [[f"vs {b}", *(_number(v) for v in metrics.fast_p[b].values())] for b in baselines]
        lines += aligned(table)
        lines += [f"geomean speedup vs {b}: {_geomean_text(metrics, b)}" for b in baselines]
        lines += [f"not counted in fast_p vs {b}: {count} speedup{'s' if count != 1 else ''} over 1x whose 95% "
                  f"interval holds 1x (no significant difference)"
                  for b, count in metrics.not_significant.items() if count]
    return lines


def campaign_text(rows: list[dict[str, Any]], metrics: BenchMetrics, totals: dict[str, Any]) -> str:
    """An agent campaign (kernel_lsp.agent.campaign): per problem the best verified candidate's time, speedups and
    energy, its passes and their cost; then fast_p, the geometric means and the total cost."""
    baselines = list(metrics.fast_p)
    header = ["level", "id", "name", "status", "verdict", "ms", *(f"x{b}" for b in baselines), "mJ", "passes",
              "calls", "tokens", "$", "note"]
    table = [[_or_dash(r["level"]), _or_dash(r["problem_id"]), r["name"], r["status"], r["verdict"],
              *_timed(r["speedup_comparable"], [r["ms"], *(r["speedup"].get(b) for b in baselines)]),
              _number(r["energy_mj"]),
              str(r["passes"]), str(r["cost"]["model_calls"]), str(r["cost"]["tokens"]),
              f"{r['cost']['dollars']:.2f}", _cut(r["reason"] or "")] for r in rows]
    lines = aligned([header, *table]) + [""] + metrics_lines(metrics, "problem")
    lines.append(f"cost: {totals['model_calls']} model calls, {totals['tokens']} tokens ({totals['input_tokens']} in, "
                 f"{totals['output_tokens']} out), ${totals['dollars']:.2f}, {totals['evaluations']} evaluation"
                 f"{'s' if totals['evaluations'] != 1 else ''}, "
                 f"{totals['campaign_wall_s']:.0f} s")
    return "\n".join(lines)


def aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _geomean_text(metrics: BenchMetrics, baseline: str) -> str:
    mean = metrics.geomean[baseline]
    if mean.value is None:
        return "- (no correct candidate was timed against it)"
    return f"{mean.value:.3g}x over {mean.over} correct candidate{'s' if mean.over != 1 else ''}"


def _cut(text: str) -> str:
    return text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS - 1] + "…"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


# ---- JSON ----------------------------------------------------------------------------------------------------


def bench_json(results: list[ProblemResult], metrics: BenchMetrics, run: dict[str, Any]) -> dict[str, Any]:
    """Everything about the run: its options, the metrics, and each problem with its full VerifyReport."""
    return {"run": run, "metrics": metrics.to_dict(), "problems": [r.to_dict() for r in results]}


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")


def read_results(path: Path) -> list[ProblemResult]:
    return [ProblemResult.from_dict(p) for p in json.loads(path.read_text(encoding="utf-8"))["problems"]]


# ---- HTML ----------------------------------------------------------------------------------------------------

_STYLE = """body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}
td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}td.n{text-align:right}
.verified{color:#17813b}.rejected{color:#b3261e}.unavailable{color:#777}svg{display:block;margin:1em 0}
.not-comparable{font-weight:bold;color:#b3261e;border:2px solid #b3261e;padding:6px 10px}"""


def html_report(results: list[ProblemResult], metrics: BenchMetrics, run: dict[str, Any]) -> str:
    """The page: the run, the metrics, the plots and a row per problem; speedups that are not comparable leave
    the figures and plots, and a boxed sentence says so."""
    title = f"kernel-lsp bench: {run.get('folder', '')}"
    baselines = list(metrics.fast_p)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>",
             f"<style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>",
             f"<p>{_e(_run_line(run))}</p>", *_metrics_html(metrics)]
    if metrics.figures:
        parts += ["<h2>Speedup per problem</h2>", speedup_bars_svg(results, baselines),
                  "<h2>fast_p</h2>", fast_p_svg(results, baselines)]
    parts += ["<h2>Problems</h2>", _problems_table(results, baselines), "</body></html>"]
    return "\n".join(parts)


def _run_line(run: dict[str, Any]) -> str:
    keys = ("device", "trials", "timed_calls", "baselines", "backend", "worker", "parallel", "workerDevice",
            "started_at", "duration_s")
    return " · ".join(f"{k}: {run[k]}" for k in keys if k in run)


def _metrics_html(metrics: BenchMetrics) -> list[str]:
    counts = ", ".join(f"{n} {verdict}" for verdict, n in metrics.counts.items())
    parts = [f"<p>{metrics.problems} problems: {_e(counts)}</p>"]
    if not metrics.speedup_comparable:
        parts.append(f"<p class='not-comparable'>Speedups not comparable: {metrics.not_comparable} correct "
                     f"problem{'s' if metrics.not_comparable != 1 else ''} {_e(NOT_SHOWN)}.</p>")
    if not metrics.figures:
        return parts
    rows = [f"<tr><th>vs {_e(b)}</th>" + "".join(f"<td class='n'>{_number(v)}</td>" for v in by_p.values())
            + f"<td>{_e(_geomean_text(metrics, b))}</td></tr>" for b, by_p in metrics.fast_p.items()]
    thresholds = next(iter(metrics.fast_p.values()), {})
    head = "<tr><th></th>" + "".join(f"<th>fast_{p:g}</th>" for p in thresholds) + "<th>geomean speedup</th></tr>"
    return [*parts, f"<table>{head}{''.join(rows)}</table>"]


def _problems_table(results: list[ProblemResult], baselines: list[str]) -> str:
    head = ("<tr><th>level</th><th>id</th><th>name</th><th>verdict</th><th>device</th><th>ms</th>"
            + "".join(f"<th>× {_e(b)}</th>" for b in baselines) + "<th>reason</th><th>candidate</th></tr>")
    rows = [f"<tr class='{_e(r.verdict)}'><td>{_or_dash(r.level)}</td><td>{_or_dash(r.problem_id)}</td>"
            f"<td>{_e(r.name)}</td><td class='{_e(r.verdict)}'>{_e(r.verdict)}</td><td>{_e(r.device or '-')}</td>"
            + "".join(f"<td class='n'>{shown}</td>" for shown in _timed(r.speedup_comparable, [
                r.candidate_ms, *(r.speedup.get(b) for b in baselines)]))
            + f"<td>{_e(r.reason or '')}</td><td>{_e(r.candidate)}</td></tr>" for r in results]
    return f"<table>{head}{''.join(rows)}</table>"


def speedup_bars_svg(results: list[ProblemResult], baselines: list[str]) -> str:
    """One group of bars per problem, log-scale y from the 1× line; problems without a comparable speedup get no
    bar."""
    speedups = [s for r in results for s in r.speedup.values() if r.compared and s]
    top = math.log10(max([10.0, *speedups]))
    bottom = math.log10(min([0.1, *speedups]))
    width, height = SVG_WIDTH - 2 * MARGIN, SVG_HEIGHT - 2 * MARGIN

    def y(value: float) -> float:
        return MARGIN + height * (top - math.log10(value)) / (top - bottom)

    slot = width / max(len(results), 1)
    bar = slot * 0.8 / max(len(baselines), 1)
    shapes = [_axis_line(y(1.0), "1×")] + [_label(3, y(10.0 ** e), f"{10.0 ** e:g}×")
                                           for e in range(math.ceil(bottom), math.floor(top) + 1) if e != 0]
    for i, r in enumerate(results):
        x0 = MARGIN + i * slot + slot * 0.1
        for j, b in enumerate(baselines):
            value = r.speedup.get(b) if r.compared else None
            if value:
                top_y, base_y = sorted((y(value), y(1.0)))
                shapes.append(f"<rect x='{x0 + j * bar:.1f}' y='{top_y:.1f}' width='{bar * 0.95:.1f}' "
                              f"height='{max(base_y - top_y, 0.5):.1f}' fill='{COLORS.get(b, '#555')}'>"
                              f"<title>{_e(r.name)}: {value:.3g}× {_e(b)}</title></rect>")
        shapes.append(_label(x0, SVG_HEIGHT - MARGIN + 14, _e(str(r.problem_id if r.problem_id is not None else i))))
    return _svg(shapes + _legend(baselines))


def fast_p_svg(results: list[ProblemResult], baselines: list[str]) -> str:
    """fast_p as p goes from 0 to past the largest comparable speedup, one step line per baseline."""
    curves = {b: fast_p_curve(results, b) for b in baselines}
    p_max = max([2.0, *(p for curve in curves.values() for p, _ in curve)]) * 1.1
    width, height = SVG_WIDTH - 2 * MARGIN, SVG_HEIGHT - 2 * MARGIN

    def point(p: float, f: float) -> str:
        return f"{MARGIN + width * p / p_max:.1f},{MARGIN + height * (1 - f):.1f}"

    shapes = [_label(3, MARGIN + height * (1 - f), f"{f:g}") for f in (0, 0.5, 1)]
    shapes += [_label(MARGIN + width * p / p_max, SVG_HEIGHT - MARGIN + 14, f"p={p:g}") for p in (0, 1, 1.5, 2)]
    for b, curve in curves.items():
        ends = [p for p, _ in curve[1:]] + [p_max]
        steps = [f"{point(p0, f)} {point(p1, f)}" for (p0, f), p1 in zip(curve, ends)]  # flat to the next step
        shapes.append(f"<polyline fill='none' stroke='{COLORS.get(b, '#555')}' stroke-width='2' "
                      f"points='{' '.join(steps)}'/>")
    return _svg(shapes + _legend(baselines))


def _svg(shapes: list[str]) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{SVG_WIDTH}' height='{SVG_HEIGHT}' "
            f"viewBox='0 0 {SVG_WIDTH} {SVG_HEIGHT}' font-size='11'>"
            f"<rect x='{MARGIN}' y='{MARGIN}' width='{SVG_WIDTH - 2 * MARGIN}' height='{SVG_HEIGHT - 2 * MARGIN}' "
            f"fill='none' stroke='#ccc'/>{''.join(shapes)}</svg>")


def _axis_line(y: float, text: str) -> str:
    return (f"<line x1='{MARGIN}' x2='{SVG_WIDTH - MARGIN}' y1='{y:.1f}' y2='{y:.1f}' stroke='#222' "
            f"stroke-dasharray='4 3'/>" + _label(3, y, text))


def _label(x: float, y: float, text: str) -> str:
    return f"<text x='{x:.1f}' y='{y + 4:.1f}'>{text}</text>"


def _legend(baselines: list[str]) -> list[str]:
    x = SVG_WIDTH - MARGIN - 110
    return [f"<rect x='{x}' y='{8 + 14 * i}' width='10' height='10' fill='{COLORS.get(b, '#555')}'/>"
            + _label(x + 15, 9 + 14 * i, f"vs {_e(b)}") for i, b in enumerate(baselines)]


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)
