"""The shared-memory poison check ("shared-init"), run by the profile driver (`--poison-shared FILE`) in the
candidate's process: what compute-sanitizer cannot do. initcheck checks global memory only, so a kernel that reads
shared memory no thread of its block wrote passes all four tools, and often every correctness trial too (the stale
values happen to be what the kernel before left there).

The check is differential. Shared memory keeps its contents from one kernel to the next (seen on an H100: after a
kernel filled every SM's shared memory with a pattern, a later kernel's never-written shared array held that
pattern in 100% of its words; tests/gpu/RESULTS.md, 2026-12-05). So before each of four forward calls a tiny kernel
fills the shared memory of every SM, with pattern A, then B, then A, then B. An output element that agrees across
both A runs and across both B runs, but differs between A and B, follows what was in shared memory before the
forward call: some kernel read shared memory it never wrote. Agreement is the verifier's tolerance for the dtype
(the patterns read as floats differ by orders of magnitude; an honest kernel's atomics differ in the last bits). An
element that changed between the runs with the same pattern is nondeterminism, not evidence; the check then says
it is inconclusive rather than clean.

What it cannot tell: which line reads (it sees the output, not the access; the worker places the finding on the
candidate's shared-memory declarations), and a read whose stale value never reaches the output. A kernel that runs
after another kernel of the forward call sees that kernel's leftovers, not the fill, so only the forward call's
first kernel with shared memory is fully checked, and later ones only where the earlier left memory untouched.
The fill kernel is PTX loaded through the CUDA driver API (ctypes on libcuda): no compiler is needed, and it loads
in milliseconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Sequence
from typing import Any

PATTERNS = (0x5A5A5A5A, 0x3F803F80)  # positive as fp32, fp16 and bf16 (a ReLU keeps them apart), and unequal
SEQUENCE = (0, 1, 0, 1)  # indices into PATTERNS: A, B, A, B
BLOCKS_PER_SM = 4  # the fill's grid: every SM gets a block (one fits per SM at the opt-in maximum)
KERNEL = "kernel_lsp_poison"

# st.volatile: the stores are never read back, so the compiler is told they matter (ptxas 13.0 keeps a plain
# st.shared here too; the volatile one does not rest on that). tests/unit/test_shared_init.py assembles it.
PTX = r"""
.version 7.0
.target sm_75
.address_size 64

.extern .shared .align 16 .b8 kernel_lsp_poison_smem[];

.visible .entry kernel_lsp_poison(.param .u32 pattern, .param .u32 words)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    ld.param.u32 %r1, [pattern];
    ld.param.u32 %r2, [words];
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, kernel_lsp_poison_smem;
LOOP:
    setp.ge.u32 %p1, %r3, %r2;
    @%p1 bra DONE;
    shl.b32 %r6, %r3, 2;
    add.u32 %r7, %r5, %r6;
    st.volatile.shared.u32 [%r7], %r1;
    add.u32 %r3, %r3, %r4;
    bra LOOP;
