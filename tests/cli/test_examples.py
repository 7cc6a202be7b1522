"""The README's tour (examples/tour/) as a user runs it, a subprocess per command: each file says what the README
says it does, so the examples cannot drift from it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOUR = ROOT / "examples" / "tour"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def kernel_lsp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_lsp", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=540)


def test_the_honest_candidate_is_verified_and_the_cheat_rejected_with_its_code():
    honest = kernel_lsp("verify", "examples/tour/relu_triton.py")
    assert honest.returncode == 0, honest.stderr
    verdict = honest.stdout.strip().splitlines()[-1]
    assert verdict.startswith("examples/tour/relu_triton.py: correct 5/5"), honest.stdout
    cheat = kernel_lsp("verify", "examples/tour/relu_cheat.py")
    assert cheat.returncode == 1, cheat.stderr
    line = (TOUR / "relu_cheat.py").read_text().splitlines().index("    def forward(self, x):") + 1  # ModelNew's
    assert f"examples/tour/relu_cheat.py:{line}:9: error: no custom kernel ran" in cheat.stdout, cheat.stdout
    assert cheat.stdout.strip().endswith("integrity-no-custom-kernel")


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="the .cu files need nvcc (install the CUDA toolkit)")
def test_check_finds_the_tours_compile_error_its_spill_and_its_load_inline_kernel():
    done = kernel_lsp("check", "examples/tour")
    assert done.returncode == 1, done.stderr  # one error
    assert 'examples/tour/broken.cu:5:20: error: identifier "y" is undefined [nvcc-error]' in done.stdout
    assert "examples/tour/scale_inline.py:6:17: info: scale_kernel: sm_90: " in done.stdout
    spill = [line for line in done.stdout.splitlines() if line.endswith("[ptxas-spill]")]
    assert len(spill) == 1 and spill[0].startswith("examples/tour/spill.cu:3:44: warning: heavy(")


def test_the_gpu_examples_say_they_need_a_gpu_instead_of_a_verdict():
    """On a machine without a GPU, each GPU example gets "not verified" with the reason, exit status 2: a CUDA
    extension cannot be built by a CPU build of torch, nor its kernels run."""
    for name, reason in (("relu_cuda.py", "this candidate builds CUDA"), ("relu_cute.py", "this candidate builds CUDA"),
                         ("relu_cute_dsl.py", "CuTe DSL kernels run only on an NVIDIA GPU")):
        done = kernel_lsp("verify", f"examples/gpu/{name}")
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert f"examples/gpu/{name}: not verified: {reason}" in done.stdout, done.stdout


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="the check needs nvcc (install the CUDA toolkit)")
def test_checking_a_gpu_example_with_a_cpu_torch_blames_the_torch_build_not_the_file():
    """examples/gpu/relu_cuda.py includes ATen/cuda/CUDAContext.h, whose CUDA headers a CPU build of torch lacks:
    one Information line says so, no error of the file's, exit 0. (With a CUDA build of torch the file compiles:
    the GPU test verifies it.)"""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build: the example compiles here")
    done = kernel_lsp("check", "--no-cache", "--summary", "examples/gpu/relu_cuda.py")
    assert done.returncode == 0, done.stderr
    assert ": error: " not in done.stdout, done.stdout
    [limit] = [line for line in done.stdout.splitlines() if "[torch-cpu-build]" in line]
    assert ": info: " in limit and "comes with a CUDA build of torch, and this one is a CPU build" in limit
    assert "not a fault of this file" in limit
    assert re.search(r"relu_cuda\.py\s+not checked\s+0\s", done.stdout), done.stdout  # --summary's row
