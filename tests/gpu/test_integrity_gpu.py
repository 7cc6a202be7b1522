"""Issue 17 on a real GPU: CUDA load_inline candidates that game the verdict (less work when timed, stale answers
from a cache, decoy kernels), each rejected with its code, verified through a real worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu import candidates as c
from tests.problems import caches_by_identity, one_output_buffer, relu_problem
from tests.gpu.test_verify_pipeline_gpu import codes, verify
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.skipif(not (c.KERNELBENCH / c.RELU_PROBLEM).is_file(),
                                 reason=f"needs the KernelBench problems at {c.KERNELBENCH}"),
              pytest.mark.timeout(900)]

SLACKS_WHEN_NOT_PROFILED = c.PRELUDE + '''
from torch.autograd import profiler

class ModelNew(nn.Module):
    calls = 0

    def forward(self, x):
        ModelNew.calls += 1
        if ModelNew.calls > 12 and not profiler._is_profiler_enabled:  # past the checks, and not recorded
            return torch.empty_like(x)
        return ops.relu(x.contiguous())
'''

SLACKS_ON_REPEATED_OBJECTS = c.PRELUDE + '''
class ModelNew(nn.Module):
    seen = []

    def forward(self, x):
        ModelNew.seen.append(x)
        if sum(t is x for t in ModelNew.seen) > 2:  # the timing loop's input sets come back again and again
            return torch.zeros_like(x)
        return ops.relu(x.contiguous())
'''

CACHES_BY_DATA_POINTER = c.PRELUDE + '''
class ModelNew(nn.Module):
    cache = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in ModelNew.cache:
            ModelNew.cache[key] = ops.relu(x.contiguous())
        return ModelNew.cache[key]
'''

CACHES_BY_IDENTITY = c.PRELUDE + caches_by_identity("ops.relu")

DECOY_ON_SCRATCH = c.relu_candidate("(ops.relu(x.contiguous()), x.clamp(min=0))[1]")
DECOY_OVERWRITTEN = c.relu_candidate("ops.relu(x.contiguous()).copy_(torch.relu(x))")


# KernelBench's ReLU takes 6.4 GB per input: a candidate that keeps its inputs or a cache of its answers runs the
# GPU out of memory within a few calls (rejected, but as run-out-of-memory), so those are verified against a
# smaller ReLU
SMALL_RELU = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(512, 16384)]


def get_init_inputs():
    return []
"""


def problem_for(candidate: str, folder: Path) -> str | Path:
    if candidate not in (CACHES_BY_DATA_POINTER, CACHES_BY_IDENTITY, SLACKS_ON_REPEATED_OBJECTS):
        return c.RELU_PROBLEM
    (folder / "small_relu.py").write_text(SMALL_RELU)
    return folder / "small_relu.py"


@pytest.mark.parametrize(("candidate", "code"), [
    (SLACKS_WHEN_NOT_PROFILED, "integrity-timed-output"),
    (SLACKS_ON_REPEATED_OBJECTS, "integrity-timed-output"),
    (CACHES_BY_DATA_POINTER, "integrity-stale-output"),
    (CACHES_BY_IDENTITY, "integrity-stale-output"),
    (DECOY_ON_SCRATCH, "integrity-output-not-from-kernel"),
    (DECOY_OVERWRITTEN, "integrity-output-not-from-kernel"),
], ids=["slacks-when-not-profiled", "slacks-on-repeated-objects", "caches-by-data-pointer", "caches-by-identity",
        "decoy-on-scratch", "decoy-overwritten"])
async def test_a_candidate_gaming_the_verdict_is_rejected_with_its_code(tmp_path: Path, candidate: str, code: str):
    result = await verify(tmp_path, candidate, problem_for(candidate, tmp_path), trials=3, timedCalls=20)
    assert result["verdict"] == "rejected", result["summary"]
    assert code in codes(result), (result["summary"], result["findings"])


async def test_the_honest_relu_passes_the_new_checks(tmp_path: Path):
    result = await verify(tmp_path, c.HONEST_RELU, c.RELU_PROBLEM, trials=3, timedCalls=20)
    assert result["verdict"] == "verified", (result["summary"], result["findings"])
    assert result["report"]["kernels"]["output_from_kernel"] is True


