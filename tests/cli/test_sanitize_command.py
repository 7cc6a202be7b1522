"""`kernel-lsp sanitize` and `kernel-lsp profile PROGRAM.cu` through a real local worker on this machine (no GPU):
each says plainly what needs a GPU and exits 2; the program's profile falls back to its static one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.cli import main
from kernel_lsp.profile.sanitize import NO_GPU
from kernel_lsp.profile.worker_job import NO_GPU_PLAIN
from tests.gpu.sanitizer_candidates import OUT_OF_BOUNDS, STANDALONE

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").is_file(),
                                reason="needs nvcc")


def _cpu_only():
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/gpu/test_sanitize_gpu.py covers the real run")


@pytest.mark.slow
@pytest.mark.parametrize("name, text", [("cand.py", OUT_OF_BOUNDS), ("prog.cu", STANDALONE)])
def test_without_a_gpu_sanitize_exits_2_and_says_why(tmp_path: Path, capsys, name: str, text: str):
    _cpu_only()
    path = tmp_path / name
    path.write_text(text)
    status = main(["sanitize", str(path), "--format", "json", "--tool", "memcheck"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert status == 2, (out, err)
    assert NO_GPU in report["error"] and report["clean"] is False and report["findings"] == []
    assert "--worker tcp:HOST:PORT" in report["error"] and "setting" not in report["error"]  # a terminal's remedy
    assert "not proven clean" in err


@pytest.mark.slow
@needs_nvcc
def test_a_program_is_profiled_by_the_worker_statically_without_a_gpu(tmp_path: Path, capsys):
    _cpu_only()
    path = tmp_path / "prog.cu"
    path.write_text(STANDALONE)
    status = main(["profile", str(path), "--format", "json"])
    out, err = capsys.readouterr()
    assert status == 0, (out, err)
    report = json.loads(out)
    assert report["source"] == "static"
    assert {"code": NO_GPU_PLAIN.code, "message": NO_GPU_PLAIN.message} in report["problems"]
    assert [kernel["kernel"] for kernel in report["kernels"]] == ["scale"]


def test_sanitize_usage_errors_exit_2(tmp_path: Path, capsys):
    assert main(["sanitize", str(tmp_path / "missing.py")]) == 2
    assert "not a file" in capsys.readouterr().err
    other = tmp_path / "notes.txt"
    other.write_text("x")
    assert main(["sanitize", str(other)]) == 2
    assert "expected a .py candidate or a .cu program" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["sanitize", str(other), "--tool", "leakcheck"])
    assert exit_info.value.code == 2
