"""The "profile" job on a real GPU through a real worker: ncu on a load_inline candidate's own kernels, their SASS,
the reference's PyTorch kernels, energy per call, ceilings and the roofline chart; and the CLI on top."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_lsp.cli import main
from kernel_lsp.kinds.profile import profile_job
from kernel_lsp.worker.client import WorkerClient
from profilers.hints.ncu_rules import ncu_hints
from profilers.ncu import find_ncu, import_command, ncu_command, parse_details_csv, parse_raw_csv, run_ncu, with_raw
from tests.conftest import FIXTURES
from tests.gpu import candidates
from tests.gpu.test_worker_gpu import gpu_present
from tests.unit.test_ncu_rules import KNOWN_PROBLEM

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.skipif(shutil.which("ncu") is None and not Path("/usr/local/cuda/bin/ncu").exists(),
                                 reason="needs Nsight Compute (ncu)"),
              pytest.mark.timeout(900)]

KERNELS = r'''
// one thread per output: no shared tiles, no tensor cores
__global__ void matmul_naive(const float* a, const float* b, float* c, int n) {
    int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < n && col < n) {
        float s = 0.f;
        for (int k = 0; k < n; ++k) s += a[row * n + k] * b[k * n + col];
        c[row * n + col] = s;
    }
}
// four blocks, whatever the size: most SMs idle
__global__ void tiny_grid_scale(const float* x, float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = 2.f * x[i];
}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    int n = a.size(0);
    auto c = torch::empty_like(a);
    dim3 block(16, 16), grid((n + 15) / 16, (n + 15) / 16);
    matmul_naive<<<grid, block>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), n);
    return c;
}

torch::Tensor scale(torch::Tensor x) {
    auto y = torch::empty_like(x);
    tiny_grid_scale<<<4, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
'''

CANDIDATE = f'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="profile_gpu_ext", cpp_sources="torch::Tensor matmul(torch::Tensor a, torch::Tensor b);\\n"
                  "torch::Tensor scale(torch::Tensor x);", cuda_sources=r"""{KERNELS}""",
                  functions=["matmul", "scale"])


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b) * 2.0


class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.scale(ext.matmul(a, b))


def get_inputs():
    return [torch.rand(1024, 1024), torch.rand(1024, 1024)]


def get_init_inputs():
    return []
'''


async def profile(tmp_path: Path, **options) -> tuple[dict, list, dict]:
    path = tmp_path / "cand.py"
    path.write_text(CANDIDATE)
    client = WorkerClient(job_timeout_s=900)
    try:
        result = await client.run(profile_job(path, None, options))
    finally:
        await client.close()
    assert result.status == "ok", result.error
    return result.metrics["profile"], result.findings, result.artifacts


async def test_ncu_profiles_the_candidates_own_kernels_with_their_hints(tmp_path: Path):
    report, findings, artifacts = await profile(tmp_path)
    assert report["source"] == "ncu", report["problems"]
    kernels = {kernel["kernel"]: kernel for kernel in report["kernels"]}
    assert set(kernels) == {"matmul_naive", "tiny_grid_scale"}  # PyTorch's own kernels are filtered out
    matmul, tiny = kernels["matmul_naive"], kernels["tiny_grid_scale"]
    assert matmul["duration_ms"] > tiny["duration_ms"] > 0 and matmul["registers"] > 0
    assert matmul["bound"] in ("memory", "compute") and matmul["occupancy_pct"] > 0
    assert "hint-no-tensor-cores" in {f["code"] for f in matmul["findings"]}  # from the extension's SASS
    assert matmul["sass"]["fma"] > 0 and matmul["sass"]["tensor_core"] == {}
    assert "hint-small-grid" in {f["code"] for f in tiny["findings"]} and tiny["grid"] == [4, 1, 1]
    assert report["ceilings"]["dram_bandwidth_gbs"] > 1000 and report["gpu"]
    assert artifacts["roofline_svg"].startswith("<svg")
    assert {f["code"] for f in findings} >= {"hint-no-tensor-cores", "hint-small-grid"}
    assert all(f["uri"].endswith("/cand.py") and f["severity"] in (3, 4) for f in findings)


async def test_reference_kernels_and_energy_come_with_the_profile(tmp_path: Path):
    report, _, _ = await profile(tmp_path, kernels=["tiny_grid_scale"], launchCount=1)
    assert [kernel["kernel"] for kernel in report["kernels"]] == ["tiny_grid_scale"]
    reference = report["reference_kernels"]
    assert reference and all(k["device_ms"] > 0 and k["calls"] >= 1 for k in reference)
    assert any("gemm" in k["name"].lower() or "sm90" in k["name"].lower() for k in reference)
    assert report["energy"]["mj_per_call"] > 0 and report["energy"]["calls"] > 0
    assert report["kernels"][0]["energy_mj_per_call"] == report["energy"]["mj_per_call"]
    assert report["reference_energy"]["mj_per_call"] > 0 and report["reference_energy"]["calls"] > 0


def test_the_cli_prints_the_profile(tmp_path: Path, capsys):
    path = tmp_path / "cand.py"
    path.write_text(CANDIDATE)
    assert main(["profile", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"] == "ncu" and report["summary"].startswith("2 kernels (ncu on ")
    assert main(["profile", str(path), "--kernel", "matmul_naive"]) == 0
    out = capsys.readouterr().out
    assert "matmul_naive" in out and "registers, occupancy" in out and "reference forward" in out


def test_the_fixture_kernels_profiled_live_yield_their_known_problems(tmp_path: Path):
    """The seven kernels of the recorded fixture, built and profiled here with the default sections: each must
    still yield the problem it was written to have, from ncu's output on this GPU rather than the recording."""
    program = tmp_path / "k"
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    subprocess.run([nvcc, "-arch=sm_90", "-lineinfo", "-o", str(program), str(FIXTURES / "kernels.cu")], check=True)
    ncu = find_ncu()
    report = tmp_path / "rep.ncu-rep"
    run_ncu(ncu_command([str(program)], ncu=ncu, report=report), timeout_s=600, cwd=tmp_path)
    details = parse_details_csv(run_ncu(import_command(report, "details", ncu=ncu)))
    raw = parse_raw_csv(run_ncu(import_command(report, "raw", ncu=ncu)))
    launches = {launch.base_name: launch for launch in with_raw(details, raw)}
    assert set(launches) == set(KNOWN_PROBLEM)
    missing = {kernel: sorted({hint.code for hint in ncu_hints(launches[kernel])})
               for kernel, code in KNOWN_PROBLEM.items()
               if code not in {hint.code for hint in ncu_hints(launches[kernel])}}
    assert not missing, missing


async def test_a_kernelbench_candidate_is_profiled_against_its_reference(tmp_path: Path):
    """The honest load_inline ReLU for KernelBench level1/19_ReLU, its reference in another folder."""
    candidate = tmp_path / "19_ReLU_new.py"
    candidate.write_text(candidates.HONEST_RELU)
    client = WorkerClient(job_timeout_s=900)
    try:
        result = await client.run(profile_job(candidate, candidates.KERNELBENCH / candidates.RELU_PROBLEM,
                                              {"launchCount": 1}))
    finally:
        await client.close()
    assert result.status == "ok", result.error
    report = result.metrics["profile"]
    assert report["source"] == "ncu", report["problems"]
    assert [kernel["kernel"] for kernel in report["kernels"]] == ["relu_kernel"]
    relu = report["kernels"][0]
    assert relu["bound"] == "memory" and relu["duration_ms"] > 0
    assert relu["sass"]["global_loads"].get("128"), relu["sass"]  # float4 loads
    assert report["reference_kernels"] and all(k["device_ms"] > 0 for k in report["reference_kernels"])