# issue 39's classes with CUDA load_inline candidates: a cache keyed by a sample of the values, results that reach
# the output only where NaN shows through, a batch that does half its calls, and its own summary rewritten
CACHES_BY_SAMPLED_VALUES = c.PRELUDE + '''
class ModelNew(nn.Module):
    cache = {}

    def forward(self, x):
        flat = x.reshape(-1)
        places = torch.linspace(0, flat.numel() - 1, 64, device=x.device).long()
        key = (tuple(x.shape), tuple(flat[places].tolist()))
        if key not in ModelNew.cache:
            ModelNew.cache[key] = ops.relu(x.contiguous())
        return ModelNew.cache[key].clone()
'''
DECOY_TIMES_ZERO = c.relu_candidate("x.clamp(min=0) + 0 * ops.relu(x.contiguous())")
DECOY_CLAMP_BOUND = c.relu_candidate("x.clamp(min=ops.relu(x.contiguous()) * 0)")
HALF_THE_BATCH = c.HONEST_RELU + '''
import sys
import kernel_lsp.candidate.side as side
def _half(self, request):
    sets = request["sets"]
    done = [self.timing_call(*self.timing_sets[i]) for i in sets[: max(1, len(sets) // 2)]]
    self.settle_device()
    self.batch_outputs = done + [done[0]] * (len(sets) - len(done))
    return {}
for module in (side, sys.modules["__main__"]):
    if hasattr(module, "CandidateSide"):
        module.CandidateSide.op_batch = _half
'''
@pytest.mark.parametrize(("candidate", "code", "small"), [
    (CACHES_BY_SAMPLED_VALUES, "integrity-stale-output", True),
    (DECOY_TIMES_ZERO, "integrity-output-not-from-kernel", False),
    (DECOY_CLAMP_BOUND, "integrity-output-not-from-kernel", False),
    (HALF_THE_BATCH, "integrity-timed-output", True),
], ids=["caches-by-sampled-values", "decoy-times-zero", "decoy-clamp-bound", "half-the-batch"])
async def test_issue_39s_cheats_are_rejected_with_their_codes(tmp_path: Path, candidate: str, code: str, small: bool):
    problem: str | Path = c.RELU_PROBLEM
    if small:  # a launch-bound size: the judge's batches hold many calls, and a cache holds many answers cheaply
        (tmp_path / "small.py").write_text(relu_problem("torch.randn(64, 1024)"))
        problem = tmp_path / "small.py"
    result = await verify(tmp_path, candidate, problem, trials=4, timedCalls=40)
    assert result["verdict"] == "rejected", result["summary"]
    assert code in codes(result), (result["summary"], result["findings"])


# one output buffer written again by every call: by the extension into a tensor it keeps, and by a CUDA graph
# replayed on a static input (PyTorch's own recipe); each answer lasts until the next call
REUSES_ONE_BUFFER = c.PRELUDE + one_output_buffer("ops.relu_out(x, self.out)")
CUDA_GRAPH = c.PRELUDE + '''
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.graph = None

    def forward(self, x):
        if self.graph is None or self.static_x.shape != x.shape:
            self.static_x = x.contiguous().clone()
            ops.relu(self.static_x)  # warm-up before capture, on the current stream (a side stream is rejected)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_y = ops.relu(self.static_x)
        self.static_x.copy_(x)
        self.graph.replay()
        return self.static_y
'''


@pytest.mark.parametrize("candidate", [REUSES_ONE_BUFFER, CUDA_GRAPH], ids=["reused-buffer", "cuda-graph"])
async def test_one_output_buffer_for_every_call_is_verified(tmp_path: Path, candidate: str):
    (tmp_path / "small.py").write_text(relu_problem("torch.randn(64, 1024)"))  # launch bound: long batches
    result = await verify(tmp_path, candidate, tmp_path / "small.py", trials=3, timedCalls=40)
    assert result["verdict"] == "verified", (result["summary"], result["findings"])
    timing = result["report"]["timing"]["candidate"]
    assert timing["batch"] > 1 and timing["reused_output"] is True, timing
    assert "verify-output-copied" in codes(result)


