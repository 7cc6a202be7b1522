"""The program ncu runs: the candidate's ModelNew and the problem's inputs, built on the CPU here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kernel_lsp.profile.driver import (
    ProblemError,
    build_model,
    load_problem,
    main,
    make_inputs,
    run_forward,
)
from kernel_lsp.verify.reference import init_inputs
from tests.problems import linear_relu_problem

PROBLEM = linear_relu_problem("torch.rand(4, 8)", 8)

CANDIDATE = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return self.linear(x).clamp_min(0)
'''


@pytest.fixture(autouse=True)
def _forget_loaded_modules():
    yield
    for name in ("kernel_lsp_candidate", "kernel_lsp_reference"):
        sys.modules.pop(name, None)


def write(folder: Path, name: str, text: str) -> str:
    (folder / name).write_text(text)
    return str(folder / name)


def test_model_new_and_inputs_come_from_candidate_and_reference(tmp_path: Path):
    candidate_module, inputs_module = load_problem(write(tmp_path, "cand.py", CANDIDATE),
                                                   write(tmp_path, "ref.py", PROBLEM))
    model = build_model(candidate_module, init_inputs(inputs_module), "cpu")
    inputs = make_inputs(inputs_module, "cpu")
    assert not model.training and model.linear.in_features == 8
    assert inputs[0].shape == (4, 8) and inputs[0].device.type == "cpu"
    assert run_forward(model, inputs, 2).shape == (4, 8)
    same = make_inputs(inputs_module, "cpu")
    assert torch.equal(inputs[0], same[0])  # seeded: ncu and the energy loop see the same inputs


def test_a_file_with_model_and_model_new_needs_no_reference(tmp_path: Path):
    candidate_module, inputs_module = load_problem(write(tmp_path, "both.py", PROBLEM + CANDIDATE), None)
    assert inputs_module is candidate_module
    assert build_model(candidate_module, init_inputs(inputs_module), "cpu").linear.out_features == 8


@pytest.mark.parametrize("candidate, reference, message", [
    (CANDIDATE, None, r"defines no get_inputs\(\): pass the reference"),
    (PROBLEM, PROBLEM, "defines no ModelNew"),
])
def test_files_that_make_no_problem_say_what_is_missing(tmp_path: Path, candidate, reference, message):
    ref = write(tmp_path, "ref.py", reference) if reference else None
    with pytest.raises(ProblemError, match=message):
        load_problem(write(tmp_path, "cand.py", candidate), ref)


def test_main_runs_warmup_and_profiled_calls_on_the_cpu(tmp_path: Path, capsys):
    candidate, reference = write(tmp_path, "cand.py", CANDIDATE), write(tmp_path, "ref.py", PROBLEM)
    assert main(["--candidate", candidate, "--reference", reference, "--device", "cpu", "--calls", "2"]) == 0
    assert main(["--candidate", candidate, "--device", "cpu"]) == 2
    assert "defines no get_inputs()" in capsys.readouterr().err


@pytest.mark.slow
def test_the_sandbox_measurement_says_what_the_cpu_cannot_measure(tmp_path: Path):
    from kernel_lsp.profile.measure import measure_candidate

    measured = measure_candidate(write(tmp_path, "cand.py", CANDIDATE), write(tmp_path, "ref.py", PROBLEM),
                                 device="cpu")
    assert measured["extensions"] == [] and measured["reference_kernels"] == [] and measured["energy"] is None
    assert measured["reference_energy"] is None
    problems = " | ".join(p["message"] for p in measured["problems"])
    assert "no reference kernel list: CUDA is not available" in problems
    assert "no energy reading: the candidate ran on cpu" in problems and "no roofline ceilings" in problems
    assert {p["code"] for p in measured["problems"]} == {"profile-no-reference", "profile-no-energy",
                                                         "profile-no-ceilings"}
    assert "unavailable" in measured["gpu_state"]


@pytest.mark.slow
def test_without_a_reference_the_candidates_file_is_measured_in_its_own_process(tmp_path: Path):
    from kernel_lsp.profile.measure import measure_candidate

    measured = measure_candidate(write(tmp_path, "both.py", PROBLEM + CANDIDATE), device="cpu")
    problems = " | ".join(p["message"] for p in measured["problems"])
    assert "no reference kernel list: CUDA is not available" in problems  # said by the candidate's process
    assert set(measured["isolation"]) == {"files", "network", "processes", "namespaces"}  # as verification is
    assert "kernel_lsp_candidate" not in sys.modules  # never imported by the measuring process


@pytest.mark.slow
def test_a_candidate_that_fails_is_reported_as_its_own_failure(tmp_path: Path):
    from kernel_lsp.profile.measure import measure_candidate
    from kernel_lsp.candidate.handle import CandidateFailed

    with pytest.raises(CandidateFailed) as failed:
        measure_candidate(write(tmp_path, "cand.py", CANDIDATE + "\nraise RuntimeError('broken at import')\n"),
                          write(tmp_path, "ref.py", PROBLEM), device="cpu")
    assert "broken at import" in failed.value.sandbox_failure.message
    with pytest.raises(CandidateFailed, match="defines no ModelNew"):
        measure_candidate(write(tmp_path, "none.py", PROBLEM), write(tmp_path, "ref.py", PROBLEM), device="cpu")


def test_what_the_candidates_process_says_is_checked_for_shape(tmp_path: Path):
    from kernel_lsp.contracts.codec import encode
    from kernel_lsp.profile.measure import checked_energy, checked_kernels, checked_libraries

    reading = {"mj_per_call": 1.5, "calls": 10, "seconds": 1.0, "how": "NVML"}
    assert encode(checked_energy(reading)) == reading
    for forged in ("1.5", {"mj_per_call": "x", "calls": 1, "seconds": 1}, {"mj_per_call": float("nan"), "calls": 1,
                                                                           "seconds": 1}, {"calls": 1}, None):
        assert checked_energy(forged) is None
    kernel = {"name": "k", "device_ms": 0.5, "calls": 1}
    checked = checked_kernels([kernel, {"name": 3}, "k", {"name": "x", "device_ms": "1", "calls": 1}])
    assert [encode(k) for k in checked] == [kernel]
    assert checked_kernels({"name": "k"}) == []
    library = tmp_path / "ext.so"
    library.write_bytes(b"\x7fELF")
    assert checked_libraries([str(library), "/etc/passwd", str(tmp_path / "gone.so"), 7]) == [str(library)]
    assert checked_libraries("ext.so") == []


WRITES_OUTSIDE = CANDIDATE + '''
try:
    with open({target!r}, "w") as file:
        file.write("written by the candidate")
except OSError:
    pass
'''


@pytest.mark.slow
def test_the_driver_confines_itself_before_the_candidate_runs(tmp_path: Path):
    import subprocess

    from kernel_lsp.candidate.handle import candidate_launch
    from kernel_lsp.process.confine import landlock_abi

    if landlock_abi() < 1:
        pytest.skip("Landlock is not available in this kernel")
    home = tmp_path / "home"
    home.mkdir()
    environment, writable = candidate_launch(home)
    reference = write(tmp_path, "ref.py", PROBLEM)
    for confined in (False, True):
        target = tmp_path / f"outside-{confined}.txt"
        candidate = write(tmp_path, f"cand_{confined}.py", WRITES_OUTSIDE.format(target=str(target)))
        command = [sys.executable, "-P", "-m", "kernel_lsp.profile.driver", "--candidate", candidate,
                   "--reference", reference, "--device", "cpu", *(f"--writable={w}" for w in writable if confined)]
        done = subprocess.run(command, env=environment, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert target.exists() is not confined, (confined, done.stderr[-2000:])


def test_only_the_candidates_own_libraries_count_as_its_extensions():
    from kernel_lsp.profile.measure import own_libraries

    paths = {f"{sys.prefix}/lib/python3.11/lib-dynload/_bz2.so", "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
             "/home/u/.venv/lib/python3.11/site-packages/torch/lib/libtorch.so",
             "/home/u/.triton/cache/abc/cuda_utils.so", "/home/u/.cache/torch_extensions/py311_cu130/ext/ext.so"}
    assert own_libraries(paths) == {"/home/u/.cache/torch_extensions/py311_cu130/ext/ext.so"}
