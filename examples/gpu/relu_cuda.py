# kernel-lsp: reference=relu.py
"""A CUDA C++ candidate through load_inline: float4 loads and stores, a grid-stride loop, on PyTorch's stream."""
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

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat && x.numel() % 4 == 0, "relu: float32, numel % 4 == 0");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    long long n4 = x.numel() / 4;
    int blocks = (int)std::min<long long>((n4 + 255) / 256, 132LL * 32);
    relu_kernel<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(x.data_ptr<float>()), reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
    return y;
}
"""

ext = load_inline(name="example_relu_cuda", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                  cuda_sources=CUDA_SOURCE, functions=["relu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x)
