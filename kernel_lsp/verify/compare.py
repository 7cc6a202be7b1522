"""Does a candidate's output equal the reference's, within a dtype's tolerance, and if not, where and by how much.

Outputs are a tensor or a (nested) tuple/list of tensors. Shape, dtype and device must match exactly; the
candidate's leaves must be plain `torch.Tensor`s (a subclass can override comparison, so it is refused).

NaN or Inf never passes. When the reference itself produces NaN/Inf the problem is ill-posed for this input:
the reason is still 'nan' / 'inf' (the verdict "not proven" is the same), and the message says the reference
produced it, so the user changes the input rather than the kernel.

Values are compared in float64 on the tensors' own device (no overflow, works the same on CUDA and CPU), with
the rule |actual - expected| <= atol * scale + rtol * |expected|, scale = max(1, RMS of the reference output). Integer and bool outputs compare exactly.
Complex outputs compare as (real, imag) pairs: counts are of components, the worst index ends in 0 or 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from kernel_lsp.contracts.verify_report import Comparison


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


DEFAULT_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(1e-4, 1e-4),
    torch.float16: Tolerance(1e-2, 1e-2),
    torch.bfloat16: Tolerance(1e-2, 1e-2),
    torch.float64: Tolerance(1e-7, 1e-7),
}

EXACT = Tolerance(0.0, 0.0)

SHORT_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32: the key users write in tolerance overrides."""
    return str(dtype).removeprefix("torch.")


def tolerance_for(dtype: torch.dtype, overrides: dict[str, Tolerance] | None = None) -> Tolerance:
    """The tolerance for one output dtype: an override by dtype name, else the default; integers are exact.

    Raises ValueError for a floating dtype with no default (e.g. float8), so the gap is named, not guessed.
    """
    if overrides and dtype_name(dtype) in overrides:
        return overrides[dtype_name(dtype)]
    if dtype.is_complex:
        return tolerance_for(dtype.to_real(), overrides)
    if not dtype.is_floating_point:
        return EXACT
    if dtype not in DEFAULT_TOLERANCES:
        raise ValueError(f"no default tolerance for {dtype_name(dtype)}; "
                         f"set one in the tolerance overrides under the key {dtype_name(dtype)!r}")
    return DEFAULT_TOLERANCES[dtype]


def refused(reason: str, message: str, total: int = 0) -> Comparison:
    """A verdict reached before any value was compared (wrong type, structure, shape, dtype, device)."""
    return Comparison(ok=False, reason=reason, max_abs_error=0.0, max_rel_error=0.0, worst_index=None,
                      worst_expected=None, worst_actual=None, mismatched=0, total=total, message=message)


def compare_outputs(expected: object, actual: object,
                    tolerance_overrides: dict[str, Tolerance] | None = None) -> Comparison:
    """Compare a reference output with a candidate's; the first failing leaf is reported with its path."""
    leaves = compare_tree(expected, actual, "output", tolerance_overrides)
    failed = next((leaf for leaf in leaves if not leaf.ok), None)
    if failed is not None:
        return failed
    if len(leaves) == 1:
        return leaves[0]
    return summarize_passing(leaves)


def compare_tree(expected: object, actual: object, path: str,
                 overrides: dict[str, Tolerance] | None) -> list[Comparison]:
    """One Comparison per leaf, in order, stopping at the first failure (later leaves cannot rescue it)."""
    if isinstance(expected, torch.Tensor):
        leaf = compare_leaf(expected, actual, overrides)
        return [leaf if path == "output" else with_path(leaf, path)]
    if not isinstance(expected, Sequence) or isinstance(expected, str):
        return [refused("type", f"{path}: the reference returned {type(expected).__name__}, not a tensor; "
                                "only tensors and tuples/lists of tensors can be compared")]
    if not isinstance(actual, (tuple, list)):
        return [refused("structure", f"{path}: expected a sequence of {len(expected)} outputs, "
                                     f"got {type(actual).__name__}")]
    if len(actual) != len(expected):
        return [refused("structure", f"{path}: expected {len(expected)} outputs, got {len(actual)}")]
    leaves: list[Comparison] = []
    for index, (expected_item, actual_item) in enumerate(zip(expected, actual)):
        leaves.extend(compare_tree(expected_item, actual_item, f"{path}[{index}]", overrides))
        if not leaves[-1].ok:
            break
    return leaves


def with_path(leaf: Comparison, path: str) -> Comparison:
    return replace(leaf, message=f"{path}: {leaf.message}")


