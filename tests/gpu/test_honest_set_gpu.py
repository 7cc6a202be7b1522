"""Issue 17: honest candidates for KernelBench problems (tests/gpu/honest_set.py, CUDA load_inline and Triton)
stay verified with every integrity check on, through a real worker on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu import candidates as c
from tests.gpu.honest_set import HONEST_SET
from tests.gpu.test_verify_pipeline_gpu import verify
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.timeout(900)]


@pytest.mark.parametrize("problem", sorted(HONEST_SET))
async def test_an_honest_candidate_is_verified(tmp_path: Path, problem: str):
    if not (c.KERNELBENCH / problem).is_file():
        pytest.skip(f"needs the KernelBench problem {problem} under {c.KERNELBENCH}")
    result = await verify(tmp_path, HONEST_SET[problem], problem, trials=3, timedCalls=20)
    assert result["verdict"] == "verified", (result["summary"], result["findings"])
    assert result["report"]["kernels"]["output_from_kernel"] is True, result["report"]["kernels"]
