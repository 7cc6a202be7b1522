"""One optimization pass on a real GPU: the real anthropic client against the scripted Messages API
(tests/agent/fake_api.py), a real local worker, KernelBench level1/19_ReLU as the problem. The model's turns are
scripted; the verdicts, timings, profile, tree and side file are real."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.loop import Optimizer
from kernel_lsp.agent.model import ModelClient
from kernel_lsp.agent.tools import Workbench
from kernel_lsp.agent.trajectory import TrajectoryWriter, read_trajectory
from kernel_lsp.config import Settings
from kernel_lsp.worker.client import WorkerClient
from profilers.ncu import sections_for_bounds
from tests.agent.fake_api import FakeMessagesApi, tool_use_turn
from tests.gpu import candidates
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.skipif(shutil.which("ncu") is None and not Path("/usr/local/cuda/bin/ncu").exists(),
                                 reason="needs Nsight Compute (ncu) for the profile tool"),
              pytest.mark.timeout(600)]

OPTIONS = {"device": "cuda", "trials": 3, "timedCalls": 50, "baselines": ["eager"]}
AGAIN = candidates.HONEST_RELU + "\n# the same kernel, verified once more so that profiling is offered\n"


def answer(api: FakeMessagesApi, request: int) -> dict:
    """The tool result the model read in request `request` (0-based), as JSON."""
    return json.loads(api.requests[request].body["messages"][-1]["content"][0]["content"])


async def test_a_pass_on_the_gpu_verifies_profiles_rejects_a_cheat_and_offers_the_best(tmp_path: Path):
    """One expansion: two verified versions of the same kernel (so profiling is offered), a profile (ncu and the
    energies of candidate and reference), then a half-written cheat as the expansion's third verify."""
    reference = tmp_path / "19_ReLU.py"
    reference.write_text((candidates.KERNELBENCH / candidates.RELU_PROBLEM).read_text())
    script = [tool_use_turn("write_candidate", {"source": candidates.HONEST_RELU}), tool_use_turn("verify", {}),
              tool_use_turn("write_candidate", {"source": AGAIN}), tool_use_turn("verify", {}),
              tool_use_turn("profile", {}),
              tool_use_turn("write_candidate", {"source": candidates.HALF_WRITTEN_RELU}), tool_use_turn("verify", {}),
              tool_use_turn("finish", {"summary": "float4 loads and stores"})]
    workbench = Workbench(reference, reference, "", Settings(), WorkerClient(job_timeout_s=900), OPTIONS, "gpu1")
    with FakeMessagesApi(script) as api:
        model = ModelClient("test-key", api.url, "claude-sonnet-4-5", 2048, None, max_retries=0, timeout_s=60)
        optimizer = Optimizer(model, workbench, Budget(), TrajectoryWriter(tmp_path / "trajectories", "gpu1"), "cuda")
        try:
            outcome = await optimizer.run()
        finally:
            await workbench.worker.close()
    assert outcome.stop_reason == "the model finished: float4 loads and stores", outcome.stop_reason
    honest = answer(api, 2)
    assert honest["verdict"] == "verified" and honest["speedup"]["eager"] > 0.3, honest
    profiled = answer(api, 5)
    assert profiled["ok"] and [k["bound"] for k in profiled["kernels"]] == ["memory"], profiled
    assert "relu_kernel" in profiled["kernels"][0]["name"] and profiled["kernels"][0]["duration_ms"] > 0
    assert profiled["energy"]["candidate_mj_per_call"] > 0 and profiled["energy"]["reference_mj_per_call"] > 0
    assert set(profiled["stages"]["bounds"].values()) == {"memory"}  # two stages: classified, then memory's analyses
    assert profiled["stages"]["sections"] == list(sections_for_bounds({"memory"}))
    first, again, cheat = optimizer.tree.nodes[1:4]
    assert (first.source, again.source, cheat.source) == (candidates.HONEST_RELU, AGAIN, candidates.HALF_WRITTEN_RELU)
    assert "energy" in again.rubric.parts and "energy" not in first.rubric.parts  # only the profiled node
    assert cheat.rubric.outcome == "integrity" and cheat.score == 0 and cheat.dead
    assert "integrity-uninitialized-output" in {p["code"] for p in cheat.evaluation["report"]["integrity"]}
    assert outcome.best_source in (candidates.HONEST_RELU, AGAIN) and outcome.best_speedup["eager"] > 0.3
    assert outcome.side_file is not None and outcome.side_file.read_text() == outcome.best_source
    scores = [e for e in read_trajectory(outcome.trajectory_path) if e["kind"] == "score" and e["node"] == again.id]
    assert len(scores) == 2 and "energy" in scores[-1]["parts"]
