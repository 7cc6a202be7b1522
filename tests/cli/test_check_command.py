"""`kernel-lsp check` and `--version` as a user runs them: a subprocess, its output and exit status."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import sys
from pathlib import Path

import pytest

from kernel_lsp import __version__

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)")
BAD = "__global__ void f(int* p){ int x = ; p[0] = y; }\n"
GOOD = "__global__ void g(float* p) { p[threadIdx.x] *= 2.0f; }\n"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_lsp", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_version(tmp_path: Path):
    result = run("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == f"kernel-lsp {__version__}"


@needs_nvcc
def test_errors_give_compiler_style_lines_and_exit_1(tmp_path: Path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bad.cu").write_text(BAD)
    (tmp_path / "src" / "good.cu").write_text(GOOD)
    result = run("check", "src", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    col_semicolon, col_y = BAD.index("= ;") + 3, BAD.index("= y") + 3
    assert f"src/bad.cu:1:{col_semicolon}: error: expected an expression [nvcc-error]" in lines
    assert f'src/bad.cu:1:{col_y}: error: identifier "y" is undefined [nvcc-error]' in lines
    assert any(line.startswith("src/good.cu:1:17: info: g: sm_90: ") and line.endswith("[ptxas-resources]")
               for line in lines), lines
    assert len(lines) == 3


@needs_nvcc
def test_clean_files_exit_0_and_json_format(tmp_path: Path):
    (tmp_path / "good.cu").write_text(GOOD)
    result = run("check", "good.cu", "--format", "json", "--arch", "sm_80", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (finding,) = json.loads(result.stdout)
    assert (finding["path"], finding["line"], finding["column"], finding["code"], finding["severity"]) == \
        ("good.cu", 1, 17, "ptxas-resources", "info")
    assert finding["data"]["resources"][0]["arch"] == "sm_80"


def test_usage_errors_exit_2(tmp_path: Path):
    assert run("check", "does-not-exist.cu", cwd=tmp_path).returncode == 2
    assert run("check", cwd=tmp_path).returncode == 2
    assert run("frobnicate", cwd=tmp_path).returncode == 2


def test_missing_nvcc_is_an_environment_error(tmp_path: Path):
    (tmp_path / "good.cu").write_text(GOOD)
    result = run("check", "good.cu", "--nvcc", str(tmp_path / "no-nvcc"), cwd=tmp_path)
    assert result.returncode == 2
    assert "CUDA compiler not found" in result.stdout
    assert "[nvcc-missing]" in result.stdout


def test_python_files_are_checked_without_nvcc(tmp_path: Path):
    (tmp_path / "m.py").write_text("def forward(x:\n    return x\n")
    result = run("check", "m.py", "--nvcc", str(tmp_path / "no-nvcc"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.startswith("m.py:1:")
    assert "[python-syntax]" in result.stdout


def test_pyproject_settings_are_read(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[tool.kernel-lsp]\nignore = ["python-syntax"]\n')
    (tmp_path / "m.py").write_text("def forward(x:\n")
    result = run("check", "m.py", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "")


def test_invalid_utf8_and_binary_files_are_read_not_fatal(tmp_path: Path):
    (tmp_path / "latin1.py").write_bytes(b"# caf\xe9\ndef f(:\n")
    (tmp_path / "blob.py").write_bytes(bytes(range(256)))
    result = run("check", ".", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert any(line.startswith("latin1.py:2:") and line.endswith("[python-syntax]") for line in lines), lines
    assert any(line.startswith("blob.py:") and line.endswith("[python-syntax]") for line in lines), lines


@needs_nvcc
def test_prototypes_and_explicit_instantiations_are_not_extra_kernels(tmp_path: Path):
    (tmp_path / "t.cu").write_text(
        "template <int N> __global__ void fill(float* p);\n"
        "template <int N> __global__ void fill(float* p) { p[threadIdx.x] = N; }\n"
        "template __global__ void fill<4>(float*);\n")
    result = run("check", "t.cu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line.split(": ")[0] for line in result.stdout.splitlines()] == ["t.cu:2:34"]


def summary_workspace(root: Path) -> None:
    """src/bad.cu (errors), src/good.cu including src/h.cuh, and an ignored build/ copy of bad.cu."""
    (root / "src").mkdir()
    (root / "src" / "bad.cu").write_text(BAD)
    (root / "src" / "h.cuh").write_text("#pragma once\n#define K 2.0f\n")
    (root / "src" / "good.cu").write_text('#include "h.cuh"\n' + GOOD.replace("2.0f", "K"))
    (root / "build").mkdir()
    (root / "build" / "bad.cu").write_text(BAD)
    (root / ".gitignore").write_text("build/\n")


@needs_nvcc
def test_summary_lists_each_file_honours_gitignore_and_checks_headers_through_includers(tmp_path: Path):
    summary_workspace(tmp_path)
    result = run("check", ".", "--summary", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert not any("build/" in line or "h.cuh" in line for line in lines), lines
    table = lines[lines.index("") + 1:]
    assert table[0].split() == ["FILE", "STATE", "ERRORS", "WARNINGS", "KERNELS", "RESOURCES"]
    assert table[1].split()[:5] == ["src/bad.cu", "errors", "2", "0", "f"]
    assert table[2].split()[:6] == ["src/good.cu", "compiles", "0", "0", "g", "g:"]
    assert "registers" in table[2]
    assert table[3].startswith("2 files: 1 compile cleanly, 0 with warnings, 1 with errors; 0 from the cache")

    as_json = json.loads(run("check", ".", "--summary", "--format", "json", cwd=tmp_path).stdout)
    assert [(f["path"], f["state"], f["kernels"], f["cached"]) for f in as_json["files"]] == \
        [("src/bad.cu", "errors", ["f"], True), ("src/good.cu", "compiles", ["g"], True)]
    assert [f["code"] for f in as_json["findings"]] == ["nvcc-error", "nvcc-error", "ptxas-resources"]


@needs_nvcc
def test_a_second_run_answers_from_the_disk_cache_without_nvcc_until_a_header_changes(tmp_path: Path):
    from tests.nvcc_log import compiles, nvcc_wrapper

    workspace, tools = tmp_path / "ws", tmp_path / "tools"
    workspace.mkdir(), tools.mkdir()
    summary_workspace(workspace)
    nvcc, log = nvcc_wrapper(tools)

    def check(*more: str) -> tuple[subprocess.CompletedProcess, int]:
        before = len(compiles(log))
        done = run("check", ".", "--summary", "--nvcc", str(nvcc), *more, cwd=workspace)
        return done, len(compiles(log)) - before

    first, compiled = check()
    assert compiled >= 2, first.stderr
    again, compiled = check()
    assert compiled == 0 and again.stdout == first.stdout.replace("0 from the cache", "2 from the cache")
    _, compiled = check("--no-cache")
    assert compiled >= 2
    time.sleep(0.01)
    (workspace / "src" / "h.cuh").write_text("#pragma once\n#define K undefined_k\n")  # good.cu's only change
    changed, compiled = check()
    assert compiled >= 1 and "1 from the cache" in changed.stdout
    assert any(line.startswith("src/good.cu:") and "undefined_k" in line for line in changed.stdout.splitlines())


TYPE_ERRORS = """\
__device__ int add(int a, int b) { return a + b; }

__global__ void k(float* x, int n) {
    int* p = x;
    int y = undeclared_thing + 1;
    int z = add(1);
    x[0] = *p + y + z;
    x[1] = x + 2.0f;
}
"""


@needs_nvcc
def test_type_errors_cover_the_offending_token_or_call(tmp_path: Path):
    """nvcc's errors point at one character; the finding covers the token there, or the call its `)` closes."""
    (tmp_path / "types.cu").write_text(TYPE_ERRORS)
    result = run("check", "types.cu", "--format", "json", "--no-cache", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = TYPE_ERRORS.splitlines()
    covered = {}
    for finding in json.loads(result.stdout):
        assert finding["line"] == finding["endLine"] and finding["code"] == "nvcc-error", finding
        covered[finding["message"]] = lines[finding["line"] - 1][finding["column"] - 1:finding["endColumn"] - 1]
    assert covered == {
        'a value of type "float *" cannot be used to initialize an entity of type "int *"': "x",
        'identifier "undeclared_thing" is undefined': "undeclared_thing",
        "too few arguments in function call": "add(1)",
        "expression must have integral or unscoped enum type": "2.0f",
    }, covered

