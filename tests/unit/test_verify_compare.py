"""compare_outputs: exact error figures, tolerances per dtype, NaN/Inf, nesting, and outputs that try to fool it."""

from __future__ import annotations

import pytest
import torch

from kernel_lsp.verify.compare import (
    Tolerance,
    compare_outputs,
    tolerance_for,
)

EXPECTED = torch.tensor([[1.0, 0.5], [0.0078125, 0.25]])  # RMS below 1: atol is used as given
# 1.0 is off by more (2**-13) but within atol + rtol; 0.0078125 is off by less (2**-13 - 2**-17) and fails.
ACTUAL = torch.tensor([[1.0 + 2**-13, 0.5], [0.0078125 + 2**-13 - 2**-17, 0.25]])


def test_mismatch_reports_exact_errors_and_the_element_that_fails_by_most() -> None:
    result = compare_outputs(EXPECTED, ACTUAL)
    assert (result.ok, result.reason, result.worst_index, result.mismatched, result.total) == (
        False, "mismatch", (1, 0), 1, 4)
    assert result.max_abs_error == 2**-13
    assert (result.worst_expected, result.worst_actual) == (0.0078125, 0.0078125 + 2**-13 - 2**-17)
    assert result.message == ("mismatch: 1 of 4 elements differ; max abs error 1.2e-04, max rel error 1.5e-02 "
                              "at [1, 0] (expected 0.007812, got 0.007927); fp32 tolerance atol=1e-4 rtol=1e-4")


def test_atol_grows_with_the_output_rms_so_a_different_summation_order_passes() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(64, 4096, dtype=torch.float64), torch.randn(4096, 64, dtype=torch.float64)
    exact = a @ b
    reordered = (a[:, :2048].float() @ b[:2048].float()) + (a[:, 2048:].float() @ b[2048:].float())
    result = compare_outputs(exact.float(), reordered)
    assert result.ok, result.message
    off = compare_outputs(exact.float(), reordered + 0.05)  # 0.05 > 1e-4 * RMS (~64) everywhere near 0
    assert not off.ok and "x output RMS 6" in off.message


def test_equal_outputs_pass_and_a_non_contiguous_output_is_fine() -> None:
    values = torch.arange(6.0).reshape(2, 3)
    result = compare_outputs(values.t().contiguous(), values.t())
    assert (result.ok, result.reason, result.max_abs_error, result.mismatched, result.total) == (True, "", 0.0, 0, 6)


