"""Rules on a kernel's SASS (profilers.sass) and ptxas resources (profilers.ptxas): what the code itself shows,
no profiler run needed.

- hint-spills: ptxas reports spill bytes; the spilled values travel through local memory (LDL/STL).
- hint-local-memory: LDL/STL without ptxas spills (or without ptxas figures): usually a per-thread array that
  the compiler could not keep in registers because it is indexed with run-time values.
- hint-narrow-global-access: every global load/store is 32 bits or narrower while global accesses are at least
  MIN_GLOBAL_SHARE of the instructions. It matters only when the kernel is memory-bound: with memory_bound
  False it is not raised, with None it is raised as a conditional "hint".
- hint-no-tensor-cores: a matmul-like kernel with no tensor-core instruction. Matmul-like means either
  (a) its name says so (gemm, matmul, bmm, mm, conv, linear, attention) and it does at least MIN_NAMED_FMAS FMAs,
  or (b) one loop body both reads shared memory and does at least MIN_TILE_LOOP_FMAS FMAs: the shape of a
  shared-memory-tiled product. Plain reductions and unrolled arithmetic (many FMAs, no shared tile) are not.

None of these rules can say how much time a fix saves without a profile, so estimated_speedup stays None.
"""

from __future__ import annotations

import re

from profilers.hints import Hint, HintSeverity
from profilers.ptxas import KernelResources
from profilers.sass import SassStats

MIN_GLOBAL_SHARE = 0.05  # below this, global accesses are a small part of the kernel's instructions
MIN_NAMED_FMAS = 4  # a kernel named like a matmul that does almost no FMAs is a wrapper or a copy
MIN_TILE_LOOP_FMAS = 16  # FMAs per trip of a loop over shared tiles: a 4x4 register tile or a 16-wide dot step
MAX_LINES_IN_MESSAGE = 5
# 'conv' but not 'convert', 'linear' but not 'bilinear'
_MATMUL_NAME = re.compile(r"gemm|matmul|conv(?!ert)|(?<!bi)linear|attention|attn|(?:^|_)b?mm(?:_|$)", re.IGNORECASE)


def sass_hints(stats: SassStats, resources: KernelResources | None = None,
               memory_bound: bool | None = None) -> list[Hint]:
    """The SASS rules' hints for one kernel; `resources` (same kernel, same arch) adds ptxas's spill figures;
    `memory_bound` comes from the roofline or ncu when known."""
    hints = [_local_memory_hint(stats, resources), _narrow_global_hint(stats, memory_bound),
             _no_tensor_cores_hint(stats)]
    return [h for h in hints if h is not None]


def _local_memory_hint(stats: SassStats, resources: KernelResources | None) -> Hint | None:
    lines = sorted(stats.lines("local-load") + stats.lines("local-store"))
    if resources is not None and (resources.spill_stores or resources.spill_loads):
        return _spills_hint(stats, resources, lines)
    if stats.local_loads or stats.local_stores:
        return _local_array_hint(stats, resources, lines)
    return None


def _spills_hint(stats: SassStats, resources: KernelResources, lines: list[tuple[str, int]]) -> Hint:
    message = (f"Spills registers: {resources.spill_stores} B spill stores, {resources.spill_loads} B spill "
               f"loads per thread at {resources.registers} registers ({_local_traffic(stats, lines)}). Spilled "
               "values go through local memory (L1, L2, DRAM): keep fewer values live (smaller per-thread "
               "tiles, fewer unrolled accumulators) or allow more registers (__launch_bounds__, -maxrregcount).")
    metrics = _local_metrics(stats, lines) | {"spill_stores": resources.spill_stores,
                                              "spill_loads": resources.spill_loads, "registers": resources.registers}
    return _hint("hint-spills", stats, "warning", message, lines, metrics)


def _local_array_hint(stats: SassStats, resources: KernelResources | None, lines: list[tuple[str, int]]) -> Hint:
    stack = resources.stack_frame if resources is not None else None
    where = f" from a {stack} B stack frame per thread" if stack else ""
    # ptxas's figures tell a spill from an array; without them the SASS alone cannot
    cause = ("no register spills, so a per-thread array" if resources is not None
             else "register spills (see ptxas -v) or a per-thread array")
    message = (f"Local-memory traffic{where}: {_local_traffic(stats, lines)}; the cause is {cause} indexed at "
               "run time. Index arrays with compile-time constants (fully unrolled loops), or move them to "
               "shared memory.")
    metrics = _local_metrics(stats, lines) | {"stack_frame": stack}
    return _hint("hint-local-memory", stats, "warning", message, lines, metrics)


