"""Honest candidates (ModelNew) for KernelBench problems, to be verified on an NVIDIA GPU with every integrity check on.

HONEST_SET maps a problem's path under the KernelBench root (e.g. "level1/23_Softmax.py") to a candidate's source:
a complete Python file defining `ModelNew` with Model's __init__ arguments, parameter names and forward inputs.

Each candidate launches its own kernel in every forward and returns the data that kernel wrote: CUDA through
torch.utils.cpp_extension.load_inline (a distinct extension name each, launched on the current stream) or Triton
(@triton.jit). Stock PyTorch stays only around the kernel (cuDNN's convolution before a fused epilogue, views,
allocation). All arithmetic accumulates in fp32 or wider; the matmuls are plain fp32 FMA (CUDA) or Triton tl.dot
with input_precision="ieee" (no TF32), so they meet the fp32 tolerance. Indexing is 64-bit wherever a tensor of
the problem's size can pass 2^31 elements.

Nothing here needs a GPU to import: the module only defines strings.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------------------------
# level1 matmuls on CUDA: one register-tiled SGEMM, instantiated for op(A) = A or A^T and op(B) = B or B^T.
# ---------------------------------------------------------------------------------------------------------------

SGEMM_CUDA = r'''
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// C[M,N] = op(A)[M,K] * op(B)[K,N] in fp32 FMA. A block computes a 128x128 tile of C with 256 threads, walking K
// in slices of 16 staged through shared memory. Thread (ty, tx) of the 16x16 grid owns 8 rows and 8 columns of
// the tile, split in two quads each (rows ty*4+{0..3} and 64+ty*4+{0..3}, likewise columns), so that its
// shared-memory reads are float4 and a warp's reads do not conflict.
constexpr int BM = 128, BN = 128, BK = 16, PAD = 4, THREADS = 256;

template <bool TRANS_A, bool TRANS_B>
__global__ void __launch_bounds__(THREADS, 2)  // at most 128 registers: two blocks per SM
sgemm_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K, long long lda, long long ldb, long long ldc) {
    __shared__ __align__(16) float As[BK][BM + PAD];  // As[k][m] = op(A)[m0 + m][k0 + k]
    __shared__ __align__(16) float Bs[BK][BN + PAD];  // Bs[k][n] = op(B)[k0 + k][n0 + n]
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    float acc[8][8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
    }
    for (int k0 = 0; k0 < K; k0 += BK) {
        // Stage both slices; consecutive threads walk the operand's contiguous axis, so global reads coalesce.
        // Non-transposed A: thread reads k = tid % 16 of rows m = p*16 + tid/16; transposed A ([K][M] in memory):
        // m = tid % 128 of k-rows p*2 + tid/128. Likewise for B.
        #pragma unroll
        for (int p = 0; p < BM * BK / THREADS; ++p) {
            const int m = TRANS_A ? tid % BM : p * (THREADS / BK) + tid / BK;
            const int k = TRANS_A ? p * (THREADS / BM) + tid / BM : tid % BK;
            const int gm = m0 + m, gk = k0 + k;
            As[k][m] = (gm < M && gk < K) ? (TRANS_A ? A[(long long)gk * lda + gm] : A[(long long)gm * lda + gk]) : 0.f;
        }
        #pragma unroll
        for (int p = 0; p < BN * BK / THREADS; ++p) {
            const int n = TRANS_B ? p * (THREADS / BK) + tid / BK : tid % BN;
            const int k = TRANS_B ? tid % BK : p * (THREADS / BN) + tid / BN;
            const int gn = n0 + n, gk = k0 + k;
            Bs[k][n] = (gn < N && gk < K) ? (TRANS_B ? B[(long long)gn * ldb + gk] : B[(long long)gk * ldb + gn]) : 0.f;
        }
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[k][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[k][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[k][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[k][64 + tx * 4]);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            #pragma unroll
            for (int i = 0; i < 8; ++i) {
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
        }
        __syncthreads();  // the next slice overwrites As/Bs
    }
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (row >= M) continue;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int col = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + (j - 4));
            if (col < N) C[(long long)row * ldc + col] = acc[i][j];
        }
    }
}

template <bool TRANS_A, bool TRANS_B>
static void launch_sgemm(dim3 grid, cudaStream_t stream, const float* a, const float* b, float* c, int M, int N, int K,
                         long long lda, long long ldb, long long ldc) {
    sgemm_kernel<TRANS_A, TRANS_B><<<grid, THREADS, 0, stream>>>(a, b, c, M, N, K, lda, ldb, ldc);
}

// op(A) is A, or A^T when trans_a (A then holds K rows of M); likewise op(B).
torch::Tensor sgemm(torch::Tensor a, torch::Tensor b, bool trans_a, bool trans_b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "sgemm: CUDA tensors expected");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "sgemm: 2-D operands expected");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32, "sgemm: float32 expected");
    a = a.contiguous();
    b = b.contiguous();
    const int64_t M = trans_a ? a.size(1) : a.size(0), K = trans_a ? a.size(0) : a.size(1);
    const int64_t Kb = trans_b ? b.size(1) : b.size(0), N = trans_b ? b.size(0) : b.size(1);
    TORCH_CHECK(K == Kb, "sgemm: inner dimensions differ (", K, " vs ", Kb, ")");
    TORCH_CHECK(M < (1LL << 31) - BM && N < (1LL << 31) - BN && K < (1LL << 31) - BK, "sgemm: dimension too large");
    TORCH_CHECK((M + BM - 1) / BM <= 65535, "sgemm: too many rows for the grid");
    auto c = torch::empty({M, N}, a.options());
    if (M == 0 || N == 0) return c;
    const dim3 grid((unsigned)((N + BN - 1) / BN), (unsigned)((M + BM - 1) / BM));
    const long long lda = a.size(1), ldb = b.size(1), ldc = N;
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* pc = c.data_ptr<float>();
    const int m = (int)M, n = (int)N, k = (int)K;
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (!trans_a && !trans_b) launch_sgemm<false, false>(grid, stream, pa, pb, pc, m, n, k, lda, ldb, ldc);
    else if (trans_a && !trans_b) launch_sgemm<true, false>(grid, stream, pa, pb, pc, m, n, k, lda, ldb, ldc);
    else if (!trans_a && trans_b) launch_sgemm<false, true>(grid, stream, pa, pb, pc, m, n, k, lda, ldb, ldc);
    else launch_sgemm<true, true>(grid, stream, pa, pb, pc, m, n, k, lda, ldb, ldc);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
'''


def sgemm_candidate(extension: str, call: str) -> str:
    """A candidate whose forward(A, B) returns `call`, an expression over ops.sgemm(...)."""
    return f'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""{SGEMM_CUDA}"""