def summarize_passing(leaves: list[Comparison]) -> Comparison:
    """All leaves passed: the largest errors overall (a worst index would need its leaf's path, so none)."""
    total = sum(leaf.total for leaf in leaves)
    max_abs = max(leaf.max_abs_error for leaf in leaves)
    max_rel = max(leaf.max_rel_error for leaf in leaves)
    message = (f"ok: {len(leaves)} outputs, {total} elements within tolerance; "
               f"max abs error {max_abs:.1e}, max rel error {max_rel:.1e}")
    return Comparison(True, "", max_abs, max_rel, None, None, None, 0, total, message)


def compare_leaf(expected: torch.Tensor, actual: object, overrides: dict[str, Tolerance] | None) -> Comparison:
    problem = metadata_problem(expected, actual)
    if problem is not None:
        return refused(*problem)
    assert isinstance(actual, torch.Tensor)
    tolerance = tolerance_for(expected.dtype, overrides)
    with torch.no_grad():
        return compare_values(expected.detach(), actual.detach(), tolerance)


def metadata_problem(expected: torch.Tensor, actual: object) -> tuple[str, str] | None:
    """(reason, message) when the candidate's leaf is not a plain tensor of the reference's shape/dtype/device."""
    if type(actual) is not torch.Tensor:
        return "type", f"expected a plain torch.Tensor, got {type(actual).__module__}.{type(actual).__qualname__}"
    if actual.layout != torch.strided:
        return "type", f"expected a dense (strided) tensor, got layout {actual.layout}"
    if actual.is_nested:  # a nested tensor may have the strided layout
        return "type", "expected a dense (strided) tensor, got a nested tensor"
    if actual.shape != expected.shape:
        return "shape", f"shape: expected {list(expected.shape)}, got {list(actual.shape)}"
    if actual.dtype != expected.dtype:
        return "dtype", f"dtype: expected {dtype_name(expected.dtype)}, got {dtype_name(actual.dtype)}"
    if actual.device != expected.device:
        return "device", f"device: expected {expected.device}, got {actual.device}"
    return None


COMPARE_CHUNK = 1 << 26  # elements compared at a time: float64 temporaries stay a few GiB for any output size


