"""Honest CuTe candidates for KernelBench problems, for the GPU tests of issue 20: CuTe C++ through load_inline (an
elementwise ReLU, read from examples/gpu, and a tiled TF32 tensor-core GEMM) and a CuTe DSL ReLU (examples/gpu).
They run on the GPU machine."""

from __future__ import annotations

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "gpu"

# CuTe's headers come with the nvidia-cutlass package; the candidate finds them as a user's would.
_PRELUDE = r'''
import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

import cutlass_library

CUTLASS_INCLUDE = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
'''




def _example(name: str) -> str:
    """examples/gpu/NAME without its `# kernel-lsp: reference=` line (the tests name the KernelBench problem): the
    candidate a user runs from the examples is the one tested here."""
    text = (EXAMPLES / name).read_text()
    return text.split("\n", 1)[1] if text.startswith("# kernel-lsp:") else text


def _candidate(name: str, declaration: str, source: str, function: str, arguments: str) -> str:
    """A KernelBench ModelNew whose forward is the load_inline extension's `function` with CuTe's headers."""
    return _PRELUDE + f'''
ext = load_inline(name="{name}", cpp_sources="{declaration}", cuda_sources=r"""{source}""", functions=["{function}"],
                  extra_include_paths=[CUTLASS_INCLUDE], extra_cuda_cflags=["--expt-relaxed-constexpr"])


class ModelNew(nn.Module):
    def forward(self, {arguments}):
        return ext.{function}({arguments})
'''


CUTE_RELU = _example("relu_cute.py")

CUTE_GEMM_SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cute/tensor.hpp>

using namespace cute;

// C = A B for row-major float32 A (M,K), B (K,N): 128x128 tiles of C per 256-thread block, K in steps of 32
// through shared memory, SM80 TF32 tensor-core MMAs (2x4 warps), float accumulators.
template <class TiledMma, class CopyA, class CopyB, class SmemLayoutA, class SmemLayoutB>
__global__ void __launch_bounds__(256)
cute_tf32_gemm(const float* A, const float* B, float* C, int M, int N, int K, TiledMma mma, CopyA copy_a,
               CopyB copy_b, SmemLayoutA sA_layout, SmemLayoutB sB_layout) {
    Tensor mA = make_tensor(make_gmem_ptr(A), make_shape(M, K), make_stride(K, Int<1>{}));   // (M,K) K-major
    Tensor mB = make_tensor(make_gmem_ptr(B), make_shape(N, K), make_stride(Int<1>{}, N));   // (N,K) N-major
    Tensor mC = make_tensor(make_gmem_ptr(C), make_shape(M, N), make_stride(N, Int<1>{}));   // (M,N)

    auto tiler = make_shape(Int<128>{}, Int<128>{}, Int<32>{});
    auto coord = make_coord(blockIdx.x, blockIdx.y, _);
    Tensor gA = local_tile(mA, tiler, coord, Step<_1, X, _1>{});  // (128,32,k)
    Tensor gB = local_tile(mB, tiler, coord, Step< X, _1, _1>{}); // (128,32,k)
    Tensor gC = local_tile(mC, tiler, coord, Step<_1, _1, X>{});  // (128,128)

    __shared__ float smem_a[cosize_v<SmemLayoutA>];
    __shared__ float smem_b[cosize_v<SmemLayoutB>];
    Tensor sA = make_tensor(make_smem_ptr(smem_a), sA_layout);
    Tensor sB = make_tensor(make_smem_ptr(smem_b), sB_layout);

    auto thr_copy_a = copy_a.get_slice(threadIdx.x);
    Tensor tAgA = thr_copy_a.partition_S(gA);
    Tensor tAsA = thr_copy_a.partition_D(sA);
    auto thr_copy_b = copy_b.get_slice(threadIdx.x);
    Tensor tBgB = thr_copy_b.partition_S(gB);
    Tensor tBsB = thr_copy_b.partition_D(sB);

    auto thr_mma = mma.get_slice(threadIdx.x);
    Tensor tCsA = thr_mma.partition_A(sA);
    Tensor tCsB = thr_mma.partition_B(sB);
    Tensor tCgC = thr_mma.partition_C(gC);
    Tensor tCrC = thr_mma.make_fragment_C(tCgC);
    clear(tCrC);

    int k_tiles = size<2>(gA);
    for (int k = 0; k < k_tiles; ++k) {
        copy(copy_a, tAgA(_, _, _, k), tAsA);
        copy(copy_b, tBgB(_, _, _, k), tBsB);
        __syncthreads();
        gemm(mma, tCsA, tCsB, tCrC);
        __syncthreads();
    }
    copy(tCrC, tCgC);
}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda() && a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat,
                "matmul: float32 CUDA tensors");
    a = a.contiguous();
    b = b.contiguous();
    int M = a.size(0), K = a.size(1), N = b.size(1);
    TORCH_CHECK(b.size(0) == K, "matmul: inner sizes differ");
    TORCH_CHECK(M % 128 == 0 && N % 128 == 0 && K % 32 == 0, "matmul: M and N multiples of 128, K of 32");
    auto c = torch::empty({M, N}, a.options());
    TiledMMA mma = make_tiled_mma(SM80_16x8x8_F32TF32TF32F32_TN{}, Layout<Shape<_2, _4, _1>>{});
    auto copy_a = make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, float>{},
                                  Layout<Shape<_32, _8>, Stride<_8, _1>>{}, Layout<Shape<_1, _4>>{});
    auto copy_b = make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, float>{},
                                  Layout<Shape<_32, _8>, Stride<_1, _32>>{}, Layout<Shape<_4, _1>>{});
    auto sA = make_layout(make_shape(Int<128>{}, Int<32>{}), make_stride(Int<36>{}, Int<1>{}));   // padded rows
    auto sB = make_layout(make_shape(Int<128>{}, Int<32>{}), make_stride(Int<1>{}, Int<132>{}));  // padded columns
    dim3 grid(M / 128, N / 128);
    cute_tf32_gemm<<<grid, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), M, N, K, mma, copy_a, copy_b, sA, sB);
    return c;
}
"""

CUTE_GEMM = _candidate("cute_gemm_ext", "torch::Tensor matmul(torch::Tensor a, torch::Tensor b);", CUTE_GEMM_SOURCE,
                       "matmul", "A, B")

DSL_RELU = _example("relu_cute_dsl.py")
