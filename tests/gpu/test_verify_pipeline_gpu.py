"""The verification pipeline on a real GPU, through a real worker: CUDA load_inline candidates against KernelBench
problems. Honest ones are verified with timings; each cheating one is rejected with its check's code."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_lsp.kinds.verify import verify_job
from kernel_lsp.worker.client import WorkerClient
from tests.gpu import candidates as c
from tests.gpu import sanitizer_candidates as sc
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.skipif(not (c.KERNELBENCH / c.RELU_PROBLEM).is_file(),
                                 reason=f"needs the KernelBench problems at {c.KERNELBENCH}"),
              pytest.mark.timeout(900)]


async def verify(tmp_path: Path, candidate: str, problem: str | Path, **options) -> dict:
    path = tmp_path / "candidate.py"
    path.write_text(candidate)
    settings = {"device": "cuda", "trials": 3, "timedCalls": 20, "warmup": 3, "baselines": ["eager"], **options}
    client = WorkerClient(job_timeout_s=900)
    try:
        result = await client.run(verify_job(path, c.KERNELBENCH / problem, settings))
    finally:
        await client.close()
    assert result.status == "ok", result.error
    return {**result.metrics, "findings": result.findings}


def codes(result: dict) -> list[str]:
    return [finding["code"] for finding in result["findings"]]


async def test_honest_relu_is_verified_against_eager_and_compile(tmp_path: Path):
    result = await verify(tmp_path, c.HONEST_RELU, c.RELU_PROBLEM, trials=5, timedCalls=50,
                          baselines=["eager", "compile"])
    report = result["report"]
    assert result["verdict"] == "verified", (result["summary"], result["findings"])
    assert report["correctness"]["distributions"] == ["own", "normal", "scaled", "own", "normal"]
    assert report["kernels"]["custom"] == ["relu_kernel"] and report["kernels"]["how"] == "profiler"
    timing = report["timing"]
    assert timing["candidate"]["clock"] == "judge-wall" and timing["candidate"]["l2_flushed"]
    assert 0.5 < report["speedup"]["eager"] < 2.0  # both are bound by the same 12.9 GB of traffic
    assert report["speedup"]["compile"] is not None or timing["compileError"]
    assert report["floor"]["floor_ms"] < timing["candidate"]["median_ms"]
    assert "unavailable" not in report["gpu"]["before"] and report["gpu"]["after"]  # NVML read around the timing
    assert result["summary"].startswith("correct 5/5 · ")
    assert report["shared_memory_poison"] == "filled" and "verify-shared-unpoisoned" not in codes(result)
    assert report["free_memory_poison"] == "covered" and "verify-poison-short" not in codes(result)


async def test_honest_matmul_is_verified_on_signed_and_scaled_inputs(tmp_path: Path):
    result = await verify(tmp_path, c.HONEST_MATMUL, c.MATMUL_PROBLEM, trials=3, timedCalls=10)
    assert result["verdict"] == "verified", (result["summary"], result["findings"])
    report = result["report"]
    assert report["correctness"]["distributions"] == ["own", "normal", "scaled"]
    assert report["floor"]["flops"] == 2 * 4096**3
    assert report["speedup"]["eager"] < 1.0  # a plain tiled kernel does not beat cuBLAS


@pytest.mark.parametrize(("candidate", "code"), [
    (c.HALF_WRITTEN_RELU, "integrity-uninitialized-output"),
    (c.IN_PLACE_RELU, "integrity-input-mutated"),
    (c.SIDE_STREAM_RELU, "integrity-other-stream"),
    (c.STOCK_RELU, "integrity-no-custom-kernel"),
], ids=["half-written", "in-place", "side-stream", "stock"])
async def test_cheating_relu_is_rejected_with_its_code(tmp_path: Path, candidate: str, code: str):
    result = await verify(tmp_path, candidate, c.RELU_PROBLEM, trials=2)
    assert result["verdict"] == "rejected" and code in codes(result), (result["summary"], result["findings"])
    if candidate == c.HALF_WRITTEN_RELU:  # its 6.4 GB output on poison even on an 80 GB H100, where the judge's
        # room once left a 1 GB block and the unwritten half read zeros (verify-mismatch); the third run tells
        # the unwritten output from stale shared memory
        assert result["report"]["free_memory_poison"] == "covered", result["report"]["free_memory_poison"]
        [message] = [p["message"] for p in result["report"]["integrity"] if p["code"] == code]
        assert "it read device memory it never wrote" in message, message


async def test_a_kernel_that_reads_shared_memory_it_never_wrote_is_rejected(tmp_path: Path):
    result = await verify(tmp_path, sc.STALE_SHARED, c.RELU_PROBLEM, trials=2)
    assert result["report"] is not None, (result["summary"], [f["message"] for f in result["findings"]])
    messages = {problem["code"]: problem["message"] for problem in result["report"]["integrity"]}
    assert result["verdict"] == "rejected", (result["summary"], result["findings"])
    message = messages.get("integrity-uninitialized-output", "")
    assert "a kernel read shared memory that no thread of its block wrote" in message, messages
    assert result["report"]["shared_memory_poison"] == "filled"


def test_the_shared_memory_fill_runs_through_the_real_driver():
    from kernel_lsp.commands.doctor import shared_fill_check

    check = shared_fill_check()  # the driver API alone, in device 0's primary context: what doctor shows
    assert check.level == "ok", check.detail
    assert check.detail.startswith("the fill kernel loaded from PTX and ran on device 0: ") and " KiB (" in check.detail