def flat_view(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The values in index order, and the shape their flat indices unravel to (complex: (real, imag) pairs)."""
    if tensor.dtype.is_complex:
        tensor = torch.view_as_real(tensor.resolve_conj())
    return tensor.reshape(-1), tuple(tensor.shape)


def chunks(expected: torch.Tensor, actual: torch.Tensor):
    """(offset, expected chunk, actual chunk), the chunks in their own dtype."""
    for start in range(0, expected.numel(), COMPARE_CHUNK):
        yield start, expected[start:start + COMPARE_CHUNK], actual[start:start + COMPARE_CHUNK]


def non_finite_problem(expected: torch.Tensor, actual: torch.Tensor) -> tuple[str, str] | None:
    """NaN / Inf in either flat output, naming the reference when it is the one that produced them. The counts
    stay on the device until every chunk is counted (one synchronization, not four per chunk)."""
    counts = {"nan": [0, 0], "inf": [0, 0]}
    if expected.is_floating_point():
        totals = torch.zeros(4, dtype=torch.int64, device=expected.device)
        for _, e, a in chunks(expected, actual):
            totals += torch.stack([torch.isnan(e).sum(), torch.isnan(a).sum(), torch.isinf(e).sum(),
                                   torch.isinf(a).sum()])
        nan_e, nan_a, inf_e, inf_a = totals.tolist()
        counts = {"nan": [nan_e, nan_a], "inf": [inf_e, inf_a]}
    for reason, label in (("nan", "NaN"), ("inf", "Inf")):
        in_reference, in_candidate = counts[reason]
        if in_reference:
            return reason, (f"{reason}: the reference produced {in_reference} {label} of {expected.numel()} "
                            "elements; the problem is ill-posed for this input (change the inputs)")
        if in_candidate:
            return reason, f"{reason}: {in_candidate} of {actual.numel()} elements are {label}"
    return None


def unravel(flat_index: int, shape: Sequence[int]) -> tuple[int, ...]:
    index: list[int] = []
    for size in reversed(shape):
        flat_index, position = divmod(flat_index, size)
        index.append(position)
    return tuple(reversed(index))


@dataclass
class ErrorTally:
    """Running figures over the chunks of one comparison, kept on the device until `settle` (one synchronization
    for the whole comparison). The arithmetic runs in float32 for float32 and narrower outputs (its rounding,
    ~6e-8 relative, is far below any tolerance), in float64 for float64 and integer outputs."""

    mismatched: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst_excess: float = float("-inf")
    worst_flat: int = 0
    worst_expected: float = 0.0
    worst_actual: float = 0.0
    parts: list[torch.Tensor] = field(default_factory=list)  # per chunk, on the device: see add

    def add(self, offset: int, expected: torch.Tensor, actual: torch.Tensor, tolerance: Tolerance,
            scale: float) -> None:
        work = torch.promote_types(expected.dtype, torch.float32) if expected.is_floating_point() else torch.float64
        e, a = expected.to(work), actual.to(work)
        abs_error = (a - e).abs()
        excess = abs_error - (tolerance.atol * scale + tolerance.rtol * e.abs())
        if tolerance == EXACT:
            mismatched = (actual != expected).sum()  # exact integers, even beyond float64's 2**53
        else:
            mismatched = (excess > 0).sum()
        rel_error = abs_error / e.abs().clamp_min(torch.finfo(work).tiny)
        local = excess.argmax()
        self.parts.append(torch.stack([mismatched.double(), abs_error.max().double(), rel_error.max().double(),
                                       excess[local].double(), (local + offset).double(), e[local].double(),
                                       a[local].double()]))  # a flat index is exact in float64 below 2**53

    def settle(self) -> None:
        """The chunks' figures, read back at once: counts added, maxima taken, the first worst element kept."""
        for mismatched, max_abs, max_rel, excess, flat, expected, actual in (
                torch.stack(self.parts).tolist() if self.parts else []):
            self.mismatched += int(mismatched)
            self.max_abs, self.max_rel = max(self.max_abs, max_abs), max(self.max_rel, max_rel)
            if excess > self.worst_excess:
                self.worst_excess, self.worst_flat = excess, int(flat)
                self.worst_expected, self.worst_actual = expected, actual
        self.parts.clear()


def compare_values(expected: torch.Tensor, actual: torch.Tensor, tolerance: Tolerance) -> Comparison:
    """Chunk by chunk, so that comparing a many-GiB output needs only a few GiB of float64 temporaries."""
    expected_flat, shape = flat_view(expected)
    actual_flat, _ = flat_view(actual)
    total = expected_flat.numel()
    problem = non_finite_problem(expected_flat, actual_flat)
    if problem is not None:
        return refused(*problem, total=total)
    if total == 0:
        return Comparison(True, "", 0.0, 0.0, None, None, None, 0, 0, "ok: empty output")
    scale = output_scale(expected_flat)
    tally = ErrorTally()
    for offset, e, a in chunks(expected_flat, actual_flat):
        tally.add(offset, e, a, tolerance, scale)
    tally.settle()
    worst_index = unravel(tally.worst_flat, shape)
    ok = tally.mismatched == 0
    head = (f"ok: {total} elements within tolerance" if ok
            else f"mismatch: {tally.mismatched} of {total} elements differ")
    message = (f"{head}; max abs error {tally.max_abs:.1e}, max rel error {tally.max_rel:.1e} at {list(worst_index)} "
               f"(expected {tally.worst_expected:.4g}, got {tally.worst_actual:.4g}); "
               f"{describe_tolerance(expected.dtype, tolerance, scale)}")
    return Comparison(ok, "" if ok else "mismatch", tally.max_abs, tally.max_rel, worst_index, tally.worst_expected,
                      tally.worst_actual, tally.mismatched, total, message)


def output_scale(expected: torch.Tensor) -> float:
    """The RMS of the reference output, at least 1: what atol is multiplied by.

    Summing signed terms cancels, so an element near 0 carries the rounding error of terms as large as the
    output's typical value; an absolute tolerance that ignores this rejects honest kernels that only sum in a
    different order (a 4096-long fp32 dot product of N(0, 1) values differs by ~1e-4 between orders).
    """
    squares = torch.zeros((), dtype=torch.float64, device=expected.device)
    for _, e, _ in chunks(expected, expected):
        squares += e.to(torch.float64).square().sum()
    return max(1.0, (float(squares) / expected.numel()) ** 0.5)


def short_float(value: float) -> str:
    """1e-4 rather than 0.0001 or 1.00e-04."""
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def describe_tolerance(dtype: torch.dtype, tolerance: Tolerance, scale: float = 1.0) -> str:
    name = SHORT_DTYPE_NAMES.get(dtype, dtype_name(dtype))
    if tolerance == EXACT:
        return f"{name} compared exactly"
    scaled = f" x output RMS {scale:.3g}" if scale > 1.0 else ""
    return f"{name} tolerance atol={short_float(tolerance.atol)}{scaled} rtol={short_float(tolerance.rtol)}"
