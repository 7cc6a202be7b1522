"""Bench metrics (fast_p, geometric means, counts) and the reports written from them, on hand-made results."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from kernel_lsp.bench.candidates import ProblemName, problem_name
from kernel_lsp.kinds.verify import verify_job
from kernel_lsp.bench.metrics import ProblemResult, bench_metrics, fast_p, fast_p_curve, geometric_mean_speedup
from kernel_lsp.bench.report import bench_json, html_report, read_results, text_report, write_json
from kernel_lsp.contracts.verify_report import CPU_NOT_COMPARABLE
from kernel_lsp.verify.pairing import Pairing
from kernel_lsp.verify.verdict import summary as verdict_summary
from tests.problems import recorded_report, timed_report

BASELINES = ["eager", "compile"]


def result(name: str, verdict: str = "verified", eager: float | None = None, compile: float | None = None,
           reason: str | None = None, device: str = "cuda") -> ProblemResult:
    return ProblemResult(candidate=f"{name}.py", reference=f"kb/level1/{name}.py", level=1, problem_id=len(name),
                         name=name, verdict=verdict, device=device, speedup={"eager": eager, "compile": compile},
                         candidate_ms=1.5 if verdict == "verified" else None, reason=reason,
                         report={"verdict": verdict, "speedup": {"eager": eager, "compile": compile}})


RUN = [result("Relu", eager=2.0, compile=1.2), result("Gelu", eager=1.5, compile=0.5),
       result("Tanh", eager=0.5, compile=None), result("Add", "rejected", reason="verify-mismatch: max abs 3"),
       result("Mul", "unavailable", reason="verify-unavailable: no CUDA")]


def test_fast_p_counts_every_problem_and_needs_more_than_p():
    assert fast_p(RUN, "eager", 0) == pytest.approx(3 / 5)  # fast_0 is the correct rate
    assert fast_p(RUN, "eager", 1) == pytest.approx(2 / 5)
    assert fast_p(RUN, "eager", 1.5) == pytest.approx(1 / 5)  # exactly 1.5 is not > 1.5
    assert fast_p(RUN, "eager", 2) == 0.0
    assert fast_p(RUN, "compile", 0) == pytest.approx(3 / 5)  # correct without a compile timing still counts at 0
    assert fast_p(RUN, "compile", 1) == pytest.approx(1 / 5)


def test_fast_p_of_an_empty_run_and_an_all_rejected_run():
    assert fast_p([], "eager", 0) is None
    rejected = [result("A", "rejected", eager=5.0), result("B", "rejected")]
    assert all(fast_p(rejected, "eager", p) == 0.0 for p in (0, 1, 1.5, 2))
    metrics = bench_metrics(rejected, BASELINES)
    assert metrics.counts == {"verified": 0, "rejected": 2, "unavailable": 0}
    assert metrics.geomean["eager"].value is None and metrics.geomean["eager"].over == 0
    empty = bench_metrics([], BASELINES)
    assert empty.problems == 0 and empty.fast_p["eager"][0] is None


def test_geometric_mean_over_correct_problems_with_a_speedup():
    eager = geometric_mean_speedup(RUN, "eager")
    assert eager.over == 3 and eager.value == pytest.approx((2.0 * 1.5 * 0.5) ** (1 / 3))
    compile_ = geometric_mean_speedup(RUN, "compile")
    assert compile_.over == 2 and compile_.value == pytest.approx(math.sqrt(1.2 * 0.5))


def test_metrics_as_json_keys():
    metrics = bench_metrics(RUN, BASELINES).to_dict()
    assert metrics["counts"] == {"verified": 3, "rejected": 1, "unavailable": 1}
    assert set(metrics["fast_p"]["eager"]) == {"0", "1", "1.5", "2"}
    assert metrics["geomean_speedup"]["compile"]["over"] == 2


def test_fast_p_curve_steps_down_at_each_speedup():
    assert fast_p_curve(RUN, "eager") == [(0.0, 0.6), (0.5, 0.4), (1.5, 0.2), (2.0, 0.0)]


def test_json_round_trip(tmp_path: Path):
    metrics = bench_metrics(RUN, BASELINES)
    path = tmp_path / "bench.json"
    write_json(path, bench_json(RUN, metrics, {"device": "cpu"}))
    assert read_results(path) == RUN
    document = json.loads(path.read_text())
    assert document["metrics"] == json.loads(json.dumps(metrics.to_dict()))
    assert document["problems"][0]["report"]["speedup"]["eager"] == 2.0  # the full VerifyReport is kept


def test_html_has_a_row_per_problem_and_inline_svg_plots():
    page = html_report(RUN, bench_metrics(RUN, BASELINES), {"folder": "cands", "device": "cpu"})
    assert page.count("<svg") == 2 and "<script" not in page and "http://" not in page.replace(
        "http://www.w3.org/2000/svg", "")  # self-contained
    for r in RUN:
        assert f"<td>{r.name}</td>" in page
    assert "verify-mismatch: max abs 3" in page and "fast_1.5" in page


def test_html_escapes_what_the_candidate_controls():
    page = html_report([result("<b>x</b>", "rejected", reason="<script>")], bench_metrics([], ["eager"]), {})
    assert "<script>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page


def test_text_report_table_and_metrics():
    text = text_report(RUN, bench_metrics(RUN, BASELINES))
    assert "5 candidates: 3 verified, 1 rejected, 1 unavailable" in text
    assert "vs eager    0.6  0.4  0.2    0" in text.splitlines()
    assert "geomean speedup vs compile: 0.775x over 2 correct candidates" in text


def test_a_run_on_the_cpu_shows_no_times_or_speedups_and_says_why():
    """Interpreter timings vary 2x between runs and say nothing of a GPU: the table shows 'cpu', the metrics a note;
    the figures stay in the results (bench.json)."""
    cpu_run = [result("Relu", eager=0.0002, compile=0.0004, device="cpu"), result("Add", "rejected", device="cpu",
                                                                              reason="verify-mismatch")]
    metrics = bench_metrics(cpu_run, BASELINES)
    text = text_report(cpu_run, metrics)
    relu = next(line for line in text.splitlines() if line.startswith("1 ") and "Relu" in line)
    assert relu.split()[4:8] == ["cpu", "cpu", "cpu", "cpu"] and "0.0002" not in text
    assert not any(line.startswith(("fast_p", "vs ", "geomean")) for line in text.splitlines())
    assert "1 correct candidate timed on the CPU" in text
    assert cpu_run[0].speedup["eager"] == 0.0002
    # the figures leave the ratios out: none would be a GPU's
    assert metrics.geomean["eager"].value is None and metrics.fast_p["eager"][1] == 0.0 and not metrics.figures
    page = html_report(cpu_run, metrics, {"device": "cpu"})
    assert "<svg" not in page and "geomean" not in page and "0.0002" not in page and "0.0004" not in page
    assert "<p class='not-comparable'>Speedups not comparable: 1 correct problem timed on the CPU" in page


def test_cpu_speedups_are_marked_in_bench_json_and_left_out_of_a_mixed_runs_figures(tmp_path: Path):
    """A run with problems on a GPU and on the CPU: the GPU's speedups make the figures and plots, the CPU's enter
    fast_0 alone; each problem and the metrics say which (`speedup_comparable`), bench.json keeps every ratio."""
    interpreted = result("Interp", eager=40.0, compile=30.0, device="cpu")
    run = [*RUN, interpreted]
    metrics = bench_metrics(run, BASELINES)
    assert fast_p(run, "eager", 0) == pytest.approx(4 / 6) and fast_p(run, "eager", 2) == 0.0  # 40x is no GPU's
    assert metrics.geomean["eager"].over == 3 and max(p for p, _ in fast_p_curve(run, "eager")) == 2.0
    assert (metrics.not_comparable, metrics.speedup_comparable, metrics.figures) == (1, False, True)
    path = tmp_path / "bench.json"
    write_json(path, bench_json(run, metrics, {"device": "auto"}))
    document = json.loads(path.read_text())
    assert document["metrics"]["speedup_comparable"] is False and document["metrics"]["not_comparable"] == 1
    marks = {p["name"]: (p["speedup_comparable"], p["not_comparable_reason"]) for p in document["problems"]}
    assert marks["Relu"] == (True, None) and marks["Interp"] == (False, CPU_NOT_COMPARABLE)
    assert read_results(path) == run and document["problems"][-1]["speedup"]["eager"] == 40.0
    page = html_report(run, metrics, {"device": "auto"})
    assert page.count("<svg") == 2 and "class='not-comparable'" in page
    assert "40×" not in page and ">40<" not in page and ">30<" not in page and "<td class='n'>cpu</td>" in page
    assert ">2<" in page  # a GPU speedup is shown


def test_a_bench_json_written_before_the_marking_reads_marked():
    written_before = {k: v for k, v in result("Relu", eager=0.0002, device="cpu").to_dict().items()
                      if k not in ("speedup_comparable", "not_comparable_reason")}
    assert ProblemResult.from_dict(written_before).speedup_comparable is False
    assert ProblemResult.from_dict({**written_before, "device": "cuda"}).speedup_comparable is True


def test_the_lens_line_of_a_cpu_run_has_correctness_and_no_timings():
    report = timed_report(40.0, {"eager": 0.000222, "compile": 0.000455}, device="cpu")
    assert verdict_summary("verified", report) == "correct 5/5 · run on the CPU: timings not comparable"
    on_gpu = timed_report(3.1, {"eager": 1.84, "compile": 0.97}, device="cuda")
    assert verdict_summary("verified", on_gpu) == "correct 5/5 · 1.84× eager · 0.97× compile · 3.1 ms"
    # a baseline asked for and not timed (its process died) is said, not left out
    failed = timed_report(3.1, {"eager": None, "compile": None}, device="cuda",
                          timing=dataclasses.replace(on_gpu.timing, eager=None, compile=None, skipped={
                              kind: "not timed: the baselines' process ended without answering" for kind in
                              ("eager", "compile")}))
    assert verdict_summary("verified", failed) == "correct 5/5 · eager not timed · compile not timed · 3.1 ms"


def test_a_speedup_whose_interval_holds_one_is_shown_as_about_one_and_not_counted():
    on_gpu = timed_report(0.0052, {"eager": 1.08, "compile": 2.4}, device="cuda",
                          interval={"eager": (0.93, 1.21), "compile": (2.2, 2.6)},
                          significant={"eager": False, "compile": True})
    assert verdict_summary("verified", on_gpu) == "correct 5/5 · ≈1× eager · 2.4× compile · 5.2 µs"
    noisy = ProblemResult(candidate="add.py", reference="kb/level2/add.py", level=2, problem_id=1, name="Add",
                          verdict="verified", device="cuda", speedup=dict(on_gpu.speedup),
                          interval={kind: list(bounds) for kind, bounds in on_gpu.interval.items()})
    sure = result("Relu", eager=1.6, compile=1.3)  # no interval stated (an older report): its figure counts
    narrow = ProblemResult(**{**noisy.to_dict(), "name": "Mul", "speedup": {"eager": 1.6, "compile": 1.6},
                              "interval": {"eager": [1.45, 1.7], "compile": [1.55, 1.65]}})
    run = [noisy, sure, narrow]
    assert fast_p(run, "eager", 1) == pytest.approx(2 / 3)  # 1.08 with [0.93, 1.21] is no speedup
    assert fast_p(run, "compile", 2) == pytest.approx(1 / 3)  # 2.4 with [2.2, 2.6] is over 2
    assert fast_p(run, "compile", 1.5) == pytest.approx(2 / 3)  # [1.55, 1.65] is over 1.5 as a whole
    assert fast_p(run, "eager", 1.5) == pytest.approx(1 / 3)  # 1.6 with [1.45, 1.7] is not, surely
    metrics = bench_metrics(run, BASELINES)
    assert metrics.not_significant == {"eager": 1, "compile": 0}
    assert "not counted in fast_p vs eager: 1 speedup over 1x whose 95% interval holds 1x" in text_report(run, metrics)
    assert ProblemResult.from_dict(json.loads(json.dumps(noisy.to_dict()))) == noisy


def test_problem_name_from_the_kernelbench_reference(tmp_path: Path):
    pairing = Pairing(tmp_path / "c" / "x.py", tmp_path / "kb" / "level2" / "17_Conv_ReLU.py", "kernelbench", "")
    assert problem_name(pairing) == ProblemName(2, 17, "Conv_ReLU")
    same = Pairing(tmp_path / "mine.py", tmp_path / "mine.py", "same-file", "")
    assert problem_name(same) == ProblemName(None, None, "mine")


def test_verify_job_names_files_relative_to_the_candidate(tmp_path: Path):
    (tmp_path / "kb" / "level1").mkdir(parents=True)
    reference = tmp_path / "kb" / "level1" / "19_ReLU.py"
    reference.write_text("class Model: ...\n")
    (tmp_path / "c" / "csrc").mkdir(parents=True)
    (tmp_path / "c" / "csrc" / "relu.cu").write_text('#include "common/vec.cuh"\n#include <cuda.h>\n// kernel\n')
    (tmp_path / "c" / "csrc" / "common").mkdir()
    (tmp_path / "c" / "csrc" / "common" / "vec.cuh").write_text('#include "../../../outside.h"\n')
    (tmp_path / "outside.h").write_text("")
    candidate = tmp_path / "c" / "19_ReLU.py"
    candidate.write_text("from torch.utils.cpp_extension import load\n"
                         "ext = load(name='relu', sources=['csrc/relu.cu'])\nclass ModelNew: ...\n")
    job = verify_job(candidate, reference, {"device": "cpu", "trials": 2})
    assert job.kind == "verify"
    assert set(job.source_files) == {"19_ReLU.py", "reference/19_ReLU.py", "csrc/relu.cu", "csrc/common/vec.cuh"}
    assert job.config["candidate"] == "19_ReLU.py" and job.config["reference"] == "reference/19_ReLU.py"
    assert job.config["origins"]["csrc/relu.cu"] == str((tmp_path / "c" / "csrc" / "relu.cu").resolve())
    assert (job.config["device"], job.config["trials"]) == ("cpu", 2) and job.content_hash
    same = verify_job(reference, reference, {})
    assert same.source_files == {"19_ReLU.py": "class Model: ...\n"} and same.config["reference"] == "19_ReLU.py"
    with pytest.raises(ValueError, match="timed_calls"):
        verify_job(candidate, reference, {"timed_calls": 5})


def test_verify_job_carries_the_modules_the_candidate_imports_from_its_folder(tmp_path: Path):
    reference = tmp_path / "ref.py"
    reference.write_text("class Model: ...\n")
    (tmp_path / "helpers.py").write_text("SCALE = 2\n")
    (tmp_path / "ops" / "cuda").mkdir(parents=True)
    (tmp_path / "ops" / "__init__.py").write_text("")
    (tmp_path / "ops" / "cuda" / "relu.py").write_text("def relu(x): ...\n")
    (tmp_path / "unused.py").write_text("")
    candidate = tmp_path / "cand.py"
    candidate.write_text("import torch, helpers\nfrom ops.cuda.relu import relu\nclass ModelNew: ...\n")
    job = verify_job(candidate, reference, {})
    assert set(job.source_files) == {"cand.py", "ref.py", "helpers.py", "ops/__init__.py", "ops/cuda/relu.py"}


def test_the_lens_line_on_a_gpu_shows_the_own_kernels_share():
    """The share of the recorded runs' device time in the candidate's own kernels (its profiler's word); none on
    the CPU, where the interpreter's wall time says nothing of a GPU's split."""
    recorded = recorded_report().kernels
    work = dataclasses.replace(recorded.work, own_share=0.934)
    report = timed_report(2.0, {"eager": 1.5}, device="cuda", kernels=dataclasses.replace(recorded, work=work))
    assert verdict_summary("verified", report) == "correct 5/5 · 1.5× eager · 2 ms · own kernels 93%"
    tiny = dataclasses.replace(report, kernels=dataclasses.replace(recorded, work=dataclasses.replace(
        work, own_share=0.0004)))
    assert verdict_summary("verified", tiny).endswith("· own kernels <1%")
    on_cpu = dataclasses.replace(report, device="cpu")
    assert "own kernels" not in verdict_summary("verified", on_cpu)