def _local_traffic(stats: SassStats, lines: list[tuple[str, int]]) -> str:
    return f"{stats.local_loads} LDL / {stats.local_stores} STL instructions{_at_lines(lines)}"


def _local_metrics(stats: SassStats, lines: list[tuple[str, int]]) -> dict:
    return {"local_loads": stats.local_loads, "local_stores": stats.local_stores, "lines": _line_numbers(lines)}


def _narrow_global_hint(stats: SassStats, memory_bound: bool | None) -> Hint | None:
    accesses = stats.global_accesses
    if memory_bound is False or accesses == 0 or stats.bulk_copies or stats.widest_global_bits > 32:
        return None
    share = accesses / max(stats.instruction_count, 1)
    if share < MIN_GLOBAL_SHARE:
        return None
    lines = sorted(stats.lines("global-load", 32) + stats.lines("global-store", 32))
    widths = _width_summary(stats)
    condition = "This kernel is memory-bound and" if memory_bound else "If this kernel is memory-bound:"
    message = (f"{condition} all {accesses} global loads/stores in its SASS are 32-bit or narrower ({widths})"
               f"{_at_lines(lines)}. Load and store 128 bits per thread (float4 / int4 / 8 x __half through "
               "reinterpret_cast on 16-byte-aligned pointers, with a scalar tail) to move the same bytes in "
               "a quarter of the memory instructions.")
    metrics = {"global_loads": dict(stats.global_loads), "global_stores": dict(stats.global_stores),
               "global_share": round(share, 3), "memory_bound": memory_bound, "lines": _line_numbers(lines)}
    severity: HintSeverity = "information" if memory_bound else "hint"
    return _hint("hint-narrow-global-access", stats, severity, message, lines, metrics)


def _no_tensor_cores_hint(stats: SassStats) -> Hint | None:
    reason = matmul_like_reason(stats)
    if reason is None or stats.tensor_core_count:
        return None
    message = (f"Matmul-like ({reason}) with {stats.fma_count} FMAs and no tensor-core instructions "
               "(HMMA / HGMMA). Tensor cores multiply fp16/bf16 tiles ~15x and TF32 ~7x faster than FP32 FMAs "
               "on an H100/H200 (989 / 495 vs 67 dense TFLOPS): use wmma / mma.sync or WGMMA (sm_90), or "
               "CUTLASS / cuBLAS; fp32 inputs need TF32 or a bf16 cast, so check the tolerance.")
    metrics = {"fma_count": stats.fma_count, "max_fma_in_shared_loop": stats.max_fma_in_shared_loop,
               "matmul_like": reason}
    return _hint("hint-no-tensor-cores", stats, "information", message, stats.lines("fma"), metrics)


def matmul_like_reason(stats: SassStats) -> str | None:
    """Why the kernel looks like a matrix product (see the module's docstring), or None."""
    if stats.max_fma_in_shared_loop >= MIN_TILE_LOOP_FMAS:
        return f"a loop over shared-memory tiles with {stats.max_fma_in_shared_loop} FMAs per trip"
    if _MATMUL_NAME.search(stats.base_name) and stats.fma_count >= MIN_NAMED_FMAS:
        return f"named '{stats.base_name}'"
    return None


def _hint(code: str, stats: SassStats, severity: HintSeverity, message: str, lines: list[tuple[str, int]],
          metrics: dict) -> Hint:
    file, line = lines[0] if lines else (None, None)  # the first line in source order carries the diagnostic
    return Hint(code=code, kernel=stats.base_name, severity=severity, message=message, file=file, line=line,
                metrics=metrics)


def _width_summary(stats: SassStats) -> str:
    """'32-bit LDG x2, 32-bit STG x1'"""
    parts = [f"{bits}-bit LDG x{n}" for bits, n in sorted(stats.global_loads.items())]
    parts += [f"{bits}-bit STG x{n}" for bits, n in sorted(stats.global_stores.items())]
    return ", ".join(parts)


def _line_numbers(lines: list[tuple[str, int]]) -> list[int]:
    return sorted({line for _, line in lines})


def _at_lines(lines: list[tuple[str, int]]) -> str:
    numbers = _line_numbers(lines)
    if not numbers:
        return ""
    shown = ", ".join(map(str, numbers[:MAX_LINES_IN_MESSAGE]))
    more = f" and {len(numbers) - MAX_LINES_IN_MESSAGE} more" if len(numbers) > MAX_LINES_IN_MESSAGE else ""
    return f" on line{'s' if len(numbers) > 1 else ''} {shown}{more}"