CPP_SOURCE = "torch::Tensor sgemm(torch::Tensor a, torch::Tensor b, bool trans_a, bool trans_b);"

ops = load_inline(name="{extension}", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE, functions=["sgemm"],
                  extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return {call}
'''


SQUARE_MATMUL = sgemm_candidate("kl_honest_sgemm_square", "ops.sgemm(A, B, False, False)")

# A arrives as (K, M); A.T @ B reads it through the transposed-A instantiation, with no copy.
TRANSPOSED_A_MATMUL = sgemm_candidate("kl_honest_sgemm_trans_a", "ops.sgemm(A, B, True, False)")


MATVEC = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// y[m] = sum_k A[m, k] * x[k]: one block per row of A, float4 loads when rows are 16-byte aligned, a warp-shuffle
// then shared-memory reduction at the end. A can hold more than 2^31 elements: row offsets are 64-bit.
constexpr int MV_THREADS = 512;

__device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void __launch_bounds__(MV_THREADS)
matvec_kernel(const float* __restrict__ A, const float* __restrict__ x, float* __restrict__ y, long long K, bool vec4) {
    const float* row = A + (long long)blockIdx.x * K;
    float acc = 0.f;
    if (vec4) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const long long K4 = K >> 2;
        #pragma unroll 4
        for (long long i = threadIdx.x; i < K4; i += MV_THREADS) {
            const float4 a = __ldg(r4 + i), b = __ldg(x4 + i);
            acc = fmaf(a.x, b.x, acc);
            acc = fmaf(a.y, b.y, acc);
            acc = fmaf(a.z, b.z, acc);
            acc = fmaf(a.w, b.w, acc);
        }
    } else {
        for (long long i = threadIdx.x; i < K; i += MV_THREADS) acc = fmaf(__ldg(row + i), __ldg(x + i), acc);
    }
    __shared__ float partial[MV_THREADS / 32];
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {  // the whole first warp takes part in its shuffles
        float v = threadIdx.x < MV_THREADS / 32 ? partial[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) y[blockIdx.x] = v;
    }
}

torch::Tensor matvec(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "matvec: CUDA tensors expected");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32, "matvec: float32 expected");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && b.size(0) == a.size(1) && b.size(1) == 1,
                "matvec: (M, K) @ (K, 1) expected");
    a = a.contiguous();
    b = b.contiguous();
    const int64_t M = a.size(0), K = a.size(1);
    TORCH_CHECK(M < (1LL << 31), "matvec: too many rows");
    auto y = torch::empty({M, 1}, a.options());
    if (M == 0) return y;
    const bool vec4 = K % 4 == 0 && reinterpret_cast<uintptr_t>(a.data_ptr<float>()) % 16 == 0
                      && reinterpret_cast<uintptr_t>(b.data_ptr<float>()) % 16 == 0;
    matvec_kernel<<<(unsigned)M, MV_THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), (long long)K, vec4);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SOURCE = "torch::Tensor matvec(torch::Tensor a, torch::Tensor b);"

ops = load_inline(name="kl_honest_matvec", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE, functions=["matvec"],
                  extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return ops.matvec(A, B)
'''


# ---------------------------------------------------------------------------------------------------------------
# level1 matmuls on Triton (tl.dot in IEEE fp32).
# ---------------------------------------------------------------------------------------------------------------

STANDARD_MATMUL = r'''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped tile order: GROUP_M consecutive row-blocks walk the column-blocks together, so B's tiles are reused
    # from L2 while they are still there.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :].to(tl.int64) * stride_ak
    b_ptrs = b_ptr + rk[:, None].to(tl.int64) * stride_bk + rn[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < K - k0) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :].to(tl.int64) * stride_cn
    tl.store(c_ptrs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: (M, K) @ (K, N) expected"
    assert a.dtype == torch.float32 and b.dtype == torch.float32, "matmul: float32 expected"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=torch.float32)
    BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 32
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8, num_warps=8, num_stages=3)
    return c


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return matmul(A, B)
'''


TALL_SKINNY_MATMUL = r'''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def small_k_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                          stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # C = A @ B with a small K: the work is writing C (M x N can pass 2^31 elements, so offsets are 64-bit).
    # Column-blocks vary fastest, so a program's A rows stay in cache while the row of C tiles is written.
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None].to(tl.int64) * stride_am + kk[None, :].to(tl.int64) * stride_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None].to(tl.int64) * stride_bk + rn[None, :].to(tl.int64) * stride_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :].to(tl.int64) * stride_cn
    tl.store(c_ptrs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: (M, K) @ (K, N) expected"
    assert a.dtype == torch.float32 and b.dtype == torch.float32, "matmul: float32 expected"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=torch.float32)
    BLOCK_M, BLOCK_N = 128, 128
    BLOCK_K = min(max(triton.next_power_of_2(K), 16), 32)
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    small_k_matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                c.stride(0), c.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                                num_warps=8)
    return c


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return matmul(A, B)
'''


# ---------------------------------------------------------------------------------------------------------------
# level1 elementwise.
# ---------------------------------------------------------------------------------------------------------------

SIGMOID = r'''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sigmoid_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # 64-bit offsets: the problem's tensor has more than 2^31 elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = 1.0 / (1.0 + tl.exp(-x))
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.float32, "sigmoid: float32 expected"
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        BLOCK = 4096
        sigmoid_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK, num_warps=8)
        return y
'''


GELU = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// Exact (erf) GELU, the default of torch.nn.functional.gelu. Grid-stride loop over float4s with 64-bit indices,
// then a scalar tail; a scalar loop when the pointers are not 16-byte aligned.
__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); }

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n, bool vec4) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long done = 0;
    if (vec4) {
        const long long n4 = n >> 2;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (long long i = tid; i < n4; i += stride) {
            const float4 v = x4[i];
            y4[i] = make_float4(gelu(v.x), gelu(v.y), gelu(v.z), gelu(v.w));
        }
        done = n4 << 2;
    }
    for (long long i = done + tid; i < n; i += stride) y[i] = gelu(x[i]);
}

