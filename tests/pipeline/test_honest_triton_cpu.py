"""Honest Triton candidates across kinds of problems, verified on the CPU (TRITON_INTERPRET=1) in a real sandbox.

Every integrity check must let them pass: the stale-output checks, the timed-output check and the
output-from-kernel check included, with every core of the machine kept busy by other processes. Problems are small KernelBench-style ones (the real sizes take too long in
Triton's interpreter); the GPU tests verify load_inline and Triton candidates for KernelBench's own problems.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel_lsp.worker.sandbox import Sandbox, SandboxLimits, SandboxTask
from tests.problems import one_output_buffer

pytestmark = pytest.mark.timeout(600)

HEADER = """import torch
import torch.nn as nn
import torch.nn.functional as F
"""

TRITON = HEADER + """import triton
import triton.language as tl
"""


def problem(forward: str, inputs: str, init_args: str = "", init_body: str = "pass", init_inputs: str = "[]") -> str:
    """A KernelBench-style reference: Model(*get_init_inputs()) whose forward returns `forward`."""
    return HEADER + f"""
class Model(nn.Module):
    def __init__(self{init_args}):
        super().__init__()
        {init_body}

    def forward(self, *args):
        {forward}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return {init_inputs}
"""


CASES = {
    "softmax": (problem("return torch.softmax(args[0], dim=1)", "[torch.randn(16, 64)]"), TRITON + """
@triton.jit
def softmax_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * cols + offsets, e / tl.sum(e, axis=0), mask=mask)

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
"""),
    "layernorm-with-weights": (problem("return self.norm(args[0])", "[torch.randn(16, 64)]",
                                       init_args=", features", init_body="self.norm = nn.LayerNorm(features)",
                                       init_inputs="[64]"),
                               TRITON + """
@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * cols + offsets, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / cols
    centered = tl.where(mask, x - mean, 0.0)
    variance = tl.sum(centered * centered, axis=0) / cols
    w = tl.load(w_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets, mask=mask)
    tl.store(y_ptr + row * cols + offsets, centered / tl.sqrt(variance + eps) * w + b, mask=mask)

class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        layernorm_kernel[(x.shape[0],)](x, self.norm.weight, self.norm.bias, y, x.shape[1], self.norm.eps,
                                        BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
"""),
    "row-sum": (problem("return args[0].sum(dim=1)", "[torch.randn(32, 64)]"), TRITON + """
@triton.jit
def row_sum_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + offsets, mask=offsets < cols, other=0.0)
    tl.store(y_ptr + row, tl.sum(x, axis=0))

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.shape[0], dtype=x.dtype)
        row_sum_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
"""),
    "elementwise-chain": (problem("return torch.sigmoid(args[0] * 2 + 1) * args[1]",
                                  "[torch.randn(64, 32), torch.randn(64, 32)]"), TRITON + """
@triton.jit
def chain_kernel(x_ptr, g_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    g = tl.load(g_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, tl.sigmoid(x * 2 + 1) * g, mask=mask)

class ModelNew(nn.Module):
    def forward(self, x, g):
        x, g = x.contiguous(), g.contiguous()
        y = torch.empty_like(x)
        chain_kernel[(triton.cdiv(x.numel(), 512),)](x, g, y, x.numel(), BLOCK=512)
        return y
"""),
    "matmul": (problem("return args[0] @ args[1]", "[torch.randn(32, 32), torch.randn(32, 16)]"), TRITON + """
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        ks = k + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b, allow_tf32=False)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))

class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)
        grid = (triton.cdiv(a.shape[0], 16), triton.cdiv(b.shape[1], 16))
        matmul_kernel[grid](a, b, c, a.shape[0], b.shape[1], a.shape[1], BM=16, BN=16, BK=16)
        return c
"""),
    "integer-indices": (problem("return args[0][args[1]]",
                                "[torch.randn(50, 16), torch.randint(0, 50, (24,))]"), TRITON + """
@triton.jit
def gather_rows_kernel(table_ptr, index_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    source = tl.load(index_ptr + row)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    tl.store(out_ptr + row * cols + offsets, tl.load(table_ptr + source * cols + offsets, mask=mask), mask=mask)

class ModelNew(nn.Module):
    def forward(self, table, index):
        table = table.contiguous()
        out = torch.empty(index.shape[0], table.shape[1], dtype=table.dtype)
        gather_rows_kernel[(index.shape[0],)](table, index.contiguous(), out, table.shape[1],
                                              BLOCK=triton.next_power_of_2(table.shape[1]))
        return out
"""),
    "conv-with-custom-epilogue": (problem("return torch.relu(self.conv(args[0]) * 0.5 + 0.1)",
                                          "[torch.randn(2, 3, 8, 8)]",
                                          init_args=", channels", init_body="self.conv = nn.Conv2d(channels, 4, 3)",
                                          init_inputs="[3]"), TRITON + """
@triton.jit
def epilogue_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, tl.maximum(x * 0.5 + 0.1, 0.0), mask=mask)

class ModelNew(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, 4, 3)

    def forward(self, x):
        z = self.conv(x).contiguous()  # the library's convolution, then the candidate's own fused epilogue
        y = torch.empty_like(z)
        epilogue_kernel[(triton.cdiv(z.numel(), 256),)](z, y, z.numel(), BLOCK=256)
        return y
"""),
    "kept-output-buffer": (problem("return args[0] * 3", "[torch.randn(64, 32)]"), TRITON + """
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 3, mask=mask)
""" + one_output_buffer("scale_kernel[(triton.cdiv(x.numel(), 512),)](x, self.out, x.numel(), BLOCK=512)")),
}


@pytest.fixture
async def sandbox():
    sandbox = Sandbox(preload=("kernel_lsp.candidate.prestart", "torch"))
    yield sandbox
    await sandbox.close()


@pytest.fixture(scope="module")
def every_core_busy() -> Iterator[int]:
    """One process spinning on each core (and one more) while the honest set runs: a busy machine must not turn
    an honest candidate into a rejected one (issue 39: no false reject under load)."""
    count = (os.cpu_count() or 1) + 1
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield count
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.parametrize("name", sorted(CASES))
async def test_honest_candidate_passes_every_check(sandbox: Sandbox, tmp_path: Path, name: str, every_core_busy: int):
    reference, candidate = CASES[name]
    files = {"cand.py": candidate, "reference/problem.py": reference}
    task = SandboxTask(entry="kernel_lsp.verify.run:verify_candidate", files=files,
                       origins={"cand.py": "/work/project/cand.py"},
                       args={"reference": "reference/problem.py", "candidate": "cand.py",
                             "options": {"device": "cpu", "trials": 3, "timedCalls": 4, "warmup": 1, "baselines": ["eager"]},
                             "cache_dir": str(tmp_path), "files": files})
    outcome = await sandbox.run(task, SandboxLimits(wall_time_s=300))
    assert outcome.status == "ok", (outcome.message, outcome.stderr[-3000:])
    report = outcome.value
    assert report["verdict"] == "verified", (report.get("integrity"), report.get("correctness"))
    assert report["kernels"]["output_from_kernel"] is True, report["kernels"]
    timing = report["timing"]["candidate"]  # timedCalls 4: 4 rounds of the judge's batches
    assert timing["rounds"] == 4 and timing["calls"] == 4 * timing["batch"] and len(timing["samples_ms"]) == 4
    assert len(report["timing"]["eager"]["samples_ms"]) == 4 and len(report["interval"]["eager"]) == 2
