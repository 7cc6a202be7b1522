"""Edit-time speed of a load_inline candidate: the first check, then an edit inside a kernel (issue 23).

    .venv/bin/python benchmarks/load_inline_edit.py [--repeat N] [--record]

The file is a KernelBench-style ReLU candidate whose CUDA source includes torch/extension.h (as KernelBench's
and the agents' candidates do). Each repeat, in one process and alternating, so that both see the same load:
  - the first check without reuse (what every check cost before compile/reuse.py): to its final result;
  - the first check with reuse (a fresh CompileService): to its final result; target: no slower than without;
  - an edit inside the kernel (a mistyped name) after it (and after the names of torch's headers are listed in the
    background, as they are while a user reads the first result): to the first report that shows the error
    (target <= 3 s), to the full result (every error, ptxas figures: the split compile's, standing for the exact
    one, compile/split.py; target <= 8 s), and to the exact compile's result that replaces it (its figure alone);
  - the same for an edit that compiles (the full result then carries the kernel's ptxas figures).
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


FIXED = CANDIDATE.replace("out[idx] = x[idx] > 0.f ? x[idx] : 0.f", "out[idx] = fmaxf(x[idx], 0.f)")


def _composed(findings) -> bool:
    return any((f.data or {}).get("composed") for f in findings)


async def _edit(service: CompileService, uri: str, path: Path, text: str, version: int, settings: Settings,
                expect: str) -> tuple[float, float, float]:
    """Seconds to the first report showing `expect`, to the full result, to the exact one."""
    start, shown, full = time.perf_counter(), None, None
    async for stage in service.run(Document(uri, path, text, version), settings):
        now = time.perf_counter() - start
        if shown is None and any(expect in f.message for f in stage.findings):
            shown = now
        if full is None and (_composed(stage.findings) or stage.final):
            full = now
        if stage.final:
            if not any(expect in f.message for f in stage.findings):
                raise SystemExit(f"the final result lacks {expect!r}: {stage.findings}")
            return (shown if shown is not None else float("nan")), full, now
    raise SystemExit("no final result")


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    settings = Settings()
    scratch_first, reuse_first, error_edit, clean_edit = [], [], [], []
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
            await service.reuse.settled()

            error_edit.append(await _edit(service, uri, path, EDITED, 2, settings, TYPO))
            clean_edit.append(await _edit(service, uri, path, FIXED, 3, settings, "relu_kernel: sm_"))
            if service.reuse.disagreements:
                raise SystemExit("a split result shown as the full one differed from the exact result")
            print(f"  #{i + 1}: first {scratch_first[-1]:.1f} s without reuse, {reuse_first[-1]:.1f} s with; "
                  f"edit with an error: shown {error_edit[-1][0]:.2f} s, full {error_edit[-1][1]:.2f} s, exact "
                  f"{error_edit[-1][2]:.1f} s; edit that compiles: full {clean_edit[-1][1]:.2f} s, exact "
                  f"{clean_edit[-1][2]:.1f} s", file=sys.stderr)
    ratio = statistics.median(reuse_first) / statistics.median(scratch_first)

    def median(runs: list[tuple[float, float, float]], index: int) -> float:
        return statistics.median(run[index] for run in runs)

    rows = [
        ("first check, no reuse (as before)", f"{statistics.median(scratch_first):.1f} s", "", ""),
        ("first check, with reuse", f"{statistics.median(reuse_first):.1f} s", "<= 1.0x no reuse",
         f"{ratio:.2f}x, {'met' if ratio <= 1.05 else 'NOT met'}"),
        ("edit in the kernel (an error): the error shown", f"{median(error_edit, 0):.2f} s", "<= 3 s",
         "met" if median(error_edit, 0) <= 3 else "NOT met"),
    ]
    for what, runs in (("an error", error_edit), ("compiles", clean_edit)):
        full, exact = median(runs, 1), median(runs, 2)
        rows += [(f"edit in the kernel ({what}): full result", f"{full:.2f} s", "<= 8 s",
                  "met" if full <= 8 else "NOT met"),
                 (f"edit in the kernel ({what}): the exact compile's result replaces it", f"{exact:.1f} s", "", "")]
    return rows


if __name__ == "__main__":
    report.main("load_inline_edit.py", measure, default_repeat=3)
