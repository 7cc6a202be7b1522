"""Issue 20 on a real GPU: CuTe candidates verified against KernelBench problems and profiled through a real worker
(CuTe C++ through load_inline: an elementwise ReLU and a tiled TF32 tensor-core GEMM; a CuTe DSL ReLU), and one
scripted optimization pass with the `cute` target whose candidate is verified."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.loop import Optimizer
from kernel_lsp.agent.model import ModelClient
from kernel_lsp.agent.tools import Workbench
from kernel_lsp.agent.trajectory import TrajectoryWriter
from kernel_lsp.config import Settings
from kernel_lsp.kinds.profile import profile_job
from kernel_lsp.worker.client import WorkerClient
from tests.agent.fake_api import FakeMessagesApi, tool_use_turn
from tests.gpu import candidates, cute_candidates
from tests.gpu.test_verify_pipeline_gpu import codes, verify
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.skipif(importlib.util.find_spec("cutlass_library") is None,
                                 reason="CuTe's headers need: pip install 'kernel-lsp[cutlass]'"),
              pytest.mark.timeout(900)]
NEEDS_NCU = pytest.mark.skipif(shutil.which("ncu") is None and not Path("/usr/local/cuda/bin/ncu").exists(),
                               reason="needs Nsight Compute (ncu)")
NEEDS_DSL = pytest.mark.skipif(importlib.util.find_spec("nvidia_cutlass_dsl") is None,
                               reason="the CuTe DSL needs: pip install 'kernel-lsp[cute-dsl]'")


async def profile(tmp_path: Path, source: str, problem: str) -> dict:
    path = tmp_path / "candidate.py"
    path.write_text(source)
    client = WorkerClient(job_timeout_s=900)
    try:
        result = await client.run(profile_job(path, candidates.KERNELBENCH / problem, {"launchCount": 1}))
    finally:
        await client.close()
    assert result.status == "ok", result.error
    return {**result.metrics["profile"], "findings": result.findings}


async def test_a_cute_relu_is_verified_against_kernelbench(tmp_path: Path):
    result = await verify(tmp_path, cute_candidates.CUTE_RELU, candidates.RELU_PROBLEM)
    assert result["verdict"] == "verified", (result["summary"], codes(result))
    assert result["report"]["speedup"]["eager"] > 0.5, result["summary"]


async def test_a_cute_tf32_gemm_is_held_to_float32_unless_its_tolerance_is_stated(tmp_path: Path):
    """TF32 keeps 10 mantissa bits: on signed inputs its error (some 5e-4 of the output's RMS) is over the default
    float32 tolerance (1e-4, scaled by the RMS), so by default it is rejected, as any kernel that quietly lowers the
    precision; positive inputs (KernelBench's own, trial 1) pass. A user who means TF32 states the tolerance
    (KernelBench's 1e-2 here) and the same kernel is verified."""
    strict = await verify(tmp_path, cute_candidates.CUTE_GEMM, candidates.MATMUL_PROBLEM, trials=2, timedCalls=5)
    assert strict["verdict"] == "rejected" and codes(strict) == ["verify-mismatch"], (strict["summary"], codes(strict))
    assert "correct 1/2" in strict["summary"], strict["summary"]
    stated = await verify(tmp_path, cute_candidates.CUTE_GEMM, candidates.MATMUL_PROBLEM, trials=2, timedCalls=5,
                          tolerances={"float32": {"atol": 1e-2, "rtol": 1e-2}})
    assert stated["verdict"] == "verified", (stated["summary"], codes(stated))
    print("strict:", strict["summary"], [f["message"][:300] for f in strict["findings"]])
    print("stated:", stated["summary"])


@NEEDS_NCU
async def test_the_cute_kernels_are_profiled_as_the_candidates_own_with_their_tensor_core_use(tmp_path: Path):
    """ncu limited to the candidate's templated kernels (cute_relu_kernel<4>, cute_tf32_gemm<TiledMMA<...>, ...>),
    named by their base names; the GEMM's SASS shows its tensor-core MMAs, the ReLU's none."""
    relu = await profile(tmp_path, cute_candidates.CUTE_RELU, candidates.RELU_PROBLEM)
    assert relu["source"] == "ncu", relu["problems"]
    assert [kernel["kernel"] for kernel in relu["kernels"]] == ["cute_relu_kernel"]
    assert relu["kernels"][0]["sass"]["tensor_core"] == {} and relu["kernels"][0]["bound"] == "memory"

    gemm = await profile(tmp_path, cute_candidates.CUTE_GEMM, candidates.MATMUL_PROBLEM)
    assert gemm["source"] == "ncu", gemm["problems"]
    [kernel] = gemm["kernels"]
    assert kernel["kernel"] == "cute_tf32_gemm" and kernel["name"].startswith("void cute_tf32_gemm<")
    assert any(op.startswith("HMMA") for op in kernel["sass"]["tensor_core"]), kernel["sass"]
    assert "hint-no-tensor-cores" not in {f["code"] for f in kernel["findings"]}


@NEEDS_DSL
async def test_a_cute_dsl_relu_is_verified_and_its_generated_kernel_is_its_own(tmp_path: Path):
    result = await verify(tmp_path, cute_candidates.DSL_RELU, candidates.RELU_PROBLEM)
    assert result["verdict"] == "verified", (result["summary"], codes(result))
    assert "integrity-no-custom-kernel" not in codes(result)


@NEEDS_DSL
@NEEDS_NCU
async def test_a_cute_dsl_kernel_is_profiled_under_its_function_name(tmp_path: Path):
    report = await profile(tmp_path, cute_candidates.DSL_RELU, candidates.RELU_PROBLEM)
    assert report["source"] == "ncu", report["problems"]
    [kernel] = report["kernels"]
    assert kernel["kernel"] == "relu_kernel" and kernel["name"].startswith("kernel_cutlass_relu_kernel_")
    assert any(f["uri"].endswith("/candidate.py") for f in report["findings"])


async def test_an_agent_pass_with_the_cute_target_verifies_its_cute_candidate(tmp_path: Path):
    """The model's turns are scripted (tests/agent/fake_api.py): it searches the CUTLASS headers, writes the CuTe
    ReLU, compiles and verifies it; the verdict and the written best are real."""
    reference = tmp_path / "19_ReLU.py"
    reference.write_text((candidates.KERNELBENCH / candidates.RELU_PROBLEM).read_text())
    script = [tool_use_turn("search_cutlass", {"query": "AutoVectorizingCopyWithAssumedAlignment"}),
              tool_use_turn("write_candidate", {"source": cute_candidates.CUTE_RELU}),
              tool_use_turn("compile", {}), tool_use_turn("verify", {}),
              tool_use_turn("finish", {"summary": "CuTe fragments of four floats"})]
    options = {"device": "cuda", "trials": 3, "timedCalls": 20, "baselines": ["eager"]}
    workbench = Workbench(reference, reference, "", Settings.of(agent_target="cute"), WorkerClient(job_timeout_s=900),
                          options, "cute1")
    with FakeMessagesApi(script) as api:
        model = ModelClient("test-key", api.url, "claude-sonnet-4-5", 2048, None, max_retries=0, timeout_s=60)
        optimizer = Optimizer(model, workbench, Budget(), TrajectoryWriter(tmp_path / "trajectories", "cute1"),
                              "cuda")
        try:
            outcome = await optimizer.run()
        finally:
            await workbench.worker.close()
    assert outcome.stop_reason == "the model finished: CuTe fragments of four floats", outcome.stop_reason
    system = api.requests[0].body["system"]
    assert "CuTe" in (system if isinstance(system, str) else json.dumps(system))
    searched = json.loads(api.requests[1].body["messages"][-1]["content"][0]["content"])
    assert searched["snippets"] and all("path" in s for s in searched["snippets"]), searched
    verified = json.loads(api.requests[4].body["messages"][-1]["content"][0]["content"])
    assert verified["verdict"] == "verified", verified
    assert outcome.best_source is not None and "cute_relu_kernel" in outcome.best_source