def test_relative_error_against_zero_uses_a_tiny_denominator() -> None:
    result = compare_outputs(torch.tensor([0.0, 1.0]), torch.tensor([0.5, 1.0]))
    # float32 outputs are compared in float32: the denominator is float32's smallest normal number
    assert result.max_rel_error == pytest.approx(0.5 / torch.finfo(torch.float32).tiny, rel=1e-6)
    assert (result.worst_index, result.mismatched) == ((0,), 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tolerance_is_1e2(dtype: torch.dtype) -> None:
    expected = torch.tensor([1.0, 2.0], dtype=dtype)
    within = compare_outputs(expected, torch.tensor([1.0078125, 2.0], dtype=dtype))  # 2**-7 <= 0.01 + 0.01
    beyond = compare_outputs(expected, torch.tensor([1.03125, 2.0], dtype=dtype))  # 2**-5 > 0.02
    assert (within.ok, beyond.ok, beyond.mismatched, beyond.max_abs_error) == (True, False, 1, 0.03125)


def test_tolerance_for_defaults_overrides_and_exact_integers() -> None:
    assert tolerance_for(torch.float64) == Tolerance(1e-7, 1e-7)
    assert tolerance_for(torch.bfloat16, {"bfloat16": Tolerance(0.5, 0.0)}) == Tolerance(0.5, 0.0)
    assert tolerance_for(torch.int32) == Tolerance(0.0, 0.0)
    assert tolerance_for(torch.bool) == Tolerance(0.0, 0.0)
    with pytest.raises(ValueError, match="no default tolerance for float8_e4m3fn"):
        tolerance_for(torch.float8_e4m3fn)


def test_override_loosens_the_comparison() -> None:
    result = compare_outputs(EXPECTED, ACTUAL, {"float32": Tolerance(1e-2, 1e-1)})
    assert (result.ok, result.mismatched) == (True, 0)


def test_integers_compare_exactly_beyond_float64_precision() -> None:
    result = compare_outputs(torch.tensor([2**53 + 1]), torch.tensor([2**53]))
    assert (result.ok, result.reason, result.mismatched) == (False, "mismatch", 1)
    assert result.message.endswith("int64 compared exactly")


def test_nan_in_the_candidate_never_passes() -> None:
    result = compare_outputs(torch.ones(4), torch.tensor([1.0, float("nan"), 1.0, 1.0]))
    assert (result.ok, result.reason, result.message) == (False, "nan", "nan: 1 of 4 elements are NaN")


def test_inf_in_the_candidate_never_passes() -> None:
    result = compare_outputs(torch.ones(2), torch.tensor([float("-inf"), 1.0]))
    assert (result.ok, result.reason, result.message) == (False, "inf", "inf: 1 of 2 elements are Inf")


def test_nan_in_the_reference_is_reported_as_ill_posed_even_when_the_candidate_matches() -> None:
    both = torch.tensor([float("nan"), 1.0])
    result = compare_outputs(both, both.clone())
    assert (result.ok, result.reason) == (False, "nan")
    assert result.message == ("nan: the reference produced 1 NaN of 2 elements; "
                              "the problem is ill-posed for this input (change the inputs)")


def test_nested_outputs_report_the_first_failing_path() -> None:
    result = compare_outputs((EXPECTED, [EXPECTED, EXPECTED]), (EXPECTED, [EXPECTED, ACTUAL]))
    assert (result.reason, result.worst_index) == ("mismatch", (1, 0))
    assert result.message.startswith("output[1][1]: mismatch: 1 of 4 elements differ;")


def test_nested_outputs_that_all_pass_sum_their_elements() -> None:
    result = compare_outputs((EXPECTED, [torch.zeros(3)]), [EXPECTED, (torch.zeros(3),)])
    assert (result.ok, result.total, result.worst_index) == (True, 7, None)
    assert result.message == "ok: 2 outputs, 7 elements within tolerance; max abs error 0.0e+00, max rel error 0.0e+00"


def test_wrong_number_of_outputs_is_a_structure_problem() -> None:
    result = compare_outputs((EXPECTED, EXPECTED), (EXPECTED,))
    assert (result.reason, result.message) == ("structure", "output: expected 2 outputs, got 1")
    single = compare_outputs((EXPECTED,), EXPECTED)
    assert (single.reason, single.message) == ("structure", "output: expected a sequence of 1 outputs, got Tensor")


class SneakyTensor(torch.Tensor):
    """A subclass could override __eq__ / __torch_function__ to look equal to anything."""


def test_tensor_subclass_is_refused_even_with_equal_values() -> None:
    result = compare_outputs(EXPECTED, EXPECTED.clone().as_subclass(SneakyTensor))
    assert (result.ok, result.reason) == (False, "type")
    assert result.message == f"expected a plain torch.Tensor, got {SneakyTensor.__module__}.SneakyTensor"


def test_non_tensor_output_is_refused() -> None:
    result = compare_outputs(EXPECTED, EXPECTED.tolist())
    assert (result.reason, result.message) == ("type", "expected a plain torch.Tensor, got builtins.list")


def test_wrong_shape_dtype_and_device_are_refused_before_values() -> None:
    shape = compare_outputs(EXPECTED, EXPECTED.reshape(4))
    dtype = compare_outputs(EXPECTED, EXPECTED.double())
    device = compare_outputs(EXPECTED, torch.empty_like(EXPECTED, device="meta"))
    assert (shape.reason, shape.message) == ("shape", "shape: expected [2, 2], got [4]")
    assert (dtype.reason, dtype.message) == ("dtype", "dtype: expected float32, got float64")
    assert (device.reason, device.message) == ("device", "device: expected cpu, got meta")


def test_sparse_output_is_refused() -> None:
    result = compare_outputs(EXPECTED, EXPECTED.to_sparse())
    assert (result.reason, result.message) == ("type", "expected a dense (strided) tensor, got layout torch.sparse_coo")


def test_empty_outputs_pass() -> None:
    result = compare_outputs(torch.empty(0, 3), torch.empty(0, 3))
    assert (result.ok, result.total, result.message) == (True, 0, "ok: empty output")


def test_chunked_comparison_gives_the_same_figures_as_one_chunk(monkeypatch) -> None:
    import kernel_lsp.verify.compare as compare

    torch.manual_seed(1)
    expected = torch.randn(7, 11)
    actual = expected + torch.randn(7, 11) * 1e-4
    whole = compare_outputs(expected, actual)
    monkeypatch.setattr(compare, "COMPARE_CHUNK", 5)
    assert compare_outputs(expected, actual) == whole
    late_nan = actual.clone()
    late_nan[6, 10] = float("nan")  # in the last chunk
    assert compare_outputs(expected, late_nan).reason == "nan"


def test_rerun_comparison_looks_at_every_chunk(monkeypatch) -> None:
    import kernel_lsp.verify.compare as compare
    from kernel_lsp.verify.checks import same_within

    monkeypatch.setattr(compare, "COMPARE_CHUNK", 4)
    first = torch.randn(3, 5)
    again = first.clone()
    assert same_within(first, again, {})
    again[2, 4] += 1.0  # the last element: in the last, partial chunk
    assert not same_within(first, again, {})
    both_nan = first.clone()
    both_nan[1, 1] = float("nan")
    assert same_within(both_nan, both_nan.clone(), {})  # a NaN the run repeats is not garbage read
    assert not same_within(torch.arange(9), torch.arange(9).flip(0), {})