torch::Tensor gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "gelu: a float32 CUDA tensor expected");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const long long n = x.numel();
    if (n == 0) return y;
    const bool vec4 = reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0
                      && reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0;
    const int threads = 256;
    const long long wanted = ((vec4 ? n / 4 : n) + threads - 1) / threads;
    const int blocks = (int)std::max(1LL, std::min(wanted, 132LL * 32));
    gelu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n, vec4);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SOURCE = "torch::Tensor gelu_forward(torch::Tensor x);"

ops = load_inline(name="kl_honest_gelu", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE, functions=["gelu_forward"],
                  extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.gelu_forward(x)
'''


# ---------------------------------------------------------------------------------------------------------------
# level1 row-wise normalisations and reductions.
# ---------------------------------------------------------------------------------------------------------------

SOFTMAX = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// Softmax over the last dimension of a (rows, D) tensor, one block per row. Pass 1 keeps, per thread, a running
// maximum m and a sum s of exp(x - m) (rescaled whenever m grows), then merges the threads' (m, s) pairs across
// the block; pass 2 writes exp(x - m) / s. float4 accesses when the row length and pointers allow.
constexpr int SM_THREADS = 1024;

struct MaxSum { float m, s; };

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    if (a.m == -INFINITY) return b;  // an empty part (a thread that saw no element) changes nothing
    if (b.m == -INFINITY) return a;
    const float m = fmaxf(a.m, b.m);
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ void take(MaxSum& t, float v) {
    if (v > t.m) {
        t.s = t.s * expf(t.m - v) + 1.f;  // expf(-inf) = 0 for the first element
        t.m = v;
    } else if (v != -INFINITY) {
        t.s += expf(v - t.m);
    }
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
        v = merge(v, other);
    }
    return v;
}

__global__ void __launch_bounds__(SM_THREADS)
softmax_kernel(const float* __restrict__ x, float* __restrict__ y, long long D, bool vec4) {
    const long long base = (long long)blockIdx.x * D;
    const float* xr = x + base;
    float* yr = y + base;
    MaxSum t{-INFINITY, 0.f};
    if (vec4) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (long long i = threadIdx.x; i < (D >> 2); i += SM_THREADS) {
            const float4 v = x4[i];
            take(t, v.x); take(t, v.y); take(t, v.z); take(t, v.w);
        }
    } else {
        for (long long i = threadIdx.x; i < D; i += SM_THREADS) take(t, xr[i]);
    }

    __shared__ float part_m[32], part_s[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    t = warp_merge(t);
    if (lane == 0) { part_m[warp] = t.m; part_s[warp] = t.s; }
    __syncthreads();
    MaxSum row = lane < SM_THREADS / 32 ? MaxSum{part_m[lane], part_s[lane]} : MaxSum{-INFINITY, 0.f};
    row = warp_merge(row);  // every warp reduces the same 32 partials, so every thread holds the row's (m, s)

    if (vec4) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* y4 = reinterpret_cast<float4*>(yr);
        for (long long i = threadIdx.x; i < (D >> 2); i += SM_THREADS) {
            const float4 v = x4[i];
            y4[i] = make_float4(expf(v.x - row.m) / row.s, expf(v.y - row.m) / row.s,
                                expf(v.z - row.m) / row.s, expf(v.w - row.m) / row.s);
        }
    } else {
        for (long long i = threadIdx.x; i < D; i += SM_THREADS) yr[i] = expf(xr[i] - row.m) / row.s;
    }
}

torch::Tensor softmax_lastdim(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "softmax: a float32 CUDA tensor expected");
    TORCH_CHECK(x.dim() >= 1, "softmax: at least one dimension expected");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const long long D = x.size(-1);
    if (x.numel() == 0) return y;
    const long long rows = x.numel() / D;
    TORCH_CHECK(rows < (1LL << 31), "softmax: too many rows");
    const bool vec4 = D % 4 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0
                      && reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0;
    softmax_kernel<<<(unsigned)rows, SM_THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), D, vec4);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SOURCE = "torch::Tensor softmax_lastdim(torch::Tensor x);"

ops = load_inline(name="kl_honest_softmax", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                  functions=["softmax_lastdim"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dim() == 2, "softmax over dim=1 of a 2-D tensor"
        return ops.softmax_lastdim(x)
'''


LAYER_NORM = r'''
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// LayerNorm over the trailing N elements of each row. The problem has few, very long rows (16 of 4M), so a row is
// split in chunks of LN_CHUNK elements, a block each. Pass 1: each block writes its chunk's sum and sum of squares
// (accumulated in double). Pass 2: each block folds its row's chunk sums into the mean and variance (in double),
// then normalises its chunk and applies the affine weight and bias.
constexpr int LN_THREADS = 256;
constexpr long long LN_CHUNK = 16384;

__device__ __forceinline__ double warp_sum(double v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Every thread of the block must call it; every thread gets the block's total.
__device__ double block_sum(double v) {
    __shared__ double part[LN_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // part[] may still be read by the previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < LN_THREADS / 32 ? part[lane] : 0.0;
    return warp_sum(v);
}

__global__ void __launch_bounds__(LN_THREADS)
ln_partial_kernel(const float* __restrict__ x, double2* __restrict__ partial, long long N, long long chunks) {
    const long long row = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
    const float* xr = x + row * N;
    const long long start = chunk * LN_CHUNK;
    const long long end = start + LN_CHUNK < N ? start + LN_CHUNK : N;
    double s = 0.0, ss = 0.0;
    for (long long i = start + threadIdx.x; i < end; i += LN_THREADS) {
        const double v = xr[i];
        s += v;
        ss += v * v;
    }
    s = block_sum(s);
    ss = block_sum(ss);
    if (threadIdx.x == 0) partial[blockIdx.x] = make_double2(s, ss);
}

__global__ void __launch_bounds__(LN_THREADS)
ln_apply_kernel(const float* __restrict__ x, const double2* __restrict__ partial, const float* __restrict__ weight,
                const float* __restrict__ bias, float* __restrict__ y, long long N, long long chunks, double eps) {
    const long long row = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
    double s = 0.0, ss = 0.0;
    for (long long c = threadIdx.x; c < chunks; c += LN_THREADS) {
        const double2 p = partial[row * chunks + c];
        s += p.x;
        ss += p.y;
    }
    s = block_sum(s);
    ss = block_sum(ss);
    const double mean = s / (double)N;
    const double var = fmax(ss / (double)N - mean * mean, 0.0);  // biased variance, as LayerNorm uses
    const float meanf = (float)mean, rstd = (float)(1.0 / sqrt(var + eps));

    const float* xr = x + row * N;
    float* yr = y + row * N;
    const long long start = chunk * LN_CHUNK;
    const long long end = start + LN_CHUNK < N ? start + LN_CHUNK : N;
    for (long long i = start + threadIdx.x; i < end; i += LN_THREADS) {
        float v = (xr[i] - meanf) * rstd;
        if (weight != nullptr) v *= weight[i];
        if (bias != nullptr) v += bias[i];
        yr[i] = v;
    }
}

torch::Tensor layer_norm(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t N, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "layer_norm: a float32 CUDA tensor expected");
    TORCH_CHECK(N > 0 && x.numel() % N == 0, "layer_norm: the input does not end in the normalized shape");
    x = x.contiguous();
    const bool affine_w = weight.defined(), affine_b = bias.defined();
    if (affine_w) {
        weight = weight.contiguous();
        TORCH_CHECK(weight.numel() == N && weight.scalar_type() == torch::kFloat32, "layer_norm: bad weight");
    }
    if (affine_b) {
        bias = bias.contiguous();
        TORCH_CHECK(bias.numel() == N && bias.scalar_type() == torch::kFloat32, "layer_norm: bad bias");
    }
    auto y = torch::empty_like(x);
    const long long rows = x.numel() / N;
    if (rows == 0) return y;
    const long long chunks = (N + LN_CHUNK - 1) / LN_CHUNK;
    TORCH_CHECK(rows * chunks < (1LL << 31), "layer_norm: too many blocks");
    auto partial = torch::empty({rows * chunks, 2}, x.options().dtype(torch::kFloat64));
    auto stream = at::cuda::getCurrentCUDAStream();
    double2* p = reinterpret_cast<double2*>(partial.data_ptr<double>());
    ln_partial_kernel<<<(unsigned)(rows * chunks), LN_THREADS, 0, stream>>>(x.data_ptr<float>(), p, N, chunks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    ln_apply_kernel<<<(unsigned)(rows * chunks), LN_THREADS, 0, stream>>>(
        x.data_ptr<float>(), p, affine_w ? weight.data_ptr<float>() : nullptr,
        affine_b ? bias.data_ptr<float>() : nullptr, y.data_ptr<float>(), N, chunks, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SOURCE = ("torch::Tensor layer_norm(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t N, "
              "double eps);")

ops = load_inline(name="kl_honest_layer_norm", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                  functions=["layer_norm"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = tuple(self.ln.normalized_shape)
        assert tuple(x.shape[x.dim() - len(shape):]) == shape, "the input must end in the normalized shape"
        return ops.layer_norm(x, self.ln.weight, self.ln.bias, math.prod(shape), self.ln.eps)
'''


RMS_NORM = r'''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, y_ptr, C, S, eps, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, ONE_TILE: tl.constexpr):
    # x is (B, C, S): each program normalises BLOCK_S positions of one batch item over the C features (dim 1).
    # With ONE_TILE all C features fit one tile and x is read once; else the features are walked twice.
    pid_s = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_c = tl.arange(0, BLOCK_C)
    base = b * C * S
    if ONE_TILE:
        offs = base + offs_c[:, None].to(tl.int64) * S + offs_s[None, :]
        mask = (offs_c[:, None] < C) & (offs_s[None, :] < S)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        rms = tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
        tl.store(y_ptr + offs, x / rms[None, :], mask=mask)
    else:
        sq = tl.zeros((BLOCK_S,), dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            cc = c0 + offs_c
            offs = base + cc[:, None].to(tl.int64) * S + offs_s[None, :]
            mask = (cc[:, None] < C) & (offs_s[None, :] < S)
            x = tl.load(x_ptr + offs, mask=mask, other=0.0)
            sq += tl.sum(x * x, axis=0)
        rms = tl.sqrt(sq / C + eps)
        for c0 in range(0, C, BLOCK_C):
            cc = c0 + offs_c
            offs = base + cc[:, None].to(tl.int64) * S + offs_s[None, :]
            mask = (cc[:, None] < C) & (offs_s[None, :] < S)
            x = tl.load(x_ptr + offs, mask=mask, other=0.0)
            tl.store(y_ptr + offs, x / rms[None, :], mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.float32 and x.dim() >= 2, "rms_norm: a float32 (B, C, ...) tensor expected"
        x = x.contiguous()
        y = torch.empty_like(x)
        B, C = x.shape[0], x.shape[1]
        if x.numel() == 0:
            return y
        S = x.numel() // (B * C)
        one_tile = C <= 128
        BLOCK_C = triton.next_power_of_2(C) if one_tile else 64
        BLOCK_S = max(16, min(256, 8192 // BLOCK_C))
        grid = (triton.cdiv(S, BLOCK_S), B)
        rms_norm_kernel[grid](x, y, C, S, self.eps, BLOCK_C=BLOCK_C, BLOCK_S=BLOCK_S, ONE_TILE=one_tile, num_warps=8)
        return y
'''


SUM_REDUCTION = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// Sum over one dimension of x viewed as (outer, R, inner).
// inner > 1: one thread per output column (o, i); neighbouring threads read neighbouring addresses at each step,
// and 8 loads are in flight per iteration, summed into 4 partial sums.
// inner == 1: the reduced values are contiguous, so one block per output reduces them with a block reduction.
__global__ void sum_columns_kernel(const float* __restrict__ x, float* __restrict__ out,
                                   long long outer, long long R, long long inner) {
    const long long total = outer * inner;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long o = idx / inner, i = idx - o * inner;
        const float* p = x + o * R * inner + i;
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        long long r = 0;
        for (; r + 8 <= R; r += 8) {
            const float v0 = p[(r + 0) * inner], v1 = p[(r + 1) * inner];
            const float v2 = p[(r + 2) * inner], v3 = p[(r + 3) * inner];
            const float v4 = p[(r + 4) * inner], v5 = p[(r + 5) * inner];
            const float v6 = p[(r + 6) * inner], v7 = p[(r + 7) * inner];
            a0 += v0 + v4;
            a1 += v1 + v5;
            a2 += v2 + v6;
            a3 += v3 + v7;
        }
        for (; r < R; ++r) a0 += p[r * inner];
        out[idx] = (a0 + a1) + (a2 + a3);
    }
}