# a void extension function (its result in a tensor passed to it): honest, and as a decoy on a scratch tensor
VOID_RELU = c.relu_candidate("(lambda y: (ops.relu_out(x.contiguous(), y), y)[1])(torch.empty_like(x))")
VOID_DECOY = c.relu_candidate("(ops.relu_out(x.contiguous(), torch.empty_like(x)), x.clamp(min=0))[1]")


async def test_a_void_extensions_result_is_ablated_in_the_tensor_it_wrote(tmp_path: Path):
    honest = await verify(tmp_path, VOID_RELU, c.RELU_PROBLEM, trials=2, timedCalls=10)
    assert honest["verdict"] == "verified", (honest["summary"], honest["findings"])
    assert honest["report"]["kernels"]["output_from_kernel"] is True
    decoy = await verify(tmp_path, VOID_DECOY, c.RELU_PROBLEM, trials=2, timedCalls=10)
    assert decoy["verdict"] == "rejected" and "integrity-output-not-from-kernel" in codes(decoy), decoy["summary"]


# issue 39's library work: its own kernel makes a zero bias (ReLU of -1s), cuBLAS does the 4096³ product
LIBRARY_ADDMM = c.PRELUDE + '''

class ModelNew(nn.Module):
    def forward(self, A, B):
        return torch.addmm(ops.relu(-torch.ones(B.shape[1], device=B.device)), A, B)
'''
LIBRARY_LINEAR = c.PRELUDE + '''
import torch.nn.functional as F

class ModelNew(nn.Module):
    def forward(self, A, B):
        return F.linear(A, B.t(), ops.relu(-torch.ones(B.shape[1], device=B.device)))
'''
# KernelBench level 2's conv + ReLU + bias: cuDNN's convolution, then its own fused epilogue (stays verified)
CONV_EPILOGUE = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ops = load_inline(name="kernel_lsp_gpu_test_epilogue", cpp_sources="torch::Tensor relu_bias(torch::Tensor x, torch::Tensor bias);",
                  cuda_sources=r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu_bias_kernel(const float* __restrict__ x, const float* __restrict__ bias, float* __restrict__ y,
                                 long long n, long long hw, int channels) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = fmaxf(x[i], 0.f) + bias[(i / hw) % channels];
}

torch::Tensor relu_bias(torch::Tensor x, torch::Tensor bias) {
    auto y = torch::empty_like(x);
    long long n = x.numel(), hw = x.size(2) * x.size(3);
    int blocks = (int)std::min<long long>((n + 255) / 256, 132LL * 32);
    relu_bias_kernel<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), bias.data_ptr<float>(),
                                                                            y.data_ptr<float>(), n, hw, (int)x.size(1));
    return y;
}
""", functions=["relu_bias"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return ops.relu_bias(self.conv(x).contiguous(), self.bias.contiguous())
'''


@pytest.mark.parametrize("candidate", [LIBRARY_ADDMM, LIBRARY_LINEAR], ids=["addmm", "linear"])
async def test_library_work_is_a_warning_for_a_person_and_a_reject_for_the_reward(tmp_path: Path, candidate: str):
    from kernel_lsp.kinds.verify import VerifyOutcome
    from kernel_lsp.worker.protocol import Result

    result = await verify(tmp_path, candidate, c.MATMUL_PROBLEM, trials=2, timedCalls=10)
    work = result["report"]["kernels"]["work"]
    assert result["verdict"] == "verified", (result["summary"], result["findings"])
    assert work["own_share"] < 0.01 and work["how"].startswith("device time"), work
    assert "matrix multiply" in work["library_work"], work
    assert [f["severity"] for f in result["findings"] if f["code"] == "integrity-library-work"] == [2]  # a warning
    metrics = {key: result[key] for key in ("verdict", "summary", "report")}
    assert VerifyOutcome.of(Result("ok", result["findings"], metrics), for_reward=True).verdict == "rejected"


async def test_a_cudnn_convolution_with_its_own_fused_epilogue_stays_verified(tmp_path: Path):
    result = await verify(tmp_path, CONV_EPILOGUE, "level2/1_Conv2D_ReLU_BiasAdd.py", trials=2, timedCalls=10)
    work = result["report"]["kernels"]["work"]
    assert result["verdict"] == "verified", (result["summary"], result["findings"])
    assert work["own_share"] >= 0.05 and work["library_work"] is None, work
    assert "integrity-library-work" not in codes(result) and "own kernels" in result["summary"]
