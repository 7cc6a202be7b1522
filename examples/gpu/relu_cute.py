# kernel-lsp: reference=relu.py
"""A CuTe C++ candidate through load_inline: each thread copies 4 floats as one CuTe register fragment
(vectorized 128-bit copies), the tail element by element. CuTe's headers come from the nvidia-cutlass package
(pip install 'kernel-lsp[cutlass]'), found here as a user's code finds them."""
import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

import cutlass_library

CUTLASS_INCLUDE = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")

ext = load_inline(name="example_relu_cute", cpp_sources="torch::Tensor relu(torch::Tensor x);", cuda_sources=r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cute/tensor.hpp>

using namespace cute;

// Each thread takes kVec contiguous floats as one CuTe register fragment; the tail (n not a multiple of kVec)
// is done element by element.
template <int kVec>
__global__ void cute_relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t tiles = n / kVec;
    Tensor gx = make_tensor(make_gmem_ptr(x), make_layout(make_shape(Int<kVec>{}, tiles)));  // (kVec, tiles)
    Tensor gy = make_tensor(make_gmem_ptr(y), make_layout(make_shape(Int<kVec>{}, tiles)));
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < tiles; t += stride) {
        Tensor fragment = make_tensor<float>(Shape<Int<kVec>>{});
        copy(AutoVectorizingCopyWithAssumedAlignment<128>{}, gx(_, t), fragment);
        CUTE_UNROLL
        for (int i = 0; i < kVec; ++i) fragment(i) = fmaxf(fragment(i), 0.f);
        copy(AutoVectorizingCopyWithAssumedAlignment<128>{}, fragment, gy(_, t));
    }
    for (int64_t i = tiles * kVec + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = fmaxf(x[i], 0.f);
    }
}

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "relu: a float32 CUDA tensor");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    int blocks = (int)std::min<int64_t>((n / 4 + 255) / 256 + 1, 132 * 32);
    cute_relu_kernel<4><<<blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
""", functions=["relu"],
                  extra_include_paths=[CUTLASS_INCLUDE], extra_cuda_cflags=["--expt-relaxed-constexpr"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x)