constexpr int ROW_THREADS = 256;

__global__ void __launch_bounds__(ROW_THREADS)
sum_rows_kernel(const float* __restrict__ x, float* __restrict__ out, long long R) {
    const float* row = x + (long long)blockIdx.x * R;
    float acc = 0.f;
    for (long long r = threadIdx.x; r < R; r += ROW_THREADS) acc += row[r];
    __shared__ float part[ROW_THREADS / 32];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < ROW_THREADS / 32 ? part[threadIdx.x] : 0.f;
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) out[blockIdx.x] = v;
    }
}

torch::Tensor sum_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "sum: a float32 CUDA tensor expected");
    TORCH_CHECK(x.dim() >= 1, "sum: at least one dimension expected");
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "sum: dim out of range");
    x = x.contiguous();
    long long outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const long long R = x.size(dim);
    auto sizes = x.sizes().vec();
    sizes[dim] = 1;  // keepdim=True
    auto out = torch::empty(sizes, x.options());
    if (out.numel() == 0) return out;
    auto stream = at::cuda::getCurrentCUDAStream();
    if (inner == 1) {
        TORCH_CHECK(outer < (1LL << 31), "sum: too many rows");
        sum_rows_kernel<<<(unsigned)outer, ROW_THREADS, 0, stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), R);
    } else {
        const int threads = 256;
        const long long blocks = std::min((outer * inner + threads - 1) / threads, 1LL << 20);
        sum_columns_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            x.data_ptr<float>(), out.data_ptr<float>(), outer, R, inner);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

