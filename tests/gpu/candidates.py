"""CUDA load_inline candidates for KernelBench problems, honest and cheating, shared by GPU tests and benchmarks.

Every candidate builds the same extension (same name and sources), so torch builds it once and the rest load it.
"""

from __future__ import annotations

from tests.paths import KERNELBENCH  # noqa: F401 - the GPU tests and benchmarks read it from here

RELU_PROBLEM = "level1/19_ReLU.py"
MATMUL_PROBLEM = "level1/1_Square_matrix_multiplication_.py"

PRELUDE = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu_kernel(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        float4 v = x[i];
        y[i] = make_float4(fmaxf(v.x, 0.f), fmaxf(v.y, 0.f), fmaxf(v.z, 0.f), fmaxf(v.w, 0.f));
    }
}

static void launch_relu(const torch::Tensor& x, torch::Tensor& y, long long n4, cudaStream_t stream) {
    int blocks = (int)std::min<long long>((n4 + 255) / 256, 132LL * 32);
    relu_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(x.data_ptr<float>()),
                                            reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
}

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    launch_relu(x, y, x.numel() / 4, at::cuda::getCurrentCUDAStream());
    return y;
}

torch::Tensor relu_half_written(torch::Tensor x) {  // writes only the first half of its output
    auto y = torch::empty_like(x);
    launch_relu(x, y, x.numel() / 8, at::cuda::getCurrentCUDAStream());
    return y;
}

void relu_out(torch::Tensor x, torch::Tensor y) {  // a void function: the result in a tensor passed to it
    launch_relu(x, y, x.numel() / 4, at::cuda::getCurrentCUDAStream());
}

torch::Tensor relu_in_place(torch::Tensor x) {  // the result over the caller's input
    launch_relu(x, x, x.numel() / 4, at::cuda::getCurrentCUDAStream());
    return x;
}

torch::Tensor relu_side_stream(torch::Tensor x) {  // work on another stream, never joined
    auto y = torch::empty_like(x);
    static cudaStream_t side = nullptr;
    if (side == nullptr) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    launch_relu(x, y, x.numel() / 4, side);
    return y;
}

#define TILE 32
__global__ void matmul_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int n) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float sum = 0.f;
    for (int k0 = 0; k0 < n; k0 += TILE) {
        as[threadIdx.y][threadIdx.x] = a[(long long)row * n + k0 + threadIdx.x];
        bs[threadIdx.y][threadIdx.x] = b[(long long)(k0 + threadIdx.y) * n + col];
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TILE; ++k) sum += as[threadIdx.y][k] * bs[k][threadIdx.x];
        __syncthreads();
    }
    c[(long long)row * n + col] = sum;
}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    int n = a.size(0);
    auto c = torch::empty({n, n}, a.options());
    dim3 block(TILE, TILE), grid(n / TILE, n / TILE);
    matmul_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                                                          c.data_ptr<float>(), n);
    return c;
}
"""

CPP_SOURCE = """
torch::Tensor relu(torch::Tensor x);
torch::Tensor relu_half_written(torch::Tensor x);
torch::Tensor relu_in_place(torch::Tensor x);
void relu_out(torch::Tensor x, torch::Tensor y);
torch::Tensor relu_side_stream(torch::Tensor x);
torch::Tensor matmul(torch::Tensor a, torch::Tensor b);
"""

ops = load_inline(name="kernel_lsp_gpu_test_ops", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                  functions=["relu", "relu_half_written", "relu_out", "relu_in_place", "relu_side_stream", "matmul"],
                  extra_cuda_cflags=["-O3"], verbose=False)
'''


def relu_candidate(call: str) -> str:
    return PRELUDE + f'''

class ModelNew(nn.Module):
    def forward(self, x):
        return {call}
'''


HONEST_RELU = relu_candidate("ops.relu(x.contiguous())")
HALF_WRITTEN_RELU = relu_candidate("ops.relu_half_written(x.contiguous())")
IN_PLACE_RELU = relu_candidate("ops.relu_in_place(x)")
SIDE_STREAM_RELU = relu_candidate("ops.relu_side_stream(x.contiguous())")
STOCK_RELU = relu_candidate("torch.relu(x)")
HONEST_MATMUL = PRELUDE + '''

class ModelNew(nn.Module):
    def forward(self, A, B):
        return ops.matmul(A.contiguous(), B.contiguous())
'''
