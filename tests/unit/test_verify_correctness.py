"""Correctness trials on the CPU: honest candidates pass (with weights), wrong and cheating ones do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_lsp.verify.correctness import run_trials
from kernel_lsp.worker.sandbox import Sandbox, SandboxLimits, SandboxTask

REFERENCE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x))

def get_inputs():
    return [torch.randn(8, 16)]

def get_init_inputs():
    return [16]
'''

HONEST = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return F.linear(x, self.linear.weight, self.linear.bias).clamp(min=0)
'''

OFF_BY_A_LITTLE = HONEST.replace(".clamp(min=0)", ".clamp(min=0) + 1e-3")

MUTATES_INPUT = HONEST.replace("return F.linear(x, self.linear.weight, self.linear.bias).clamp(min=0)",
                               "y = F.linear(x, self.linear.weight, self.linear.bias).clamp(min=0)\n"
                               "        x.zero_()\n        return y")


def files(tmp_path: Path, candidate: str) -> tuple[str, str]:
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "cand.py").write_text(candidate)
    return str(tmp_path / "ref.py"), str(tmp_path / "cand.py")


def test_honest_candidate_with_weights_passes_every_trial(tmp_path: Path):
    report = run_trials(*files(tmp_path, HONEST), trials=5)
    assert (report["ok"], report["passed"], report["trials"]) == (True, 5, 5)
    assert report["weights"] == "state_dict: 2 of 2 tensors loaded"
    assert report["integrity"] == [] and report["worst"]["max_abs_error"] < 1e-5


def test_wrong_candidate_fails_with_the_numbers(tmp_path: Path):
    report = run_trials(*files(tmp_path, OFF_BY_A_LITTLE), trials=3)
    assert (report["ok"], report["passed"]) == (False, 0)
    worst = report["worst"]
    assert worst["reason"] == "mismatch" and worst["max_abs_error"] == pytest.approx(1e-3, rel=1e-2)
    assert worst["worst_index"] is not None and "mismatch" in worst["message"]


def test_candidate_that_changes_its_input_is_rejected(tmp_path: Path):
    report = run_trials(*files(tmp_path, MUTATES_INPUT), trials=2)
    assert report["passed"] == 2  # its values are right...
    assert report["ok"] is False  # ...but it wrote over the caller's input
    assert [p["code"] for p in report["integrity"]] == ["integrity-input-mutated"]


def test_each_trial_draws_fresh_inputs(tmp_path: Path):
    constant = HONEST.replace("return F.linear(x, self.linear.weight, self.linear.bias).clamp(min=0)",
                              "global remembered\n        if 'remembered' not in globals():\n"
                              "            remembered = F.linear(x, self.linear.weight, self.linear.bias).clamp(min=0)\n"
                              "        return remembered.clone()")
    report = run_trials(*files(tmp_path, constant), trials=3)
    assert report["passed"] == 1  # only the first trial's inputs match what it remembered


async def test_trials_run_in_the_sandbox(tmp_path: Path):
    reference, candidate = files(tmp_path, HONEST)
    sandbox = Sandbox()
    try:
        outcome = await sandbox.run(SandboxTask(entry="kernel_lsp.verify.correctness:run_trials",
                                                args={"reference_file": reference, "candidate_file": candidate},
                                                files={}), SandboxLimits(wall_time_s=120))
    finally:
        await sandbox.close()
    assert outcome.status == "ok", outcome.message
    assert (outcome.value["ok"], outcome.value["passed"]) == (True, 5)
