"""The profile job's measuring step keeps the candidate off what the worker trusts, as verification does.

`kernel_lsp.profile.measure:measure_candidate` runs in a real sandbox child on the CPU; the candidate runs only
in its own confined process. Candidates written to attack it: each rewrites a trusted cache, writes into the
workspace, opens a socket to a listener here, or looks for the user's secrets. Each must be stopped by the
boundary while the measurement itself still succeeds.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from kernel_lsp.process.confine import landlock_abi
from kernel_lsp.worker.sandbox import Sandbox, SandboxLimits, SandboxTask
from tests.pipeline.test_verify_cpu import (
    HONEST,
    LEAVES_A_JUDGE_BUILD,
    OPENS_SOCKET,
    RELU_PROBLEM,
    REWRITES_BUILD_CACHES,
    REWRITES_TRUSTED_CACHES,
    TRITON_RELU,
    WRITES_WORKSPACE,
)

pytestmark = pytest.mark.timeout(300)

SECRETS = {"ANTHROPIC_API_KEY": "sk-ant-test", "KERNEL_LSP_TOKEN": "t0ken", "AWS_SECRET_ACCESS_KEY": "aws"}

RAISES_ON_SECRETS = TRITON_RELU + '''
import os
SEEN = [name for name in ("ANTHROPIC_API_KEY", "KERNEL_LSP_TOKEN", "AWS_SECRET_ACCESS_KEY") if name in os.environ]
if SEEN:
    raise RuntimeError(f"the candidate sees {SEEN}")

class ModelNew(nn.Module):
    def forward(self, x):
        return triton_relu(x.contiguous())
'''


def needs_landlock() -> None:
    if landlock_abi() < 1:
        pytest.skip("Landlock is not available in this kernel")


@pytest.fixture
async def sandbox():
    sandbox = Sandbox(preload=("kernel_lsp.candidate.prestart", "torch"), env={**os.environ, **SECRETS})
    yield sandbox
    await sandbox.close()


async def measure(sandbox: Sandbox, cache: Path, candidate: str, reference: str = RELU_PROBLEM) -> dict:
    files = {"cand.py": candidate, "reference/problem.py": reference}
    task = SandboxTask(entry="kernel_lsp.profile.measure:measure_candidate", files=files,
                       origins={"cand.py": "/work/project/cand.py"},
                       args={"candidate": "cand.py", "reference": "reference/problem.py", "cache_dir": str(cache),
                             "device": "cpu"})
    outcome = await sandbox.run(task, SandboxLimits(wall_time_s=240))
    assert outcome.status == "ok", (outcome.message, outcome.stderr[-3000:])
    return outcome.value


def trusted_cache(folder: Path) -> dict[Path, bytes]:
    """A cache as the worker leaves it: baseline timings and measured peaks, as JSON files."""
    files = {folder / "baselines" / "abc.json": {"timing": {"median_ms": 1.0}},
             folder / "peaks" / "cpu-torch.json": {"device": "cpu", "bandwidth_gbs": 10.0},
             folder / "verdicts.json": {"timing": {"median_ms": 2.0}}}
    for path, value in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    return {path: path.read_bytes() for path in files}


async def test_honest_candidate_is_measured_in_a_confined_process(sandbox: Sandbox, tmp_path: Path):
    measured = await measure(sandbox, tmp_path / "cache", HONEST)
    assert measured["extensions"] == [] and measured["energy"] is None  # the CPU has no energy counter
    assert "no energy reading: the candidate ran on cpu" in " | ".join(p["message"] for p in measured["problems"])
    if landlock_abi() >= 1:
        assert measured["isolation"]["files"].startswith("isolated"), measured["isolation"]
    assert measured["isolation"]["network"].startswith("isolated"), measured["isolation"]


async def test_trusted_caches_cannot_be_rewritten_while_profiling(sandbox: Sandbox, tmp_path: Path):
    needs_landlock()
    cache = tmp_path / "cache"
    stored = trusted_cache(cache)
    await measure(sandbox, cache, REWRITES_TRUSTED_CACHES.replace("{cache}", str(cache)))
    assert {path: path.read_bytes() for path in stored} == stored


async def test_the_judges_build_caches_are_apart_from_the_candidates_while_profiling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The measuring step's process runs the reference: its build caches are not the candidate's."""
    needs_landlock()
    worker_cache = tmp_path / "worker-cache"
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(worker_cache))
    own = Sandbox(preload=("kernel_lsp.candidate.prestart", "torch"))
    try:
        await measure(own, tmp_path / "cache", HONEST, reference=LEAVES_A_JUDGE_BUILD)
        probes = list(worker_cache.rglob("judge-probe/kernel.json"))
        assert len(probes) == 1, sorted(map(str, worker_cache.rglob("*")))
        stored = probes[0].read_bytes()
        await measure(own, tmp_path / "cache", REWRITES_BUILD_CACHES.replace("{cache}", str(worker_cache)),
                      reference=LEAVES_A_JUDGE_BUILD)
    finally:
        await own.close()
    assert probes[0].read_bytes() == stored, f"the candidate rewrote {probes[0]}"
    assert (worker_cache / "builds" / "triton" / "candidate-build.json").exists()


async def test_workspace_files_cannot_be_written_while_profiling(sandbox: Sandbox, tmp_path: Path):
    needs_landlock()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "problem.py").write_text(RELU_PROBLEM)
    candidate = WRITES_WORKSPACE.replace("{workspace}", str(workspace))
    (workspace / "cand.py").write_text(candidate)
    await measure(sandbox, tmp_path / "cache", candidate)
    assert (workspace / "problem.py").read_text() == RELU_PROBLEM and (workspace / "cand.py").read_text() == candidate


async def test_no_connection_leaves_the_candidate_while_profiling(sandbox: Sandbox, tmp_path: Path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        await measure(sandbox, tmp_path / "cache", OPENS_SOCKET.replace("{port}", str(listener.getsockname()[1])))
        with pytest.raises(TimeoutError):
            listener.accept()


async def test_secrets_do_not_reach_the_candidate_while_profiling(sandbox: Sandbox, tmp_path: Path):
    measured = await measure(sandbox, tmp_path / "cache", RAISES_ON_SECRETS)  # it raises if it sees one
    assert measured["energy"] is None
