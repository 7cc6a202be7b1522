"""The CuTe DSL compile check ("cute-dsl-check") through a real worker: the DSL compiles @cute.jit/@cute.kernel code
without a GPU, so each error lands on the user's line and each compiled kernel gets ptxas's figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kernel_lsp.findings import Severity
from kernel_lsp.kinds.cute_dsl import CuteDslOutcome, cute_dsl_job
from kernel_lsp.worker.client import WorkerClient

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(importlib.util.find_spec("nvidia_cutlass_dsl") is None,
                       reason="the CuTe DSL is not installed (pip install 'kernel-lsp[cute-dsl]')"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

ADD = '''import torch
import torch.nn as nn
import cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack


@cute.kernel
def add_kernel(gA: cute.Tensor, gB: cute.Tensor, gC: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    i = bidx * bdim + tidx
    if i < cute.size(gA):
        gC[i] = gA[i] + gB[i]


@cute.jit
def add(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
    n = cute.size(mA)
    add_kernel(mA, mB, mC).launch(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1))


class ModelNew(nn.Module):
    def forward(self, a, b):
        c = torch.empty_like(a)
        add(from_dlpack(a), from_dlpack(b), from_dlpack(c))
        return c
'''

REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(4096), torch.randn(4096)]


def get_init_inputs():
    return []
'''

KERNEL_LINE = ADD.splitlines().index("def add_kernel(gA: cute.Tensor, gB: cute.Tensor, gC: cute.Tensor):")
INDEX_LINE = ADD.splitlines().index("    i = bidx * bdim + tidx")
LAUNCH_LINE = ADD.splitlines().index("    add_kernel(mA, mB, mC).launch(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1))")
CALL_LINE = ADD.splitlines().index("        add(from_dlpack(a), from_dlpack(b), from_dlpack(c))")


def with_line_after_index(line: str) -> str:
    lines = ADD.splitlines()
    lines.insert(INDEX_LINE + 1, line)
    return "\n".join(lines) + "\n"


@pytest.fixture
async def client():
    worker = WorkerClient()
    yield worker
    await worker.close()


async def check(client: WorkerClient, tmp_path: Path, text: str) -> CuteDslOutcome:
    candidate, reference = tmp_path / "add_new.py", tmp_path / "add_ref.py"
    candidate.write_text(text)
    reference.write_text(REFERENCE)
    return CuteDslOutcome.of(await client.run(cute_dsl_job(candidate, reference), timeout_s=300))


async def test_a_correct_dsl_kernel_compiles_without_a_gpu_and_gets_ptxas_figures(client, tmp_path: Path):
    outcome = await check(client, tmp_path, ADD)
    assert outcome.status == "ok", outcome.summary
    assert outcome.compile_errors == []
    [kernel] = outcome.kernels
    assert kernel.kernel.startswith("kernel_cutlass_add_kernel_") and kernel.function == "add_kernel"
    assert kernel.resources.arch == "sm_90a" and kernel.resources.registers > 0
    [resources] = [f for f in outcome.findings if f.code == "ptxas-resources"]
    assert resources.range.start.line == KERNEL_LINE and resources.message.startswith("add_kernel: sm_90a: ")
    assert "registers" in resources.message and resources.uri.endswith("/add_new.py")


async def test_a_wrong_layout_rank_is_an_error_on_its_own_line(client, tmp_path: Path):
    outcome = await check(client, tmp_path, with_line_after_index(
        "    bad = cute.make_layout((4, 8), stride=(8, 1, 2))"))
    assert outcome.status == "compile-error"
    [error] = outcome.compile_errors
    assert error.code == "cute-dsl-error" and error.range.start.line == INDEX_LINE + 1
    assert "congruent" in error.message and len(error.message) < 300
    # the calls that led there, in the user's file: the launch in the @cute.jit function and the call in forward
    assert {r.range.start.line for r in error.related} >= {LAUNCH_LINE + 1, CALL_LINE + 1}


async def test_a_misspelt_dsl_function_in_a_kernel_body_is_a_compile_error_there(client, tmp_path: Path):
    outcome = await check(client, tmp_path, with_line_after_index("    w, _, _ = cute.arch.warp_idxx()"))
    [error] = outcome.compile_errors
    assert error.range.start.line == INDEX_LINE + 1 and "warp_idxx" in error.message


async def test_a_forward_that_needs_cuda_says_where_the_check_stopped(client, tmp_path: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("with a GPU, .cuda() works and the check reaches the kernels")
    text = ADD.replace("        c = torch.empty_like(a)", "        c = torch.empty_like(a).cuda()")
    outcome = await check(client, tmp_path, text)
    assert outcome.status == "stopped" and outcome.compile_errors == []
    [stopped] = [f for f in outcome.findings if f.code == "cute-dsl-not-reached"]
    assert stopped.severity == Severity.INFORMATION and stopped.range.start.line == CALL_LINE - 1
    assert "before any CuTe DSL kernel compiled" in stopped.message


async def test_a_file_whose_run_calls_no_dsl_function_is_said_to_be_unchecked(client, tmp_path: Path):
    text = ADD.replace("        add(from_dlpack(a), from_dlpack(b), from_dlpack(c))\n", "")
    outcome = await check(client, tmp_path, text)
    assert outcome.status == "ok" and outcome.kernels == []
    assert [f.code for f in outcome.findings] == ["cute-dsl-not-reached"]


async def test_the_files_code_runs_confined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Importing the file runs its code (a model's, in the agent): it runs in a confined process of its own, so it
    cannot rewrite the worker's trusted caches or the workspace, and still compiles its kernels."""
    from kernel_lsp.process.confine import landlock_abi

    if landlock_abi() < 1:
        pytest.skip("Landlock is not available in this kernel")
    worker_cache = tmp_path / "worker-cache"
    trusted = worker_cache / "baselines" / "abc.json"
    trusted.parent.mkdir(parents=True)
    trusted.write_text('{"timing": {"median_ms": 1.0}}')
    workspace_file = tmp_path / "add_ref.py"
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(worker_cache))
    attacks = ADD + f"""
for _path in ({str(trusted)!r}, {str(workspace_file)!r}):
    try:
        with open(_path, "a") as _file:
            _file.write("# the candidate was here")
    except OSError:
        pass
"""
    worker = WorkerClient()
    try:
        outcome = await check(worker, tmp_path, attacks)
    finally:
        await worker.close()
    assert trusted.read_text() == '{"timing": {"median_ms": 1.0}}'
    assert workspace_file.read_text() == REFERENCE
    assert outcome.status == "ok", outcome.summary
    assert len(outcome.kernels) == 1
    assert outcome.isolation.files.startswith("isolated"), outcome.isolation
