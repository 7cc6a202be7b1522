"""The background workspace pass on a synthetic 1,000-file workspace: scan, read + classify + dependency graph.

    .venv/bin/python benchmarks/workspace_scan.py [--repeat N] [--record]

Generates, in a temporary folder: 400 .cu files each including 1-3 of 100 shared .cuh headers (every .cuh includes
common.h), 100 .h, 300 .py (100 cpp_extension.load a .cu, 50 candidates naming a reference with a
`# kernel-lsp: reference=` header, 150 plain Python), and 100 files under an ignored build/ and node_modules/.
Then times, N times over (median shown):
  - scan_folder (target: well under a second);
  - reading every scanned file, is_kernel_file, and DependencyGraph.update (with a reference_of built on
    verify.pairing.find_reference, as the server passes);
  - dependents() of common.h, which every .cu reaches through its .cuh;
and once more under tracemalloc for the Python heap's peak, and the process's max RSS. --record appends the table to
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import random
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import report  # noqa: E402
from kernel_lsp.verify.pairing import Pairing, find_reference  # noqa: E402
from kernel_lsp.workspace import DependencyGraph, is_kernel_file, scan_folder  # noqa: E402

SCAN_TARGET_S = 0.5
KERNEL = """#include <cuda_runtime.h>
{includes}
__global__ void kernel_{i}(const float* __restrict__ x, float* __restrict__ y, int n) {{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {{
        y[idx] = helper_{h}(x[idx]) * 2.0f;  // #include "not_an_include.h"
    }}
}}
""" + "\n".join(f"// filler line {k}: a comment of the usual length in a kernel file" for k in range(60)) + "\n"
HEADER = """#pragma once
#include "common.h"
__device__ inline float helper_{i}(float v) {{ return v * {i}.0f + 1.0f; }}
"""
LOAD = """import torch
from torch.utils.cpp_extension import load

ext = load(name="ext_{i}", sources=["kernels/k{i}.cu"], verbose=False)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.forward(x)
"""
CANDIDATE = """# kernel-lsp: reference=ref_{i}.py
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
"""
PLAIN = """import os
import sys


def main(argv):
    total = 0
    for arg in argv:
        total += len(arg)
    return total
""" * 4


def make_workspace(root: Path) -> Path:
    """1,000 files: 900 that the scan keeps, 100 it prunes. Returns the widely included header."""
    rng = random.Random(8)
    (root / ".gitignore").write_text("build/\n*.o\n")
    (root / "kernels").mkdir()
    (root / "include").mkdir()
    (root / "python").mkdir()
    common = root / "include" / "common.h"
    common.write_text("#pragma once\n#define COMMON 1\n")
    for i in range(1, 100):
        (root / "include" / f"util_{i}.h").write_text(f"#pragma once\nint util_{i}(int);\n")
    for i in range(100):
        (root / "include" / f"h{i}.cuh").write_text(HEADER.format(i=i))
    for i in range(400):
        chosen = rng.sample(range(100), rng.randint(1, 3))
        includes = "\n".join(f'#include "../include/h{j}.cuh"' for j in chosen)
        (root / "kernels" / f"k{i}.cu").write_text(KERNEL.format(includes=includes, i=i, h=chosen[0]))
    for i in range(100):
        (root / f"load_{i}.py").write_text(LOAD.format(i=i))
    for i in range(50):
        (root / "python" / f"new_{i}.py").write_text(CANDIDATE.format(i=i))
        (root / "python" / f"ref_{i}.py").write_text("class Model:\n    pass\n\ndef get_inputs():\n    return []\n")
    for i in range(100):
        (root / "python" / f"plain_{i}.py").write_text(PLAIN)
    for folder, count in (("build/obj", 60), ("node_modules/pkg", 40)):
        (root / folder).mkdir(parents=True)
        for i in range(count):
            (root / folder / f"gen_{i}.cu").write_text(KERNEL.format(includes="", i=i, h=0))
    return common


def reference_of_for(workspace: Path):
    def reference_of(path: Path, text: str) -> Path | None:
        found = find_reference(path, text, workspace, {}, [])
        return found.reference if isinstance(found, Pairing) else None
    return reference_of


def one_pass(root: Path) -> tuple[float, float, int, int, int, DependencyGraph]:
    started = time.perf_counter()
    scanned = scan_folder(root)
    scan_s = time.perf_counter() - started
    assert not scanned.truncated and scanned.ignored_dirs == 2, scanned
    started = time.perf_counter()
    graph = DependencyGraph(include_dirs=[root / "include"], reference_of=reference_of_for(root))
    kernels = 0
    for path in scanned.files:
        text = path.read_text(encoding="utf-8", errors="replace")
        kernels += is_kernel_file(path, text)
        graph.update(path, text)
    graph_s = time.perf_counter() - started
    return scan_s, graph_s, len(scanned.files), kernels, len(graph.edges()), graph


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.2f} ms (min {min(values) * 1000:.2f}, n={len(values)})"


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        common = make_workspace(root)
        scans, graphs, lookups = [], [], []
        for _ in range(repeat):
            scan_s, graph_s, files, kernels, edges, graph = one_pass(root)
            scans.append(scan_s)
            graphs.append(graph_s)
            started = time.perf_counter()
            reached = graph.dependents(common)
            lookups.append(time.perf_counter() - started)
        assert len(reached) == 100 + 400 + 100, len(reached)  # every .cuh, every .cu, every load_*.py
        tracemalloc.start()
        one_pass(root)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return [
        (f"scan_folder (1,000 files, {files} kept, build/ and node_modules/ pruned)", ms(scans),
         f"<= {SCAN_TARGET_S * 1000:.0f} ms", "ok" if statistics.median(scans) <= SCAN_TARGET_S else "MISSED"),
        (f"read + is_kernel_file + graph.update, {files} files ({kernels} kernel files, {edges} edges)", ms(graphs),
         "(recorded)", ""),
        (f"dependents(common.h) ({len(reached)} files)", ms(lookups), "(recorded)", ""),
        ("Python heap peak during scan + graph (tracemalloc)", f"{peak / 2**20:.1f} MiB", "(recorded)", ""),
        ("process max RSS (whole run)", f"{rss:.1f} MiB", "(recorded)", ""),
    ]


if __name__ == "__main__":
    report.main("workspace_scan.py", measure, default_repeat=3)
