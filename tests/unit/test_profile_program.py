"""Standalone CUDA programs (kernel_lsp/profile/program.py): the header, main() found, the confined run, and a
failed run's findings, with the real nvcc (this machine has no GPU: the program's own CUDA error is the failure)."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from kernel_lsp.findings import uri_to_path
from kernel_lsp.jobs.files import gather_files
from kernel_lsp.process.namespaces import bwrap_path, isolation_status
from kernel_lsp.profile.program import (
    ProgramHeader,
    build_program,
    confined_launch,
    has_main,
    main_line,
    program_header,
    run_program,
    runtime_findings,
)
from kernel_lsp.compile.process import ProcessResult
from tests.gpu.sanitizer_candidates import STANDALONE

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
needs_nvcc = pytest.mark.skipif(not Path(NVCC).is_file(), reason="nvcc is not installed")


def test_the_header_gives_build_flags_and_run_arguments():
    header = program_header("// kernel-lsp: build=-O3 -DN=4 run=1024 --check 'a b'\nint main() {}\n")
    assert header == ProgramHeader(("-O3", "-DN=4"), ("1024", "--check", "a b"), ())
    later = program_header("// kernel-lsp: run=1\n// kernel-lsp: run=2\n")
    assert later.run == ("2",) and later.build == ()
    broken = program_header("// kernel-lsp: build=-DX='unclosed\n")
    assert broken.build == () and "build= header does not parse" in broken.problems[0].message
    assert program_header("int main() {}\n" + "\n" * 30 + "// kernel-lsp: run=5\n").run == ()  # only the top


def test_main_is_found_in_code_not_in_comments():
    assert has_main(STANDALONE)
    assert main_line(STANDALONE) == STANDALONE.splitlines().index("int main(int argc, char** argv) {")
    assert not has_main("// int main() {}\n/* int main(int argc, char** argv) {\n} */\n__global__ void k() {}\n")
    assert not has_main("__global__ void main_kernel() {}\nint mainly(int x);\n")


def test_a_failed_run_is_a_finding_on_the_line_it_names_or_on_main():
    text = STANDALONE
    failed = ProcessResult((), 1, "", "prog.cu:17: CUDA error: an illegal memory access was encountered\n", False, 0.1)
    [finding] = runtime_findings(failed, "/w/prog.cu", text, "prog.cu")
    assert finding.code == "program-error" and finding.range.start.line == 16
    assert "illegal memory access" in finding.message and "exit code 1" in finding.message
    elsewhere = ProcessResult((), 1, "", "other.cu:17: CUDA error: boom\n", False, 0.1)
    assert runtime_findings(elsewhere, "/w/prog.cu", text, "prog.cu")[0].range.start.line == main_line(text)
    signal = ProcessResult((), -11, "partial output\n", "", False, 0.1)
    [crash] = runtime_findings(signal, "/w/prog.cu", text, "prog.cu")
    assert "died from signal 11" in crash.message and crash.range.start.line == main_line(text)
    hang = ProcessResult((), None, "", "", True, 5.0)
    assert "ran past" in runtime_findings(hang, "/w/prog.cu", text, "prog.cu", 5.0)[0].message
    assert runtime_findings(ProcessResult((), 0, "ok 4\n", "", False, 0.1), "/w/prog.cu", text, "prog.cu") == []


@needs_nvcc
def test_the_program_builds_and_its_confined_run_reports_its_cuda_error(tmp_path: Path):
    """Built with the real nvcc; run confined (kernel_lsp.process.confine execs it). Without a GPU its own
    cudaDeviceSynchronize check prints a CUDA error and exits 1: one program-error finding on main."""
    source = tmp_path / "task" / "prog.cu"
    source.parent.mkdir()
    source.write_text(STANDALONE)
    header = program_header(STANDALONE)
    built = asyncio.run(build_program(source, header, tmp_path / "program"))
    assert built.built, built.problems
    home = tmp_path / "home"
    home.mkdir()
    argv, environment = confined_launch([str(tmp_path / "program"), *header.run], home)
    confine = [sys.executable, "-P", "-m", "kernel_lsp.process.confine"]
    assert confine == argv[argv.index(sys.executable):][:4] and "ANTHROPIC_API_KEY" not in environment
    if isolation_status().startswith("isolated"):  # in the candidate's sandbox, confined inside it
        assert argv[0] == bwrap_path() and argv.index("--") < argv.index(sys.executable)
    result = asyncio.run(run_program(argv, source.parent, environment, timeout_s=60))
    if result.returncode == 0:
        pytest.skip("this machine has a GPU: the program ran (tests/gpu covers that)")
    [finding] = runtime_findings(result, str(source), STANDALONE, "prog.cu")
    assert "CUDA error" in finding.message and finding.range.start.line == main_line(STANDALONE)
    assert uri_to_path(finding.uri) == source


@needs_nvcc
def test_a_program_that_does_not_build_says_so(tmp_path: Path):
    source = tmp_path / "bad.cu"
    source.write_text("int main() { return undeclared; }\n")
    built = asyncio.run(build_program(source, ProgramHeader(), tmp_path / "program"))
    assert not built.built and "bad.cu did not build" in built.problems[0].message \
        and "undeclared" in built.problems[0].message and built.problems[0].code == "profile-build-failed"


def test_a_program_job_carries_its_quoted_headers(tmp_path: Path):
    (tmp_path / "util.cuh").write_text('#include "deeper.cuh"\n')
    (tmp_path / "deeper.cuh").write_text("#define X 1\n")
    program = tmp_path / "prog.cu"
    program.write_text('#include "util.cuh"\n#include <cstdio>\nint main() { return X - 1; }\n')
    files = gather_files(program, None)
    assert set(files.texts) == {"prog.cu", "util.cuh", "deeper.cuh"}
