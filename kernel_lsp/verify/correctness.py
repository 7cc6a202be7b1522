"""Correctness trials of a candidate against its reference, run inside a sandboxed child.

Each trial draws fresh inputs (a different seed, created on the target device), runs the reference,
then the candidate on its own copies of the inputs, and checks that the candidate left its inputs
unchanged, returned a plain tensor, and matches within the dtype's tolerance. Both models get the
same weights: the reference's state_dict where names and shapes match, else the same seed.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from kernel_lsp.verify.compare import Comparison, Tolerance, compare_outputs
from kernel_lsp.verify.integrity import changed_inputs, checksum_tensors, flush_allocator, poison_free_memory
from kernel_lsp.verify.timing import make_input_sets

WEIGHTS_SEED = 1234


@dataclass
class TrialReport:
    trials: int
    passed: int
    worst: dict[str, Any] | None  # the failing (or, when all pass, the largest-error) Comparison as a dict
    integrity: list[dict[str, str]] = field(default_factory=list)  # {"code", "message"}
    weights: str = ""  # how the candidate got the reference's weights

    @property
    def ok(self) -> bool:
        return self.passed == self.trials and not self.integrity


def load_module(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, Path(path).resolve())
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build_models(reference: ModuleType, candidate: ModuleType, device: str) -> tuple[torch.nn.Module,
                                                                                     torch.nn.Module, str]:
    """Both models with the same weights, in eval mode on the device."""
    init_inputs = reference.get_init_inputs() if hasattr(reference, "get_init_inputs") else []
    torch.manual_seed(WEIGHTS_SEED)
    ref_model = reference.Model(*init_inputs)
    torch.manual_seed(WEIGHTS_SEED)
    cand_model = candidate.ModelNew(*init_inputs)
    how = share_weights(ref_model, cand_model)
    return ref_model.to(device).eval(), cand_model.to(device).eval(), how


def share_weights(reference: torch.nn.Module, candidate: torch.nn.Module) -> str:
    ref_state = reference.state_dict()
    cand_state = candidate.state_dict()
    shared = {k: v for k, v in ref_state.items() if k in cand_state and cand_state[k].shape == v.shape}
    if not ref_state:
        return "no weights"
    if shared:
        candidate.load_state_dict(shared, strict=False)
        return f"state_dict: {len(shared)} of {len(ref_state)} tensors loaded"
    return "same seed for both constructions (no state_dict names matched)"


def run_trials(reference_file: str, candidate_file: str, trials: int = 5, device: str = "cpu",
               seed: int = 0, tolerance_overrides: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """The sandbox entry: imports both files, runs the trials, returns a TrialReport as a dict."""
    reference = load_module(reference_file, "kernel_lsp_reference")
    candidate = load_module(candidate_file, "kernel_lsp_candidate")
    ref_model, cand_model, weights = build_models(reference, candidate, device)
    overrides = {name: Tolerance(**t) for name, t in (tolerance_overrides or {}).items()}
    report = TrialReport(trials=trials, passed=0, worst=None, weights=weights)
    worst: Comparison | None = None
    for inputs in make_input_sets(reference.get_inputs, trials, seed, device):
        comparison, problems = one_trial(ref_model, cand_model, inputs, device, overrides)
        report.integrity += [p for p in problems if p not in report.integrity]
        if comparison.ok:
            report.passed += 1
        if worst is None or worse(comparison, worst):
            worst = comparison
    report.worst = asdict(worst) if worst is not None else None
    return {**asdict(report), "ok": report.ok}


def one_trial(ref_model: torch.nn.Module, cand_model: torch.nn.Module, inputs: tuple, device: str,
              tolerance_overrides: dict[str, Tolerance]) -> tuple[Comparison, list[dict[str, str]]]:
    with torch.no_grad():
        expected = ref_model(*copy.deepcopy(inputs))
        flush_allocator(device)
        poison_free_memory(device)
        candidate_inputs = copy.deepcopy(inputs)
        before = checksum_tensors(candidate_inputs)
        actual = cand_model(*candidate_inputs)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    problems = []
    changed = changed_inputs(before, checksum_tensors(candidate_inputs))
    if changed:
        problems.append({"code": "integrity-input-mutated",
                         "message": f"the candidate changed input tensor(s) {changed} in place"})
    return compare_outputs(expected, actual, tolerance_overrides), problems


def worse(a: Comparison, b: Comparison) -> bool:
    """A failure is worse than a pass; between equals, the larger absolute error."""
    if a.ok != b.ok:
        return not a.ok
    return a.max_abs_error > b.max_abs_error
