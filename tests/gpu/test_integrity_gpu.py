"""Issue 17 on a real GPU: CUDA load_inline candidates that game the verdict (less work when timed, stale answers
from a cache, decoy kernels), each rejected with its code, verified through a real worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu import candidates as c
from tests.problems import caches_by_identity, relu_problem
from tests.gpu.test_verify_pipeline_gpu import codes, verify
from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.skipif(not (c.KERNELBENCH / c.RELU_PROBLEM).is_file(),
                                 reason=f"needs the KernelBench problems at {c.KERNELBENCH}"),
              pytest.mark.timeout(900)]

SLACKS_WHEN_NOT_PROFILED = c.PRELUDE + '''
from torch.autograd import profiler

class ModelNew(nn.Module):
    calls = 0

    def forward(self, x):
        ModelNew.calls += 1
        if ModelNew.calls > 12 and not profiler._is_profiler_enabled:  # past the checks, and not recorded
            return torch.empty_like(x)
        return ops.relu(x.contiguous())
'''

SLACKS_ON_REPEATED_OBJECTS = c.PRELUDE + '''
class ModelNew(nn.Module):
    seen = []

    def forward(self, x):
        ModelNew.seen.append(x)
        if sum(t is x for t in ModelNew.seen) > 2:  # the timing loop's input sets come back again and again
            return torch.zeros_like(x)
        return ops.relu(x.contiguous())
'''

CACHES_BY_DATA_POINTER = c.PRELUDE + '''
class ModelNew(nn.Module):
    cache = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in ModelNew.cache:
            ModelNew.cache[key] = ops.relu(x.contiguous())
        return ModelNew.cache[key]
'''

CACHES_BY_IDENTITY = c.PRELUDE + caches_by_identity("ops.relu")

DECOY_ON_SCRATCH = c.relu_candidate("(ops.relu(x.contiguous()), x.clamp(min=0))[1]")
DECOY_OVERWRITTEN = c.relu_candidate("ops.relu(x.contiguous()).copy_(torch.relu(x))")


# KernelBench's ReLU takes 6.4 GB per input: a candidate that keeps its inputs or a cache of its answers runs the
# GPU out of memory within a few calls (rejected, but as run-out-of-memory), so those are verified against a
# smaller ReLU
SMALL_RELU = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(512, 16384)]


def get_init_inputs():
    return []
"""


def problem_for(candidate: str, folder: Path) -> str | Path:
    if candidate not in (CACHES_BY_DATA_POINTER, CACHES_BY_IDENTITY, SLACKS_ON_REPEATED_OBJECTS):
        return c.RELU_PROBLEM
    (folder / "small_relu.py").write_text(SMALL_RELU)
    return folder / "small_relu.py"


@pytest.mark.parametrize(("candidate", "code"), [
    (SLACKS_WHEN_NOT_PROFILED, "integrity-timed-output"),
    (SLACKS_ON_REPEATED_OBJECTS, "integrity-timed-output"),
    (CACHES_BY_DATA_POINTER, "integrity-stale-output"),
    (CACHES_BY_IDENTITY, "integrity-stale-output"),
    (DECOY_ON_SCRATCH, "integrity-output-not-from-kernel"),
    (DECOY_OVERWRITTEN, "integrity-output-not-from-kernel"),
], ids=["slacks-when-not-profiled", "slacks-on-repeated-objects", "caches-by-data-pointer", "caches-by-identity",
        "decoy-on-scratch", "decoy-overwritten"])
async def test_a_candidate_gaming_the_verdict_is_rejected_with_its_code(tmp_path: Path, candidate: str, code: str):
    result = await verify(tmp_path, candidate, problem_for(candidate, tmp_path), trials=3, timedCalls=20)
    assert result["verdict"] == "rejected", result["summary"]
    assert code in codes(result), (result["summary"], result["findings"])


async def test_the_honest_relu_passes_the_new_checks(tmp_path: Path):
    result = await verify(tmp_path, c.HONEST_RELU, c.RELU_PROBLEM, trials=3, timedCalls=20)
    assert result["verdict"] == "verified", (result["summary"], result["findings"])
    assert result["report"]["kernels"]["output_from_kernel"] is True


# issue 39's classes with CUDA load_inline candidates: a cache keyed by a sample of the values, results that reach
# the output only where NaN shows through, a batch that does half its calls, and its own summary rewritten
CACHES_BY_SAMPLED_VALUES = c.PRELUDE + '''
class ModelNew(nn.Module):
    cache = {}

    def forward(self, x):
        flat = x.reshape(-1)
        places = torch.linspace(0, flat.numel() - 1, 64, device=x.device).long()
        key = (tuple(x.shape), tuple(flat[places].tolist()))
        if key not in ModelNew.cache:
            ModelNew.cache[key] = ops.relu(x.contiguous())
        return ModelNew.cache[key].clone()
'''
DECOY_TIMES_ZERO = c.relu_candidate("x.clamp(min=0) + 0 * ops.relu(x.contiguous())")
DECOY_CLAMP_BOUND = c.relu_candidate("x.clamp(min=ops.relu(x.contiguous()) * 0)")
HALF_THE_BATCH = c.HONEST_RELU + '''
import sys
import kernel_lsp.verify.host as host
def _half(self, request):
    sets = request["sets"]
    done = [self.timing_call(*self.timing_sets[i]) for i in sets[: max(1, len(sets) // 2)]]
    self.settle_device()
    self.batch_outputs = done + [done[0]] * (len(sets) - len(done))
    return {}
for module in (host, sys.modules["__main__"]):
    if hasattr(module, "Host"):
        module.Host.op_batch = _half
'''
@pytest.mark.parametrize(("candidate", "code", "small"), [
    (CACHES_BY_SAMPLED_VALUES, "integrity-stale-output", True),
    (DECOY_TIMES_ZERO, "integrity-output-not-from-kernel", False),
    (DECOY_CLAMP_BOUND, "integrity-output-not-from-kernel", False),
    (HALF_THE_BATCH, "integrity-timed-output", True),
], ids=["caches-by-sampled-values", "decoy-times-zero", "decoy-clamp-bound", "half-the-batch"])
async def test_issue_39s_cheats_are_rejected_with_their_codes(tmp_path: Path, candidate: str, code: str, small: bool):
    problem: str | Path = c.RELU_PROBLEM
    if small:  # a launch-bound size: the judge's batches hold many calls, and a cache holds many answers cheaply
        (tmp_path / "small.py").write_text(relu_problem("torch.randn(64, 1024)"))
        problem = tmp_path / "small.py"
    result = await verify(tmp_path, candidate, problem, trials=4, timedCalls=40)
    assert result["verdict"] == "rejected", result["summary"]
    assert code in codes(result), (result["summary"], result["findings"])
