"""`kernel-lsp profile`: --import-csv of the H200 fixture, the static profile of a .cu file, usage errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.cli import main

from tests.paths import FIXTURES
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"needs the recorded fixtures at {FIXTURES}")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

KNOWN_PROBLEMS = {  # kernel -> (what its findings must show, in a code or a message)
    "vec_add": ("hint-memory-bound",),
    "transpose_read_uncoalesced": ("ncu-UncoalescedGlobalAccess",),
    "smem_conflict": ("ncu-SharedMemoryConflicts",),
    "divergent": ("ncu-ThreadDivergence",),
    "spills": ("local loads", "local stores"),
    "tiny_grid": ("hint-small-grid",),
    "matmul_naive": ("hint-memory-bound", "ncu-MemoryCacheAccessPattern"),
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["profile", *argv])
    out, err = capsys.readouterr()
    return status, out, err


@needs_fixtures
def test_import_csv_json_gives_each_kernel_its_known_problem(capsys):
    status, out, _ = run(capsys, "--import-csv", str(FIXTURES / "ncu_details.csv"), "--format", "json")
    assert status == 0
    kernels = {kernel["kernel"]: kernel for kernel in json.loads(out)}
    assert list(kernels) == list(KNOWN_PROBLEMS)
    for name, shows in KNOWN_PROBLEMS.items():
        text = json.dumps(kernels[name]["findings"])
        assert all(part in text for part in shows), (name, shows)
        finding = kernels[name]["findings"][0]
        assert set(finding) >= {"code", "severity", "message", "estimated_speedup"}
    assert kernels["vec_add"]["bound"] == "memory" and kernels["divergent"]["bound"] == "compute"
    assert kernels["vec_add"]["metrics"]["Launch Statistics"]["Registers Per Thread"]["value"] == 16


@needs_fixtures
def test_import_csv_text_is_one_readable_block_per_kernel(capsys):
    status, out, _ = run(capsys, "--import-csv", str(FIXTURES / "ncu_details.csv"))
    assert status == 0
    assert out.count("registers, occupancy") == 7
    assert "tiny_grid latency bound" in out
    assert "hint-small-grid (estimated gain 97%): 4 blocks on 132 SMs" in out
    assert "ncu-UncoalescedGlobalAccess (estimated gain 77% global)" in out
    assert max(len(line) for line in out.splitlines()) < 400


@needs_fixtures
def test_the_raw_page_adds_local_memory_counters_and_kernel_filter(capsys):
    status, out, _ = run(capsys, "--import-csv", str(FIXTURES / "ncu_details.csv"), "--raw-csv",
                         str(FIXTURES / "ncu_raw.csv"), "--kernel", "spills", "--format", "json")
    (spills,) = json.loads(out)
    assert status == 0 and "hint-local-memory" in {f["code"] for f in spills["findings"]}


@needs_fixtures
@needs_nvcc
def test_a_cu_file_gets_its_static_profile_without_a_worker(capsys):
    status, out, _ = run(capsys, str(FIXTURES / "kernels.cu"), "--format", "json")
    report = json.loads(out)
    assert status == 0 and report["source"] == "static"
    kernels = {kernel["kernel"]: kernel for kernel in report["kernels"]}
    assert "hint-no-tensor-cores" in {f["code"] for f in kernels["matmul_naive"]["findings"]}
    assert "hint-local-memory" in {f["code"] for f in kernels["spills"]["findings"]}
    status, out, _ = run(capsys, str(FIXTURES / "kernels.cu"), "--kernel", "matmul_naive")
    assert status == 0 and out.startswith(f"{FIXTURES / 'kernels.cu'}: 1 kernel (static): matmul_naive")
    assert "hint-no-tensor-cores: line 53: Matmul-like" in out


@needs_nvcc
def test_a_cu_file_that_does_not_compile_exits_2_with_the_problem(tmp_path: Path, capsys):
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k() { int x = ; }\n")
    status, out, _ = run(capsys, str(bad))
    assert status == 2 and "problem: nvcc could not compile bad.cu" in out


@pytest.mark.parametrize("argv, message", [
    ([], "give either FILE or --import-csv CSV"),
    (["a.py", "--import-csv", "b.csv"], "give either FILE or --import-csv CSV"),
    (["missing.py"], "not a file: missing.py"),
    (["--import-csv", "missing.csv"], "--import-csv: cannot read missing.csv"),
])
def test_usage_errors_exit_2(capsys, tmp_path: Path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    status, _, err = run(capsys, *argv)
    assert status == 2 and message in err


def test_a_csv_without_launches_and_an_unknown_suffix_are_usage_errors(tmp_path: Path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("not ncu output\n")
    status, _, err = run(capsys, "--import-csv", str(notes))
    assert status == 2 and "no kernel launches found" in err
    status, _, err = run(capsys, str(notes))
    assert status == 2 and "expected a .py candidate or a .cu file" in err


def test_an_unreachable_worker_is_an_environment_error(tmp_path: Path, capsys):
    candidate = tmp_path / "cand.py"
    candidate.write_text("class ModelNew:\n    pass\n")
    status, _, err = run(capsys, str(candidate), "--worker", f"unix:{tmp_path / 'no-worker.sock'}")
    assert status == 2 and "kernel-lsp profile:" in err
