"""The static profile (nvcc -cubin -lineinfo, ptxas -v, nvdisasm) of .cu files and load_inline strings."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.contracts.codec import encode
from kernel_lsp.profile.static import static_profile as typed_static_profile

from tests.paths import FIXTURES
pytestmark = [pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"), pytest.mark.timeout(300)]

LOAD_INLINE_CANDIDATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
__global__ void gather_kernel(const float* x, const int* index, float* y, int n) {
    float local[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < 256; ++k) local[k] = x[(i + k) % n];
    if (i < n) {
        y[i] = local[index[i] & 255];
    }
}

torch::Tensor gather(torch::Tensor x, torch::Tensor index) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    gather_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), index.data_ptr<int>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(name="gather_ext", cpp_sources="torch::Tensor gather(torch::Tensor x, torch::Tensor index);",
                  cuda_sources=cuda_source, functions=["gather"])


class ModelNew(nn.Module):
    def forward(self, x, index):
        return ext.gather(x, index)
'''
LOCAL_ARRAY_LINE = 9  # `for (...) local[k] = x[(i + k) % n];` in the .py, 1-based


async def static_profile(*args, **kwargs) -> dict:
    """The static ProfileReport as the wire has it."""
    return encode(await typed_static_profile(*args, **kwargs))


def codes(kernel: dict) -> set[str]:
    return {finding["code"] for finding in kernel["findings"]}


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="needs the recorded fixtures")
async def test_the_fixture_kernels_give_their_sass_hints_on_their_lines():
    path = FIXTURES / "kernels.cu"
    report = await static_profile({"kernels.cu": path.read_text()}, "kernels.cu", {"kernels.cu": str(path)})
    kernels = {kernel["kernel"]: kernel for kernel in report["kernels"]}
    assert report["source"] == "static" and report["problems"] == []
    assert list(kernels) == ["vec_add", "transpose_read_uncoalesced", "smem_conflict", "divergent", "spills",
                             "tiny_grid", "matmul_naive"]  # in source order
    matmul = kernels["matmul_naive"]
    (no_tensor_cores,) = [f for f in matmul["findings"] if f["code"] == "hint-no-tensor-cores"]
    assert no_tensor_cores["file"] == str(path) and no_tensor_cores["severity"] == "information"
    assert "hint-local-memory" in codes(kernels["spills"])
    assert kernels["vec_add"]["registers"] > 0 and kernels["vec_add"]["sass"]["line_info"]
    assert kernels["vec_add"]["line"] == 6 and kernels["vec_add"]["metrics"]["ptxas"]["arch"] == "sm_90"


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="needs the recorded fixtures")
async def test_kernels_option_keeps_only_the_named_ones():
    path = FIXTURES / "kernels.cu"
    report = await static_profile({"kernels.cu": path.read_text()}, "kernels.cu", {}, kernels=["tiny_grid"])
    assert [kernel["kernel"] for kernel in report["kernels"]] == ["tiny_grid"] and report["kernels"][0]["id"] == 0


@pytest.mark.slow
async def test_load_inline_hints_land_on_the_python_lines(tmp_path: Path):
    path = tmp_path / "cand.py"
    report = await static_profile({"cand.py": LOAD_INLINE_CANDIDATE}, "cand.py", {"cand.py": str(path)})
    (kernel,) = report["kernels"]
    assert kernel["kernel"] == "gather_kernel" and kernel["file"] == str(path) and kernel["line"] == 6
    local = next(f for f in kernel["findings"] if f["code"] in ("hint-local-memory", "hint-spills"))
    assert (local["file"], local["line"]) == (str(path), LOCAL_ARRAY_LINE)


async def test_a_compile_error_and_a_triton_file_are_problems_not_failures(tmp_path: Path):
    broken = await static_profile({"bad.cu": "__global__ void k() { int x = ; }\n"}, "bad.cu",
                                  {"bad.cu": str(tmp_path / "bad.cu")})
    assert broken["kernels"] == [] and "kernel-lsp check" in broken["problems"][0]["message"]
    assert broken["problems"][0]["code"] == "profile-build-failed"
    triton = await static_profile({"t.py": "import triton\n"}, "t.py")
    assert "no CUDA source" in triton["problems"][0]["message"]


async def test_a_missing_nvcc_is_a_problem(tmp_path: Path):
    settings = Settings.of(nvcc_path=str(tmp_path / "nvcc"))
    report = await static_profile({"k.cu": "__global__ void k() {}\n"}, "k.cu", settings=settings)
    assert report["kernels"] == [] and "CUDA compiler not found" in report["problems"][0]["message"]
