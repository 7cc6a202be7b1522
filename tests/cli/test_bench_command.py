"""`kernel-lsp bench DIR`: usage errors, and (on the CPU, Triton under TRITON_INTERPRET=1) a whole run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kernel_lsp.commands import bench as bench_command
from tests.problems import relu_problem, triton_relu
from tests.speedup_marking import ratios, shown_ratios, unmarked_ratios


def bench(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kernel-lsp")
    bench_command.add_parser(parser.add_subparsers(dest="command"))
    return bench_command.run(parser.parse_args(["bench", *argv]))


def test_a_folder_without_candidates_is_a_usage_error(tmp_path: Path, capsys):
    (tmp_path / "notes.py").write_text("x = 1\n")
    assert bench(str(tmp_path)) == 2
    assert "no candidates" in capsys.readouterr().err


def test_a_missing_folder_is_a_usage_error(tmp_path: Path, capsys):
    assert bench(str(tmp_path / "nowhere")) == 2
    assert "not a folder" in capsys.readouterr().err


def test_unpaired_candidates_are_listed_and_the_run_refused(tmp_path: Path, capsys):
    (tmp_path / "1_Relu.py").write_text("class ModelNew:\n    pass\n")
    assert bench(str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"skipped {tmp_path / '1_Relu.py'}: no reference found" in err and "--kernelbench ROOT" in err


@pytest.mark.parametrize("options, message", [(["--baselines", "eager,jit"], "--baselines"),
                                              (["--trials", "0"], "--trials must be at least 1"),
                                              (["--kernelbench", "missing-root"], "--kernelbench: not a folder")])
def test_bad_options_are_usage_errors(tmp_path: Path, capsys, options, message):
    (tmp_path / "one.py").write_text("class Model:\n    pass\n\nclass ModelNew:\n    pass\n")
    assert bench(str(tmp_path), *options) == 2
    assert message in capsys.readouterr().err


RELU_PROBLEM = relu_problem()

TRITON_RELU = triton_relu(1024)


def test_a_cpu_run_verifies_one_candidate_and_rejects_the_wrong_one(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton kernels run on the CPU only through its interpreter
    (tmp_path / "kb" / "level1").mkdir(parents=True)
    (tmp_path / "kb" / "level1" / "1_Relu.py").write_text(RELU_PROBLEM)
    (tmp_path / "kb" / "level1" / "2_Double.py").write_text(RELU_PROBLEM.replace("torch.relu(x)", "x * 2.0"))
    candidates = tmp_path / "candidates" / "level1"
    candidates.mkdir(parents=True)
    (candidates / "1_Relu.py").write_text(TRITON_RELU)
    (candidates / "2_Double.py").write_text(TRITON_RELU.replace("tl.maximum(x, 0.0)", "x * 3.0"))  # wrong
    out = tmp_path / "report"
    status = bench(str(tmp_path / "candidates"), "--kernelbench", str(tmp_path / "kb"), "--device", "cpu",
                   "--trials", "2", "--calls", "5", "--baselines", "eager", "--out", str(out))
    captured = capsys.readouterr()
    assert status == 0, captured.err
    rows = {line.split()[2]: line for line in captured.out.splitlines() if line.startswith("1 ")}
    assert rows["Relu"].split()[3:7] == ["verified", "cpu", "cpu", "cpu"]  # device, then no ms or speedup shown
    assert rows["Double"].split()[3] == "rejected" and "verify-mismatch" in rows["Double"]
    assert "2 candidates: 1 verified, 1 rejected, 0 unavailable" in captured.out
    assert "timed on the CPU" in captured.out and "vs eager" not in captured.out  # no fast_p from the interpreter
    assert "[2/2] level1/2_Double.py: rejected" in captured.err
    document = json.loads((out / "bench.json").read_text())
    assert document["metrics"]["fast_p"]["eager"]["0"] == 0.5
    verified = next(p for p in document["problems"] if p["verdict"] == "verified")
    assert verified["report"]["correctness"]["passed"] == 2 and verified["speedup"]["eager"] > 0
    # the interpreter's ratios: kept, each marked, in every file the run wrote, and shown as a figure in none
    assert sorted(path.name for path in out.iterdir()) == ["bench.html", "bench.json"]
    assert unmarked_ratios(document) == [] and ratios(document)
    assert verified["speedup_comparable"] is False and verified["report"]["speedup_comparable"] is False
    metrics = document["metrics"]
    assert (metrics["speedup_comparable"], metrics["not_comparable"]) == (False, 1) and metrics["not_comparable_reason"]
    assert metrics["geomean_speedup"]["eager"]["value"] is None and metrics["fast_p"]["eager"]["1"] == 0.0
    page = (out / "bench.html").read_text()
    assert "<p class='not-comparable'>Speedups not comparable: 1 correct problem timed on the CPU" in page
    assert "<svg" not in page and "geomean" not in page and "fast_1" not in page  # no figures, no plots
    assert shown_ratios(page, document) == [] and shown_ratios(captured.out, document) == []
