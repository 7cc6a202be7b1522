"""candidate/ablation.py with a real compiled extension (C++ on the CPU, built once by torch's load_inline): the
results of the candidate's own functions are destroyed as made, and only a decoy's output stays the same."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from kernel_lsp.candidate.ablation import ablate, destroy

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # builds a C++ extension

CPP = """
#include <torch/extension.h>

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    auto in = x.contiguous();
    const float* src = in.data_ptr<float>();
    float* dst = y.data_ptr<float>();
    for (int64_t i = 0; i < in.numel(); ++i) dst[i] = src[i] > 0.f ? src[i] : 0.f;
    return y;
}

void relu_out(torch::Tensor x, torch::Tensor out) {
    const float* src = x.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) dst[i] = src[i] > 0.f ? src[i] : 0.f;
}
"""


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory):
    from torch.utils.cpp_extension import load_inline

    build = tmp_path_factory.mktemp("ablation-ext")
    return load_inline("kl_ablation_relu", cpp_sources=[CPP], functions=["relu", "relu_out"],
                       build_directory=str(build), extra_cflags=["-O0"])


def candidate(ext: types.ModuleType, forward, **globals_) -> tuple[types.ModuleType, torch.nn.Module]:
    """A module standing in for the candidate's file (holding ext, and whatever it bound at import) and a model."""
    module = types.ModuleType("kl_candidate")
    module.ops = ext
    vars(module).update(globals_)

    class ModelNew(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.out = torch.empty(64, 32)  # a buffer kept across calls, as some honest kernels do

        def forward(self, x):
            return forward(module, self, x)
    return module, ModelNew()


def run(ext, forward, **globals_) -> dict:
    module, model = candidate(ext, forward, **globals_)
    torch.manual_seed(0)
    inputs, others = (torch.rand(64, 32) - 0.5,), (torch.rand(64, 32) - 0.5,)
    return ablate(model, [module, model], set(), inputs, others)


def test_an_honest_extension_output_changes(ext):
    seen = run(ext, lambda m, self, x: m.ops.relu(x) * 2)
    assert seen.changed and seen.destroyed >= 1 and seen.names == ["kl_ablation_relu.relu"]


def test_a_kept_buffer_written_with_the_same_values_each_call_still_counts(ext):
    def forward(m, self, x):
        m.ops.relu_out(x, self.out)
        return self.out
    assert run(ext, forward).changed


def test_a_function_bound_at_import_is_intercepted_too(ext):
    seen = run(ext, lambda m, self, x: m.relu(x), relu=ext.relu)
    assert seen.changed and seen.launches == 1


@pytest.mark.parametrize("forward", [
    lambda m, self, x: (m.ops.relu_out(x, torch.empty_like(x)), x.clamp(min=0))[1],
    lambda m, self, x: (m.ops.relu(x), torch.maximum(x, torch.zeros_like(x)))[1],
    lambda m, self, x: m.ops.relu(x).copy_(torch.nn.functional.relu(x)),
], ids=["scratch", "result-unused", "overwritten"])
def test_a_decoys_output_stays_the_same(ext, forward):
    seen = run(ext, forward)
    assert not seen.changed and seen.destroyed >= 1, seen
    assert {"clamp", "maximum", "relu"} & set(seen.stock), seen.stock


@pytest.mark.parametrize("forward", [
    lambda m, self, x: x.clamp(min=0) + 0 * m.ops.relu(x),
    lambda m, self, x: x.clamp(min=m.ops.relu(x) * 0),
], ids=["times-zero", "clamp-bound"])
def test_a_result_that_shows_only_through_nan_is_caught_by_the_finite_pass(ext, forward):
    seen = run(ext, forward)
    assert seen.changed_by == {"nan": True, "finite": False, "+inf": True, "-inf": True}, seen
    assert not seen.changed


@pytest.mark.parametrize(("forward", "unchanged"), [
    (lambda m, self, x: torch.maximum(x.clamp(min=0), m.ops.relu(x) - 1000), "-inf"),
    (lambda m, self, x: torch.minimum(x.clamp(min=0), m.ops.relu(x + 5000) - 4000), "+inf"),
], ids=["bound-from-below", "bound-from-above"])
def test_a_result_that_bounds_the_output_from_one_side_is_caught_by_an_infinity(ext, forward, unchanged):
    """A bound under every value (maximum(relu, k - 1000), k in [0, 0.5]): NaN and FINITE (234.5 then) cross it,
    -Inf does not; one over every value from a kernel that writes more than FINITE: +Inf does not cross it."""
    seen = run(ext, forward)
    assert [name for name, changed in seen.changed_by.items() if not changed] == [unchanged], seen
    assert not seen.changed


def test_an_honest_result_changes_in_every_pass(ext):
    seen = run(ext, lambda m, self, x: m.ops.relu(x))
    assert seen.changed_by == {"nan": True, "finite": True, "+inf": True, "-inf": True} and seen.changed, seen


def test_nothing_intercepted_is_said(ext):
    seen = run(ext, lambda m, self, x: x.clamp(min=0))  # no own code called at all: no verdict possible
    assert seen.launches == seen.destroyed == 0


def test_destroy_changes_every_dtype():
    for tensor in (torch.zeros(4), torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.bool),
                   torch.zeros(2, dtype=torch.complex64)):
        before = tensor.clone()
        destroy(tensor)
        assert not torch.equal(before.view(torch.uint8) if before.dtype != torch.bool else before,
                               tensor.view(torch.uint8) if tensor.dtype != torch.bool else tensor), tensor.dtype


def test_extensions_of_installed_packages_are_not_the_candidates():
    from kernel_lsp.candidate.ablation import is_extension

    assert not is_extension(torch._C)
    fake = types.ModuleType("x")
    fake.__file__ = str(Path("/home/u/.cache/torch_extensions/py311_cpu/ext/ext.so"))
    assert is_extension(fake)
