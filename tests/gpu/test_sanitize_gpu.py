"""The "sanitize" job on a real GPU through a real worker (issue 22): each buggy candidate of
tests/gpu/sanitizer_candidates.py found by its tool on the line marked BUG, the clean one clean under all five
checks, PyTorch's own error kept apart; the uninitialised shared-memory read (which compute-sanitizer 2025.3 does
not check: initcheck covers global memory only, tests/fixtures/sanitizer/README.md) found by kernel-lsp's
shared-init on the kernel's `__shared__` declaration; a standalone program sanitized, run and profiled live; and the
CLI's exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernel_lsp.cli import main
from kernel_lsp.findings import uri_to_path
from kernel_lsp.kinds.profile import profile_job
from kernel_lsp.kinds.sanitize import SanitizeOutcome, sanitize_job
from kernel_lsp.profile.sanitize import CHECKS, SHARED_INIT
from kernel_lsp.worker.client import WorkerClient
from tests.gpu import sanitizer_candidates as cands
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.skipif(shutil.which("compute-sanitizer") is None
                                 and not Path("/usr/local/cuda/bin/compute-sanitizer").exists(),
                                 reason="needs compute-sanitizer (the CUDA toolkit's)"),
              pytest.mark.timeout(900)]

EXPECTED = {  # candidate -> (the tool that finds its bug, the finding's code)
    "oob": ("memcheck", "sanitizer-memcheck"),
    "race": ("racecheck", "sanitizer-racecheck"),
    "uninit_global": ("initcheck", "sanitizer-initcheck"),
    "sync": ("synccheck", "sanitizer-synccheck"),
}


async def _sanitize(path: Path, tools: tuple[str, ...]) -> SanitizeOutcome:
    client = WorkerClient(job_timeout_s=900)
    try:
        return SanitizeOutcome.of(await client.run(sanitize_job(path, None, {"tools": list(tools)})))
    finally:
        await client.close()


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_each_bug_is_found_on_its_line(tmp_path: Path, name: str):
    text = cands.CANDIDATES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    tool, code = EXPECTED[name]
    outcome = await _sanitize(path, (tool,))
    assert outcome.error is None, outcome.error
    lines = {(f.code, f.range.start.line) for f in outcome.user_errors if uri_to_path(f.uri) == path}
    assert (code, cands.bug_line(text) - 1) in lines, (outcome.summary, [f.message for f in outcome.findings])
    assert outcome.summary.startswith("errors found"), outcome.summary


async def test_the_clean_candidate_is_clean_under_every_tool(tmp_path: Path):
    path = tmp_path / "clean.py"
    path.write_text(cands.CLEAN)
    outcome = await _sanitize(path, CHECKS)
    assert outcome.error is None and outcome.clean, (outcome.summary, [f.message for f in outcome.findings])
    assert not outcome.user_errors and outcome.summary.startswith("clean")
    assert [run.tool for run in outcome.report.tools] == list(CHECKS)


async def test_an_uninitialised_shared_read_is_found_by_shared_init(tmp_path: Path):
    text = cands.UNINIT_SHARED  # half of each block's tile is never written; the kernel reads all of it
    path = tmp_path / "uninit_shared.py"
    path.write_text(text)
    outcome = await _sanitize(path, ("initcheck", SHARED_INIT))
    assert outcome.error is None, outcome.error
    [finding] = outcome.user_errors
    declaration = next(i for i, line in enumerate(text.splitlines()) if "__shared__" in line)
    assert (finding.code, finding.range.start.line) == ("sanitizer-shared-init", declaration), finding.message
    assert [r.range.start.line for r in finding.related] == [cands.bug_line(text) - 1]  # the read, as related
    answer = finding.data["answer"]
    assert answer["unstable"] == 0 and answer["dependent"] * 2 == answer["elements"], answer  # the unwritten half
    assert outcome.summary == "errors found: initcheck 0 · shared-init 1", outcome.summary


async def test_pytorchs_own_error_is_kept_apart(tmp_path: Path):
    path = tmp_path / "library.py"
    path.write_text(cands.LIBRARY_UNINIT)
    outcome = await _sanitize(path, ("initcheck",))
    assert outcome.error is None
    assert not outcome.user_errors, [f.message for f in outcome.user_errors]
    [library] = [f for f in outcome.findings if f.code == "sanitizer-library"]
    assert library.severity == 3 and outcome.report.library


async def test_a_standalone_program_is_sanitized_and_profiled_live(tmp_path: Path):
    path = tmp_path / "prog.cu"
    path.write_text(cands.STANDALONE)
    outcome = await _sanitize(path, ("memcheck",))
    assert outcome.error is None, outcome.error
    lines = {(f.code, f.range.start.line) for f in outcome.user_errors}
    assert ("sanitizer-memcheck", cands.bug_line(cands.STANDALONE) - 1) in lines, outcome.summary
    client = WorkerClient(job_timeout_s=900)
    try:
        result = await client.run(profile_job(path, None, {"launchCount": 1}))
    finally:
        await client.close()
    assert result.status == "ok", result.error
    report = result.metrics["profile"]
    assert report["source"] == "ncu", report["problems"]
    assert [kernel["kernel"] for kernel in report["kernels"]] == ["scale"]
    assert report["kernels"][0]["duration_ms"] > 0


def test_the_cli_exit_codes(tmp_path: Path, capsys):
    bad, good = tmp_path / "oob.py", tmp_path / "clean.py"
    bad.write_text(cands.OUT_OF_BOUNDS)
    good.write_text(cands.CLEAN)
    assert main(["sanitize", str(bad), "--tool", "memcheck"]) == 1
    out = capsys.readouterr().out
    assert f"oob.py:{cands.bug_line(cands.OUT_OF_BOUNDS)}:" in out and "[sanitizer-memcheck]" in out
    assert main(["sanitize", str(good), "--tool", "memcheck", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["clean"] is True
