"""Issue 38 on a real GPU: the candidate's sandbox (bubblewrap namespaces) with CUDA inside it.

- Device memory crosses between two processes in different PID namespaces as the driver's file descriptors
  (candidate/device_share.py through candidate/exchange.py), both ways, and what one side writes the other sees.
- An honest CUDA candidate is verified with the sandbox on (its report says so), and the hostile candidate of
  tests/pipeline/hostile_candidate.py, run on the GPU, is refused everything it tries.

bubblewrap must be installed (or its binary named by KERNEL_LSP_BWRAP: the GPU machine has no package registry;
tests/gpu/on_device.sh unpacks a carried .deb, see tests/gpu/RESULTS.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.process.namespaces import SandboxPlan, isolation_status, prepare_writable, sandbox_command
from tests.gpu import candidates as c
from tests.gpu.test_verify_pipeline_gpu import verify
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
GPU_MEMORY_LIMIT = 16 << 30  # the sandbox's default host memory: CUDA's libraries take more than the CPU test's 2 GiB

# the other side: maps the judge's tensor, checks it, writes 5 into it, sends a tensor of its own back
OTHER_SIDE = r'''
import json, socket, sys
import torch
from kernel_lsp.candidate.exchange import Exchange
exchange = Exchange(sys.argv[2], "candidate", socket.socket(fileno=int(sys.argv[1])))
value = exchange.receive(json.loads(sys.stdin.readline()))
print("sum", value[0].sum().item(), value[1], file=sys.stderr, flush=True)
value[0].fill_(5.0)
torch.cuda.synchronize()
print(json.dumps(exchange.send([torch.full((1000,), 7.0, device="cuda")])), flush=True)
sys.stdin.readline()  # kept alive until the judge has read
'''


@pytest.fixture
def sandboxed() -> None:
    status = isolation_status()
    if not status.startswith("isolated"):
        pytest.fail(f"the candidate's sandbox cannot start on this GPU machine: {status}", pytrace=False)


def test_device_memory_crosses_pid_namespaces_both_ways(sandboxed, tmp_path: Path):
    import torch

    from kernel_lsp.candidate.exchange import Exchange

    prepare_writable([str(tmp_path)])
    judge_end, other_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    exchange = Exchange(tmp_path, "judge", judge_end)
    command = sandbox_command([sys.executable, "-c", OTHER_SIDE, str(other_end.fileno()), str(tmp_path)],
                              SandboxPlan(writable=(str(tmp_path),), readable=(str(REPO),)))
    other = subprocess.Popen(command, pass_fds=(other_end.fileno(),), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    other_end.close()
    try:
        described, view = exchange.share([torch.full((1 << 24,), 3.0, device="cuda"), 2.5])
        other.stdin.write(json.dumps(described) + "\n")
        other.stdin.flush()
        line = other.stdout.readline()
        assert line.startswith("{"), other.stderr.read()
        back = exchange.receive(json.loads(line))
        torch.cuda.synchronize()
        assert float(view[0][0].item()) == 5.0 and float(view[0].sum().item()) == 5.0 * (1 << 24)
        assert float(back[0].sum().item()) == 7000.0
    finally:
        other.stdin.close()
        other.wait(60)
    assert f"sum {3.0 * (1 << 24)} 2.5" in other.stderr.read()


async def test_honest_relu_is_verified_in_the_sandbox(sandboxed, tmp_path: Path):
    if not (c.KERNELBENCH / c.RELU_PROBLEM).is_file():
        pytest.skip(f"needs the KernelBench problems at {c.KERNELBENCH}")
    result = await verify(tmp_path, c.HONEST_RELU, c.RELU_PROBLEM, trials=3, timedCalls=20)
    report = result["report"]
    assert result["verdict"] == "verified", (result["summary"], result["findings"])
    assert report["isolation"]["namespaces"].startswith("isolated"), report["isolation"]
    assert report["free_memory_poison"] == "covered" and report["shared_memory_poison"] == "filled"


async def test_hostile_cuda_candidate_is_refused_everything(sandboxed, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch):
    from tests.pipeline.test_hostile_candidate import Listeners, attempts, check, plant, run_hostile

    cache_dir = tmp_path / "cache"
    targets, key = plant(tmp_path, cache_dir)
    targets["memory"] = 4 * GPU_MEMORY_LIMIT
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    listeners = Listeners(tmp_path, targets["marker"])
    targets.update(listener=listeners.path, abstract=listeners.abstract, port=listeners.port)
    try:
        report = await run_hostile(targets, str(cache_dir), device="cuda", memory=GPU_MEMORY_LIMIT)
        check(attempts(report), report, targets, key, listeners, 65534 if os.geteuid() == 0 else os.geteuid())
    finally:
        listeners.close()
