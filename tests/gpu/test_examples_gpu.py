"""examples/gpu/ on a real GPU, as its README says a user runs it: each candidate verified against relu.py, and the
CUDA one profiled by ncu with its own kernel named."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.test_worker_gpu import gpu_present

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.timeout(900)]


def kernel_lsp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_lsp", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=840)


@pytest.mark.parametrize("name", ["relu_cuda.py", pytest.param("relu_cute.py", marks=pytest.mark.skipif(
    importlib.util.find_spec("cutlass_library") is None, reason="needs: pip install 'kernel-lsp[cutlass]'")),
    pytest.param("relu_cute_dsl.py", marks=pytest.mark.skipif(
        importlib.util.find_spec("nvidia_cutlass_dsl") is None, reason="needs: pip install 'kernel-lsp[cute-dsl]'"))])
def test_each_gpu_example_is_verified(name: str):
    done = kernel_lsp("verify", f"examples/gpu/{name}", "--format", "json")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    report = json.loads(done.stdout)
    assert report["verdict"] == "verified", report.get("summary")


def test_the_cuda_example_is_profiled_by_ncu_with_its_own_kernel():
    done = kernel_lsp("profile", "examples/gpu/relu_cuda.py", "--format", "json")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    report = json.loads(done.stdout)
    assert report["source"] == "ncu" and [k["kernel"] for k in report["kernels"]] == ["relu_kernel"], report
