"""A short campaign on the GPU: two KernelBench problems (level1/19_ReLU with a CUDA load_inline candidate,
level1/21_Sigmoid with a Triton one), the real anthropic client against the scripted Messages API, a real local
worker, eager and torch.compile baselines. The model's turns are scripted; verdicts, timings and the table are
real."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from kernel_lsp.cli import main
from tests.agent.fake_api import FakeMessagesApi, Turn, tool_use_turn
from tests.gpu import candidates
from tests.gpu.honest_set import HONEST_SET
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.timeout(600)]

PROBLEMS = {candidates.RELU_PROBLEM: candidates.HONEST_RELU, "level1/21_Sigmoid.py": HONEST_SET["level1/21_Sigmoid.py"]}


def scripted_model(body: dict) -> Turn:
    """Read the reference, write the honest candidate for the problem it shows, verify, finish."""
    messages = body["messages"]
    turns = sum(m["role"] == "assistant" for m in messages)
    if turns == 0:
        return tool_use_turn("read_reference", {})
    if turns == 1:
        seen = json.dumps(messages)
        source = PROBLEMS["level1/21_Sigmoid.py" if "torch.sigmoid(" in seen else candidates.RELU_PROBLEM]
        return tool_use_turn("write_candidate", {"source": source})
    if turns == 2:
        return tool_use_turn("verify", {})
    return tool_use_turn("finish", {"summary": "the honest kernel"})


def test_a_short_campaign_on_two_kernelbench_problems(tmp_path: Path, capsys, monkeypatch):
    folder = tmp_path / "level1"
    folder.mkdir()
    for problem in PROBLEMS:
        shutil.copyfile(candidates.KERNELBENCH / problem, folder / Path(problem).name)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(tmp_path / "cache"))
    with FakeMessagesApi([], responder=scripted_model) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status = main(["campaign", str(folder), "--out", str(tmp_path / "out"), "--device", "cuda", "--trials", "2",
                       "--calls", "30", "--baselines", "eager,compile", "--format", "json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    document = json.loads(captured.out)
    rows = {row["key"]: row for row in document["problems"]}
    assert list(rows) == ["19_ReLU", "21_Sigmoid"]
    for row in rows.values():
        assert row["verdict"] == "verified", row
        assert row["speedup"]["eager"] > 0.2 and row["speedup"]["compile"] > 0.2, row
        assert Path(row["best_file"]).is_file()
    assert document["metrics"]["fast_p"]["eager"]["0"] == 1.0
    assert document["metrics"]["geomean_speedup"]["compile"]["over"] == 2
    assert document["totals"]["model_calls"] == len(api.requests) == 8
    # the papers' table: one level, both problems timed on the GPU, so every column has its figure
    [level] = document["levels"]
    assert (level["level"], level["problems"], level["correct"], level["cpu_timed"]) == ("1", 2, 2, 0)
    eager = [row["speedup"]["eager"] for row in rows.values()]
    assert level["geomean_correct"]["eager"] == pytest.approx((eager[0] * eager[1]) ** 0.5)
    assert level["mean_correct"]["eager"] == pytest.approx(sum(eager) / 2)
    assert level["fast"]["compile"]["0"] == 1.0 and "| 1 | 2 | 100% |" in Path(document["table"]).read_text()
    print(json.dumps({k: {"speedup": r["speedup"], "ms": r["ms"]} for k, r in rows.items()}), file=sys.stderr)
