"""The worker on a real GPU: CUDA failures in candidates are reported for what they are, and the next
job on the same worker succeeds. Skipped where there is no NVIDIA GPU."""

from __future__ import annotations

import importlib.util

import pytest

from kernel_lsp.worker.client import WorkerClient
from kernel_lsp.worker.protocol import Job


def gpu_present() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch")]

TRITON_BAD_STORE = '''
import torch, triton, triton.language as tl

@triton.jit
def far_store(x_ptr):
    tl.store(x_ptr + (1 << 40), 1.0)  # far outside any allocation

def main():
    x = torch.zeros(16, device="cuda")
    far_store[(1,)](x)
    torch.cuda.synchronize()
    return "unreachable"
'''

TRITON_SPIN = '''
import torch, triton, triton.language as tl

@triton.jit
def spin(flag_ptr):
    while tl.load(flag_ptr, volatile=True) == 0:
        pass

def main():
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    spin[(1,)](flag)
    torch.cuda.synchronize()
    return "unreachable"
'''

ALLOCATE_TOO_MUCH = '''
import torch

def main():
    return torch.empty(1 << 44, dtype=torch.uint8, device="cuda").numel()
'''

OVER_THE_CAP = '''
import torch

def main():
    total = torch.cuda.get_device_properties(0).total_memory
    return torch.empty(int(total * 0.6), dtype=torch.uint8, device="cuda").numel()
'''

GOOD = '''
import torch, triton, triton.language as tl

@triton.jit
def double(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

def main():
    x = torch.ones(1000, device="cuda")
    double[(4,)](x, 1000, BLOCK=256)
    return float(x.sum().item())
'''


def candidate(source: str, limits: dict | None = None) -> Job:
    return Job("run-python", {"candidate.py": source},
               {"file": "candidate.py", "function": "main", "usesCuda": True,
                "origins": {"candidate.py": "/work/candidate.py"}, "limits": limits or {}}, "")


@pytest.fixture
async def client():
    worker = WorkerClient()
    yield worker
    await worker.close()


async def run_and_recover(client: WorkerClient, job: Job) -> dict:
    result = await client.run(job, timeout_s=300)
    assert result.status == "ok", result.error
    good = await client.run(candidate(GOOD), timeout_s=300)
    assert good.status == "ok" and good.artifacts["sandbox_run"]["value"] == 2000.0, good.artifacts
    return result.artifacts["sandbox_run"]


async def test_device_info_reports_the_gpu(client: WorkerClient):
    info = await client.run(Job("device-info", {}, {}, ""), timeout_s=300)
    assert info.metrics["cudaAvailable"] is True and info.error is None
    device = info.metrics["device"]
    assert device["computeCapability"] and device["memoryTotalMiB"] > 1000
    assert info.metrics["versions"]["cuda"] and info.metrics["versions"]["driver"]


async def test_illegal_address_is_a_cuda_error(client: WorkerClient):
    outcome = await run_and_recover(client, candidate(TRITON_BAD_STORE))
    assert outcome["status"] == "cuda-error", outcome
    assert "illegal memory access" in outcome["message"]


async def test_kernel_that_never_ends_times_out(client: WorkerClient):
    outcome = await run_and_recover(client, candidate(TRITON_SPIN, {"wallTimeS": 20}))
    assert outcome["status"] == "timeout", outcome


async def test_gpu_out_of_memory(client: WorkerClient):
    outcome = await run_and_recover(client, candidate(ALLOCATE_TOO_MUCH))
    assert outcome["status"] == "out-of-memory", outcome


async def test_gpu_memory_cap_applies(client: WorkerClient):
    outcome = await run_and_recover(client, candidate(OVER_THE_CAP, {"gpuMemoryFraction": 0.5}))
    assert outcome["status"] == "out-of-memory", outcome


SCALE_CUDA = r'''
__global__ void scale_kernel(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
void scale(torch::Tensor x, double s) {
    int n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), (float)s, n);
}
'''

USE_EXTENSION = '''
import importlib, sys
import torch

def main(build_directory):
    sys.path.insert(0, build_directory)
    ext = importlib.import_module("kl_scale")
    x = torch.ones(1000, device="cuda")
    ext.scale(x, 3.0)
    return float(x.sum().item())
'''


async def test_cuda_extension_built_once_then_run(client: WorkerClient, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(tmp_path))
    build = Job("build-extension", {"main.cpp": "void scale(torch::Tensor x, double s);", "cuda.cu": SCALE_CUDA},
                {"name": "kl_scale", "functions": ["scale"], "extraCudaCflags": ["-O3"]}, "")
    first = await client.run(build, timeout_s=900)
    assert first.findings == [] and first.metrics["cached"] is False, first.artifacts
    again = await client.run(build, timeout_s=900)
    assert again.metrics["cached"] is True
    assert again.metrics["durationS"] < first.metrics["durationS"] / 3
    job = Job("run-python", {"use.py": USE_EXTENSION},
              {"file": "use.py", "function": "main", "usesCuda": True,
               "kwargs": {"build_directory": first.metrics["buildDirectory"]}}, "")
    used = await client.run(job, timeout_s=300)
    assert used.artifacts["sandbox_run"]["value"] == 3000.0, used.artifacts
