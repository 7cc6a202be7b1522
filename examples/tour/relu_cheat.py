# kernel-lsp: reference=relu.py
"""A cheat: the kernel is there, but forward answers with PyTorch's own ReLU. The outputs match, so only the
integrity check catches it: `rejected · … · integrity-no-custom-kernel`."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)  # never launches relu_kernel
