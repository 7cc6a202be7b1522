"""Edit-time speed of a load_inline candidate: the first check, then an edit inside a kernel (issue 23).

    .venv/bin/python benchmarks/load_inline_edit.py [--repeat N] [--record]

The file is a KernelBench-style ReLU candidate whose CUDA source includes torch/extension.h (as KernelBench's
and the agents' candidates do). Each repeat, in one process and alternating, so that both see the same load:
  - the first check without reuse (what every check cost before compile/reuse.py): to its final result;
  - the first check with reuse (a fresh CompileService): to its final result; target: no slower than without;
  - an edit inside the kernel (a mistyped name) after it: to the first report that shows the error (preliminary,
    from the compile without torch's headers; target <= 3 s), and to the final, exact result (target <= 8 s).
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import report  # noqa: E402
from kernel_lsp.compile.check import Document, Scratch, check_document  # noqa: E402
from kernel_lsp.compile.service import CompileService  # noqa: E402
from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.findings import path_to_uri  # noqa: E402

CANDIDATE = '''\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* x, float* out, int size) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        out[idx] = x[idx] > 0.f ? x[idx] : 0.f;
    }
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto size = x.numel();
    auto out = torch::empty_like(x);
    const int block_size = 256;
    const int num_blocks = (size + block_size - 1) / block_size;
    relu_kernel<<<num_blocks, block_size>>>(x.data_ptr<float>(), out.data_ptr<float>(), size);
    return out;
}
"""

relu = load_inline(name="relu", cpp_sources="torch::Tensor relu_cuda(torch::Tensor x);",
                   cuda_sources=relu_source, functions=["relu_cuda"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return relu.relu_cuda(x)
'''
EDITED = CANDIDATE.replace("out[idx] = x[idx] > 0.f", "out[idx] = xx[idx] > 0.f")
TYPO = 'identifier "xx" is undefined'


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    settings = Settings()
    scratch_first, reuse_first, shown_first, exact = [], [], [], []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "relu_candidate.py"
        path.write_text(CANDIDATE)
        uri = path_to_uri(path)
        for i in range(repeat):
            start = time.perf_counter()
            async for _ in check_document(Document(uri, path, CANDIDATE, 1), settings, Scratch()):
                pass
            scratch_first.append(time.perf_counter() - start)

            service = CompileService()
            start = time.perf_counter()
            async for _ in service.run(Document(uri, path, CANDIDATE, 1), settings):
                pass
            reuse_first.append(time.perf_counter() - start)

            start, shown = time.perf_counter(), None
            async for stage in service.run(Document(uri, path, EDITED, 2), settings):
                if shown is None and any(TYPO in f.message for f in stage.findings):
                    shown = time.perf_counter() - start
                if stage.final:
                    exact.append(time.perf_counter() - start)
                    if not any(TYPO in f.message for f in stage.findings):
                        raise SystemExit(f"the final result lacks the edit's error: {stage.findings}")
            shown_first.append(shown if shown is not None else float("nan"))
            print(f"  #{i + 1}: first {scratch_first[-1]:.1f} s without reuse, {reuse_first[-1]:.1f} s with; "
                  f"edit: error shown {shown_first[-1]:.2f} s, exact {exact[-1]:.1f} s", file=sys.stderr)
    ratio = statistics.median(reuse_first) / statistics.median(scratch_first)
    shown, full = statistics.median(shown_first), statistics.median(exact)
    return [
        ("first check, no reuse (as before)", f"{statistics.median(scratch_first):.1f} s", "", ""),
        ("first check, with reuse", f"{statistics.median(reuse_first):.1f} s", "<= 1.0x no reuse",
         f"{ratio:.2f}x, {'met' if ratio <= 1.05 else 'not met'}"),
        ("edit in the kernel: its error shown", f"{shown:.2f} s", "<= 3 s", "met" if shown <= 3 else "not met"),
        ("edit in the kernel: exact result", f"{full:.1f} s", "<= 8 s", "met" if full <= 8 else "not met"),
    ]


if __name__ == "__main__":
    report.main("load_inline_edit.py", measure, default_repeat=3)
