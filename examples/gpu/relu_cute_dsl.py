# kernel-lsp: reference=relu.py
"""A CuTe DSL candidate (pip install 'kernel-lsp[cute-dsl]'): one element per thread. kernel-lsp compiles it
without a GPU on save (its cubin's figures in a code lens); verifying and profiling it need one."""
import torch
import torch.nn as nn
import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack


@cute.kernel
def relu_kernel(gX: cute.Tensor, gY: cute.Tensor, n: cute.Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < n:
        v = gX[i]
        if v < 0.0:
            v = 0.0
        gY[i] = v


@cute.jit
def relu(mX: cute.Tensor, mY: cute.Tensor, n: cute.Int32):
    relu_kernel(mX, mY, n).launch(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1))


class ModelNew(nn.Module):
    def forward(self, x):
        flat = x.contiguous().view(-1)
        y = torch.empty_like(flat)
        relu(from_dlpack(flat), from_dlpack(y), flat.numel())
        return y.view(x.shape)
