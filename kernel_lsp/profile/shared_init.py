"""The shared-memory poison check ("shared-init"), run by the profile driver (`--poison-shared FILE`) in the
candidate's process: what compute-sanitizer cannot do. initcheck checks global memory only, so a kernel that reads
shared memory no thread of its block wrote passes all four tools, and often every correctness trial too (the stale
values happen to be what the kernel before left there).

The check is differential. Shared memory keeps its contents from one kernel to the next, so before each of four
forward calls a tiny kernel (candidate/shared_fill.py's) fills the shared memory of every SM, with pattern A, then B,
then A, then B. An output element that agrees across
both A runs and across both B runs, but differs between A and B, follows what was in shared memory before the
forward call: some kernel read shared memory it never wrote. Agreement is the verifier's tolerance for the dtype
(the patterns read as floats differ by orders of magnitude; an honest kernel's atomics differ in the last bits). An
element that changed between the runs with the same pattern is nondeterminism, not evidence; the check then says
it is inconclusive rather than clean.

What it cannot tell: which line reads (it sees the output, not the access; the worker places the finding on the
candidate's shared-memory declarations), and a read whose stale value never reaches the output. A kernel that runs
after another kernel of the forward call sees that kernel's leftovers, not the fill, so only the forward call's
first kernel with shared memory is fully checked, and later ones only where the earlier left memory untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from kernel_lsp.candidate.shared_fill import Poisoner, PoisonUnavailable
from kernel_lsp.contracts.sanitize_report import FirstDependent, SharedInitAnswer

PATTERNS = (0x5A5A5A5A, 0x3F803F80)  # positive as fp32, fp16 and bf16 (a ReLU keeps them apart), and unequal
SEQUENCE = (0, 1, 0, 1)  # indices into PATTERNS: A, B, A, B
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

    def answer(self) -> SharedInitAnswer:
        import torch

        if self.problem is not None:
            return SharedInitAnswer(problem=self.problem)
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
                first = FirstDependent(index, int(hit.nonzero()[0, 0]))
            elements += stable.numel()
            unstable += int((~stable).sum())
            dependent += count
        return SharedInitAnswer(elements, dependent, unstable, first, problem=None if elements else
                                "the forward call's output holds no tensor values to compare")


def compare(runs: Sequence[list[Any]], sequence: Sequence[int] = SEQUENCE) -> SharedInitAnswer:
    """RunTally's answer over whole runs (output_leaves of each), in `sequence`'s pattern order."""
    tally = RunTally()
    for pattern, run in zip(sequence, runs):
        tally.add(pattern, run)
    return tally.answer()


def run_check(model: Any, inputs: tuple, forward: Callable[[Any, tuple, int], Any], device_index: int = 0,
              poisoner: Callable[[int], Any] = Poisoner) -> SharedInitAnswer:
    """The fill, then one forward call, per pattern of SEQUENCE; compare's answer with the patterns used, or
    `problem` when the fill cannot run or the forward call raises. `poisoner` makes the fill (a test's stand-in
    has `fill(pattern)` and `bytes`)."""
    try:
        filler = poisoner(device_index)
    except PoisonUnavailable as exc:
        return SharedInitAnswer(problem=str(exc))
    tally = RunTally()
    for pattern in SEQUENCE:
        filler.fill(PATTERNS[pattern])
        try:
            output = forward(model, inputs, 1)
        except Exception as exc:  # the candidate's own failure, said as the check's outcome
            return SharedInitAnswer(problem=f"the forward call raised under the shared-memory fill: "
                                            f"{type(exc).__name__}: {exc}")
        tally.add(pattern, output_leaves(output))
        del output
    return dataclasses.replace(tally.answer(), patterns=tuple(f"0x{p:08x}" for p in PATTERNS),
                               fill_bytes=filler.bytes)
