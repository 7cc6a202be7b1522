"""Candidates with the memory and ordering bugs compute-sanitizer finds, and a clean one (issue 22).

Each is a whole problem in one file (Model, ModelNew, get_inputs), so the profile driver runs it without a
reference. `bug_line(text)` is the 1-based line of the candidate's file marked BUG (the line a finding
must land on). tests/gpu/record_sanitizer.py recorded compute-sanitizer's output over these into
tests/fixtures/sanitizer/, and the GPU tests sanitize them live.
"""

from __future__ import annotations

HEAD = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
'''

RELU_TAIL = r'''
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    KERNEL<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(name="EXTENSION", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=CUDA_SOURCE,
                  functions=["run"])


class Model(nn.Module):
    def forward(self, x):
        return REFERENCE


class ModelNew(nn.Module):
    def forward(self, x):
        PREPARE
        return ext.run(x.contiguous())


def get_inputs():
    return [torch.randn(SHAPE)]


def get_init_inputs():
    return []
'''


def _candidate(extension: str, kernel: str, body: str, reference: str = "torch.relu(x)",
               shape: str = "1 << 20", prepare: str = "") -> str:
    tail = (RELU_TAIL.replace("KERNEL", kernel).replace("EXTENSION", extension).replace("REFERENCE", reference)
            .replace("SHAPE", shape).replace("PREPARE", prepare or "pass"))
    return HEAD + body + tail


CLEAN = _candidate("sanitize_clean", "relu_clean", r'''
__global__ void relu_clean(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}
''')

# passes every correctness trial: the value read past the end only matters if it is exactly 1234.5
OUT_OF_BOUNDS = _candidate("sanitize_oob", "relu_peek", r'''
__global__ void relu_peek(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        float next = x[i + 1];  // BUG: the last thread reads one element past the end
        y[i] = next == 1234.5f ? v : fmaxf(v, 0.f);
    }
}
''')

# many threads read past the end: more errors than compute-sanitizer prints
MANY_OUT_OF_BOUNDS = _candidate("sanitize_many", "relu_far", r'''
__global__ void relu_far(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float far = x[i + 4096];  // BUG: the last 4096 threads read past the end
        y[i] = far == 1234.5f ? 0.f : fmaxf(x[i], 0.f);
    }
}
''')

# a block sum whose first tree step reads partial[] before the other warps wrote it
RACE = _candidate("sanitize_race", "row_sum", r'''
__global__ void row_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
    __shared__ float partial[256];
    int t = threadIdx.x, row = blockIdx.x;
    partial[t] = x[row * 256 + t];
    for (int stride = 128; stride > 0; stride >>= 1) {
        if (t < stride) partial[t] += partial[t + stride];  // BUG: no __syncthreads() between the store and this read
        __syncthreads();
    }
    if (t == 0) out[row] = partial[0];
}
''', reference="x.view(-1, 256).sum(dim=1).repeat_interleave(256) * 0 + torch.relu(x)")

# half the tile is never written, then the whole tile is read. compute-sanitizer 2025.3 finds nothing here
# (initcheck checks global memory only): recorded in tests/fixtures/sanitizer/uninit_shared.*.log. kernel-lsp's
# shared-init finds it, on the `__shared__` line: with every SM's shared memory filled with one pattern, then
# another, half the output followed the fill (tests/gpu/smem_poison_probe.py on an H100, tests/gpu/RESULTS.md)
UNINIT_SHARED = _candidate("sanitize_uninit_shared", "scale_tile", r'''
__global__ void scale_tile(const float* __restrict__ x, float* __restrict__ y, int n) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x < 128 && i < n) tile[threadIdx.x] = x[i];
    __syncthreads();
    if (i < n) y[i] = fmaxf(tile[threadIdx.x], 0.f);  // BUG: tile[128..255] was never written
}
''')

# reads its output (torch::empty_like, never written) before writing it: initcheck's uninitialised global read.
# One thread in 4096 reads (256 errors): with every thread reading (2^20 errors) initcheck was still running when
# the device call's time limit stopped it (H100, tests/gpu/RESULTS.md, 2026-12-05)
UNINIT_GLOBAL = _candidate("sanitize_uninit_global", "relu_reread", r'''
__global__ void relu_reread(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float old = i % 4096 == 0 ? y[i] : 0.f;  // BUG: y is torch::empty_like(x): nothing wrote it yet
        y[i] = old == 1234.5f ? 0.f : fmaxf(x[i], 0.f);
    }
}
''')

# a barrier only the even threads of each warp reach
DIVERGENT_BARRIER = _candidate("sanitize_sync", "pair_swap", r'''
__global__ void pair_swap(const float* __restrict__ x, float* __restrict__ y, int n) {
    __shared__ float s[256];
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.f;
    if (t % 2 == 0) __syncthreads();  // BUG: the odd threads skip the barrier
    if (i < n) y[i] = fmaxf(s[t], 0.f);
}
''')

# the user's kernel is clean; PyTorch's own reduction reads memory nobody wrote (torch.empty)
LIBRARY_UNINIT = _candidate("sanitize_library", "relu_lib", r'''
__global__ void relu_lib(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}
''', prepare="torch.empty(4096, device=x.device).max()")

# reads a shared array it never writes and multiplies it by zero: right whenever the stale values are finite (as
# what earlier kernels left there usually is), NaN when they are NaN. The verifier's NaN fill of shared memory
# before its runs catches it (tests/gpu/test_verify_pipeline_gpu.py); shared-init's finite patterns cannot (0 * A
# and 0 * B are both 0). The never-true store keeps the compiler from taking the array for never written.
STALE_SHARED = _candidate("verify_stale_shared", "relu_stale", r'''
__global__ void relu_stale(const float* __restrict__ x, float* __restrict__ y, int n) {
    __shared__ float spare[256];
    if (n < 0) spare[threadIdx.x] = 1.f;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) + 0.f * spare[threadIdx.x];  // BUG: spare was never written
}
''')

CANDIDATES = {"clean": CLEAN, "oob": OUT_OF_BOUNDS, "many": MANY_OUT_OF_BOUNDS, "race": RACE,
              "uninit_shared": UNINIT_SHARED, "uninit_global": UNINIT_GLOBAL, "sync": DIVERGENT_BARRIER,
              "library": LIBRARY_UNINIT}


def bug_line(text: str) -> int | None:
    """The 1-based line marked BUG in a candidate, None for a clean one."""
    for number, line in enumerate(text.splitlines(), 1):
        if "// BUG" in line:
            return number
    return None


# a standalone program with its own main(): the last block writes past the end of its output
# n = 1000000 floats is not a multiple of cudaMalloc's 2 MiB granule, so the access one past the end lands in the
# allocation's rounding: the program runs and prints "ok" (as such a bug does in the field), and only memcheck,
# which knows each allocation's exact size, sees it. (With n = 2^20 the plain run faults: illegal address.)
STANDALONE_ARGS = ["1000000"]
STANDALONE = r'''// kernel-lsp: build=-O2 run=1000000
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = 2.f * x[i];  // BUG: i == n writes (and reads) one past the end
}

int main(int argc, char** argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1 << 20;
    float *x, *y;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&y, n * sizeof(float));
    cudaMemset(x, 0, n * sizeof(float));
    for (int rep = 0; rep < 3; ++rep) scale<<<(n + 256) / 256, 256>>>(x, y, n);
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(err));
        return 1;
    }
    printf("ok %d\n", n);
    cudaFree(x);
    cudaFree(y);
    return 0;
}
'''