DONE:
    ret;
}
"""

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
FILL_THREADS = 1024


class PoisonUnavailable(Exception):
    """The fill kernel cannot run here (no libcuda, the PTX did not load): the check says so, never clean."""


class DriverFill:
    """The fill kernel loaded into the current CUDA context through the driver API (`library`: libcuda, opened
    with ctypes), for `bytes` of dynamic shared memory per block and `blocks` blocks."""

    def __init__(self, library: Any, bytes_per_block: int, blocks: int) -> None:
        self.cuda, self.bytes, self.blocks = library, bytes_per_block, blocks
        context = ctypes.c_void_p()
        self._check(self.cuda.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        if not context.value:
            raise PoisonUnavailable("no current CUDA context (PyTorch has not initialised CUDA on this thread)")
        self.module = ctypes.c_void_p()
        self._check(self.cuda.cuModuleLoadData(ctypes.byref(self.module), ctypes.c_char_p(PTX.encode())),
                    "cuModuleLoadData (the fill kernel's PTX)")
        self.function = ctypes.c_void_p()
        self._check(self.cuda.cuModuleGetFunction(ctypes.byref(self.function), self.module, KERNEL.encode()),
                    "cuModuleGetFunction")
        self._check(self.cuda.cuFuncSetAttribute(self.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                 ctypes.c_int(self.bytes)), "cuFuncSetAttribute")

    def launch(self, pattern: int, stream: int | None) -> None:
        """The fill on `stream` (a CUstream handle; 0 or None: the legacy default stream), not waited for."""
        values = (ctypes.c_uint32(pattern), ctypes.c_uint32(self.bytes // 4))
        params = kernel_params(*values)
        self._check(self.cuda.cuLaunchKernel(self.function, ctypes.c_uint(self.blocks), ctypes.c_uint(1),
                                             ctypes.c_uint(1), ctypes.c_uint(FILL_THREADS), ctypes.c_uint(1),
                                             ctypes.c_uint(1), ctypes.c_uint(self.bytes), ctypes.c_void_p(stream),
                                             params, None), "cuLaunchKernel (the fill)")

    def _check(self, code: int, what: str) -> None:
        if code:
            text = ctypes.c_char_p()
            self.cuda.cuGetErrorString(code, ctypes.byref(text))
            raise PoisonUnavailable(f"{what} failed: CUDA error {code} ({(text.value or b'?').decode()})")


def kernel_params(*values: Any) -> Any:
    """cuLaunchKernel's kernelParams: an array of pointers, one to each argument's value (the values must outlive
    the launch call)."""
    return (ctypes.c_void_p * len(values))(*(ctypes.addressof(value) for value in values))


def load_driver() -> Any:
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        return ctypes.CDLL(name)
    except OSError as exc:
        raise PoisonUnavailable(f"cannot load the CUDA driver library ({name}): {exc}") from exc


class Poisoner:
    """The fill of every SM's shared memory, in torch's context on one device."""

    def __init__(self, device_index: int = 0, library: Any = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise PoisonUnavailable("no CUDA device is visible to the candidate's process")
        torch.cuda.set_device(device_index)  # the fill goes to the current context: this device's
        torch.zeros(1, device=f"cuda:{device_index}")  # the runtime makes the primary context current here
        props = torch.cuda.get_device_properties(device_index)
        self.bytes = int(getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024)
        self.fill_kernel = DriverFill(library or load_driver(), self.bytes,
                                      int(props.multi_processor_count) * BLOCKS_PER_SM)

    def fill(self, pattern: int) -> None:
        """Every word of every SM's shared memory (as much as one block may have) set to `pattern`; synchronous."""
        import torch

        torch.cuda.synchronize()
        self.fill_kernel.launch(pattern, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()


def output_leaves(output: Any) -> list[Any]:
    """Every tensor of a forward call's output (nested in tuples, lists, dicts), flat and copied where it is (a
    candidate that returns the same tensor each call must not overwrite an earlier run's answer); complex values
    as (real, imaginary) pairs."""
    import torch

    from kernel_lsp.verify.compare import flat_view

    tensors: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(output)
    return [flat_view(tensor.detach())[0].clone() for tensor in tensors]


def close(a: Any, b: Any, scale: float) -> Any:
    """Element by element, whether two runs' values agree: integers and booleans exactly; floats within the
    verifier's tolerance for their dtype (atol times the output's scale, plus rtol), so the last-bit differences of
    an honest kernel's atomics are not taken for nondeterminism; NaN agrees with NaN, an infinity with itself.
    Floats without a default tolerance (float8) agree only when equal."""
    import torch

    from kernel_lsp.verify.compare import DEFAULT_TOLERANCES, EXACT

    if not a.is_floating_point():
        return a == b
    tolerance = DEFAULT_TOLERANCES.get(a.dtype, EXACT)
    wide = torch.float64 if a.dtype == torch.float64 else torch.float32
    x, y = a.to(wide), b.to(wide)
    return ((x - y).abs() <= tolerance.atol * scale + tolerance.rtol * y.abs()) | (x == y) | (x.isnan() & y.isnan())


CHUNK = 1 << 24  # elements compared at a time: bounds the float temporaries of a many-GiB output


class RunTally:
    """The runs' outputs in pattern order, one at a time: the first run of each pattern is kept, each later one is
    compared with its pattern's first and dropped. `dependent`: elements that agree across the runs of each pattern
    and differ between the patterns; `unstable`: elements that changed between runs of one pattern."""

    def __init__(self) -> None:
        self.first: dict[int, list[Any]] = {}
        self.stable: list[Any] | None = None
        self.scales: list[float] = []
        self.problem: str | None = None

    def add(self, pattern: int, leaves: list[Any]) -> None:
        import torch

        from kernel_lsp.verify.compare import output_scale

        if self.problem is not None:
            return
        reference = next(iter(self.first.values()), None)
        shapes = [(t.dtype, t.numel()) for t in leaves]
        if reference is not None and shapes != [(t.dtype, t.numel()) for t in reference]:
            self.problem = "the forward call's outputs had different shapes or dtypes from one run to the next"
            return
        if reference is None:
            self.scales = [output_scale(t) if t.is_floating_point() else 1.0 for t in leaves]
            self.stable = [torch.ones(t.numel(), dtype=torch.bool, device=t.device) for t in leaves]
        if pattern not in self.first:
            self.first[pattern] = leaves
            return
        for stable, kept, new, scale in zip(self.stable or [], self.first[pattern], leaves, self.scales):
            for offset in range(0, kept.numel(), CHUNK):
                part = slice(offset, offset + CHUNK)
                stable[part] &= close(kept[part], new[part], scale)

    def answer(self) -> dict[str, Any]:
        import torch

        if self.problem is not None:
            return {"elements": 0, "dependent": 0, "unstable": 0, "first": None, "problem": self.problem}
        patterns = list(self.first.values())
        elements = dependent = unstable = 0
        first = None
        for index, stable in enumerate(self.stable or []):
            differs = torch.zeros_like(stable)
            for other in patterns[1:]:
                for offset in range(0, stable.numel(), CHUNK):
                    part = slice(offset, offset + CHUNK)
                    differs[part] |= ~close(patterns[0][index][part], other[index][part], self.scales[index])
            hit = stable & differs
            count = int(hit.sum())
            if count and first is None:
                first = {"output": index, "index": int(hit.nonzero()[0, 0])}
            elements += stable.numel()
            unstable += int((~stable).sum())
            dependent += count
        answer = {"elements": elements, "dependent": dependent, "unstable": unstable, "first": first}
        if not elements:
            answer["problem"] = "the forward call's output holds no tensor values to compare"
        return answer


def compare(runs: Sequence[list[Any]], sequence: Sequence[int] = SEQUENCE) -> dict[str, Any]:
    """RunTally's answer over whole runs (output_leaves of each), in `sequence`'s pattern order."""
    tally = RunTally()
    for pattern, run in zip(sequence, runs):
        tally.add(pattern, run)
    return tally.answer()


def run_check(model: Any, inputs: tuple, forward: Callable[[Any, tuple, int], Any], device_index: int = 0,
              poisoner: Callable[[int], Any] = Poisoner) -> dict[str, Any]:
    """The fill, then one forward call, per pattern of SEQUENCE; compare's answer with the patterns used, or
    `problem` when the fill cannot run or the forward call raises. `poisoner` makes the fill (a test's stand-in
    has `fill(pattern)` and `bytes`)."""
    try:
        filler = poisoner(device_index)
    except PoisonUnavailable as exc:
        return {"problem": str(exc)}
    tally = RunTally()
    for pattern in SEQUENCE:
        filler.fill(PATTERNS[pattern])
        try:
            output = forward(model, inputs, 1)
        except Exception as exc:  # the candidate's own failure, said as the check's outcome
            return {"problem": f"the forward call raised under the shared-memory fill: {type(exc).__name__}: {exc}"}
        tally.add(pattern, output_leaves(output))
        del output
    return {**tally.answer(), "patterns": [f"0x{p:08x}" for p in PATTERNS], "fillBytes": filler.bytes}