CPP_SOURCE = "torch::Tensor sum_dim(torch::Tensor x, int64_t dim);"

ops = load_inline(name="kl_honest_sum_dim", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE, functions=["sum_dim"],
                  extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.sum_dim(x, self.dim)
'''


MEAN_REDUCTION = r'''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mean_kernel(x_ptr, y_ptr, R, inner, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    # x viewed as (outer, R, inner); a program averages BLOCK_I neighbouring columns of one outer index, reading
    # (BLOCK_R, BLOCK_I) tiles down R into a tile of partial sums that is folded once at the end.
    pid = tl.program_id(0)
    blocks_i = tl.cdiv(inner, BLOCK_I)
    o = (pid // blocks_i).to(tl.int64)
    offs_i = (pid % blocks_i) * BLOCK_I + tl.arange(0, BLOCK_I)
    offs_r = tl.arange(0, BLOCK_R)
    base = x_ptr + o * R * inner
    acc = tl.zeros((BLOCK_R, BLOCK_I), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rr = r0 + offs_r
        tile = tl.load(base + rr[:, None].to(tl.int64) * inner + offs_i[None, :],
                       mask=(rr[:, None] < R) & (offs_i[None, :] < inner), other=0.0)
        acc += tile
    total = tl.sum(acc, axis=0)
    tl.store(y_ptr + o * inner + offs_i, total / R, mask=offs_i < inner)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dtype == torch.float32 and x.dim() >= 1, "mean: a float32 tensor expected"
        dim = self.dim % x.dim()
        x = x.contiguous()
        outer = 1
        for size in x.shape[:dim]:
            outer *= size
        inner = 1
        for size in x.shape[dim + 1:]:
            inner *= size
        R = x.shape[dim]
        y = torch.empty(x.shape[:dim] + x.shape[dim + 1:], device=x.device, dtype=x.dtype)
        if y.numel() == 0:
            return y
        assert R > 0, "mean over an empty dimension"
        BLOCK_I = min(128, max(16, triton.next_power_of_2(inner)))
        BLOCK_R = 4096 // BLOCK_I
        grid = (outer * triton.cdiv(inner, BLOCK_I),)
        mean_kernel[grid](x, y, R, inner, BLOCK_R=BLOCK_R, BLOCK_I=BLOCK_I, num_warps=4)
        return y
'''


ARGMAX = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <climits>

// torch.argmax over one dimension of x viewed as (outer, R, inner), int64 indices. Ties go to the first
// occurrence, and NaN counts as the largest value (the first NaN wins), as in torch.
// inner > 1: one thread per output column, scanning r upwards, so a later equal value never replaces the best.
// inner == 1: one block per output; each thread scans its strided indices, then a block reduction that compares
// values and, on a tie, indices.
__device__ __forceinline__ bool beats(float v, long long i, float bv, long long bi) {
    const bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bi);
    return v > bv || (v == bv && i < bi);
}

__global__ void argmax_columns_kernel(const float* __restrict__ x, long long* __restrict__ out,
                                      long long outer, long long R, long long inner) {
    const long long total = outer * inner;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long o = idx / inner, i = idx - o * inner;
        const float* p = x + o * R * inner + i;
        float best = p[0];
        long long best_r = 0;
        #pragma unroll 4
        for (long long r = 1; r < R; ++r) {
            const float v = p[r * inner];
            if (v > best || (v != v && best == best)) {  // strictly greater, or the first NaN
                best = v;
                best_r = r;
            }
        }
        out[idx] = best_r;
    }
}

constexpr int ROW_THREADS = 256;

__global__ void __launch_bounds__(ROW_THREADS)
argmax_rows_kernel(const float* __restrict__ x, long long* __restrict__ out, long long R) {
    const float* row = x + (long long)blockIdx.x * R;
    float best = -INFINITY;
    long long best_i = LLONG_MAX;  // no element yet: loses to any element, -inf included
    for (long long r = threadIdx.x; r < R; r += ROW_THREADS) {
        const float v = row[r];
        if (beats(v, r, best, best_i)) { best = v; best_i = r; }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, o);
        const long long i = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (beats(v, i, best, best_i)) { best = v; best_i = i; }
    }
    __shared__ float part_v[ROW_THREADS / 32];
    __shared__ long long part_i[ROW_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { part_v[warp] = best; part_i[warp] = best_i; }
    __syncthreads();
    if (warp == 0) {
        best = lane < ROW_THREADS / 32 ? part_v[lane] : -INFINITY;
        best_i = lane < ROW_THREADS / 32 ? part_i[lane] : LLONG_MAX;
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, best, o);
            const long long i = __shfl_xor_sync(0xffffffffu, best_i, o);
            if (beats(v, i, best, best_i)) { best = v; best_i = i; }
        }
        if (lane == 0) out[blockIdx.x] = best_i;
    }
}

torch::Tensor argmax_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "argmax: a float32 CUDA tensor expected");
    TORCH_CHECK(x.dim() >= 1, "argmax: at least one dimension expected");
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "argmax: dim out of range");
    TORCH_CHECK(x.size(dim) > 0, "argmax: cannot reduce an empty dimension");
    x = x.contiguous();
    long long outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const long long R = x.size(dim);
    auto sizes = x.sizes().vec();
    sizes.erase(sizes.begin() + dim);
    auto out = torch::empty(sizes, x.options().dtype(torch::kInt64));
    if (out.numel() == 0) return out;
    auto stream = at::cuda::getCurrentCUDAStream();
    if (inner == 1) {
        TORCH_CHECK(outer < (1LL << 31), "argmax: too many rows");
        argmax_rows_kernel<<<(unsigned)outer, ROW_THREADS, 0, stream>>>(
            x.data_ptr<float>(), reinterpret_cast<long long*>(out.data_ptr<int64_t>()), R);
    } else {
        const int threads = 256;
        const long long blocks = std::min((outer * inner + threads - 1) / threads, 1LL << 20);
        argmax_columns_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            x.data_ptr<float>(), reinterpret_cast<long long*>(out.data_ptr<int64_t>()), outer, R, inner);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

CPP_SOURCE = "torch::Tensor argmax_dim(torch::Tensor x, int64_t dim);"

ops = load_inline(name="kl_honest_argmax", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                  functions=["argmax_dim"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.argmax_dim(x, self.dim)
'''


# ---------------------------------------------------------------------------------------------------------------
# level2: a stock convolution with a fused CUDA epilogue, and a Triton GEMM with a fused epilogue.
# ---------------------------------------------------------------------------------------------------------------

CONV_RELU_BIAS = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// out = relu(conv) + bias[c] for an NCHW tensor, one block per (n, c) plane, so the bias is one load per block.
// float4 accesses when the plane size and pointers allow.
constexpr int EP_THREADS = 256;

__global__ void __launch_bounds__(EP_THREADS)
relu_bias_kernel(const float* __restrict__ conv, const float* __restrict__ bias, float* __restrict__ out,
                 long long HW, int C, bool vec4) {
    const long long plane = blockIdx.x;
    const float b = bias[plane % C];
    const float* src = conv + plane * HW;
    float* dst = out + plane * HW;
    if (vec4) {
        const float4* s4 = reinterpret_cast<const float4*>(src);
        float4* d4 = reinterpret_cast<float4*>(dst);
        for (long long i = threadIdx.x; i < (HW >> 2); i += EP_THREADS) {
            const float4 v = s4[i];
            d4[i] = make_float4(fmaxf(v.x, 0.f) + b, fmaxf(v.y, 0.f) + b, fmaxf(v.z, 0.f) + b, fmaxf(v.w, 0.f) + b);
        }
    } else {
        for (long long i = threadIdx.x; i < HW; i += EP_THREADS) dst[i] = fmaxf(src[i], 0.f) + b;
    }
}

torch::Tensor relu_bias(torch::Tensor conv, torch::Tensor bias) {
    TORCH_CHECK(conv.is_cuda() && bias.is_cuda(), "relu_bias: CUDA tensors expected");
    TORCH_CHECK(conv.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32,
                "relu_bias: float32 expected");
    TORCH_CHECK(conv.dim() == 4, "relu_bias: an NCHW tensor expected");
    conv = conv.contiguous();
    bias = bias.contiguous();
    const int64_t C = conv.size(1);
    TORCH_CHECK(bias.numel() == C, "relu_bias: one bias per channel expected");
    auto out = torch::empty_like(conv);
    const long long planes = conv.size(0) * C, HW = conv.size(2) * conv.size(3);
    if (planes == 0 || HW == 0) return out;
    TORCH_CHECK(planes < (1LL << 31), "relu_bias: too many planes");
    const bool vec4 = HW % 4 == 0 && reinterpret_cast<uintptr_t>(conv.data_ptr<float>()) % 16 == 0
                      && reinterpret_cast<uintptr_t>(out.data_ptr<float>()) % 16 == 0;
    relu_bias_kernel<<<(unsigned)planes, EP_THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        conv.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), HW, (int)C, vec4);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

CPP_SOURCE = "torch::Tensor relu_bias(torch::Tensor conv, torch::Tensor bias);"

ops = load_inline(name="kl_honest_conv_relu_bias", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                  functions=["relu_bias"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)  # cuDNN's convolution, kept stock
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return ops.relu_bias(self.conv(x), self.bias)
'''


GEMM_MULTIPLY_LEAKY_RELU = r'''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_mul_leaky_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                            stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                            multiplier, negative_slope,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # y = leaky_relu((x @ W^T + b) * multiplier): W is nn.Linear's (out, in) weight, read as W^T tiles in place.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :].to(tl.int64) * stride_xk
    w_ptrs = w_ptr + rn[None, :].to(tl.int64) * stride_wn + rk[:, None].to(tl.int64) * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(x_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k0), other=0.0)
        wt = tl.load(w_ptrs, mask=(rk[:, None] < K - k0) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, wt, acc, input_precision="ieee")
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
    out = (acc + bias[None, :]) * multiplier
    out = tl.where(out > 0, out, out * negative_slope)
    y_ptrs = y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :].to(tl.int64) * stride_yn
    tl.store(y_ptrs, out, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.leaky_relu = nn.LeakyReLU(negative_slope)

    def forward(self, x):
        assert x.dim() == 2 and x.dtype == torch.float32, "a float32 (batch, in_features) input expected"
        w = self.gemm.weight
        b = self.gemm.bias
        M, K = x.shape
        N = w.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=torch.float32)
        BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 32
        grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
        linear_mul_leaky_kernel[grid](x, w, b, y, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                                      y.stride(0), y.stride(1), float(self.multiplier),
                                      float(self.leaky_relu.negative_slope),
                                      BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8,
                                      num_warps=8, num_stages=3)
        return y
'''


HONEST_SET: dict[str, str] = {
    "level1/1_Square_matrix_multiplication_.py": SQUARE_MATMUL,  # CUDA
    "level1/2_Standard_matrix_multiplication_.py": STANDARD_MATMUL,  # Triton
    "level1/4_Matrix_vector_multiplication_.py": MATVEC,  # CUDA
    "level1/9_Tall_skinny_matrix_multiplication_.py": TALL_SKINNY_MATMUL,  # Triton
    "level1/16_Matmul_with_transposed_A.py": TRANSPOSED_A_MATMUL,  # CUDA
    "level1/21_Sigmoid.py": SIGMOID,  # Triton
    "level1/23_Softmax.py": SOFTMAX,  # CUDA
    "level1/26_GELU_.py": GELU,  # CUDA
    "level1/36_RMSNorm_.py": RMS_NORM,  # Triton
    "level1/40_LayerNorm.py": LAYER_NORM,  # CUDA
    "level1/47_Sum_reduction_over_a_dimension.py": SUM_REDUCTION,  # CUDA
    "level1/48_Mean_reduction_over_a_dimension.py": MEAN_REDUCTION,  # Triton
    "level1/51_Argmax_over_a_dimension.py": ARGMAX,  # CUDA
    "level2/1_Conv2D_ReLU_BiasAdd.py": CONV_RELU_BIAS,  # CUDA
    "level2/12_Gemm_Multiply_LeakyReLU.py": GEMM_MULTIPLY_LEAKY_RELU,  # Triton
}
