"""The baselines run in a process of the candidate's kind (candidate/handle.py BaselineProcess), timed by the judge's
clock through the same requests as the candidate's batches (issue 39's "baselines by the same protocol"), on the CPU
in a real sandbox: eager's figures carry that process's round trip and the candidate's rounds; a baselines' process
that dies costs the baselines, said in the report, never the candidate's verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_lsp.worker.sandbox import Sandbox
from tests.pipeline.test_verify_cpu import HONEST, RELU_PROBLEM, verify

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("sandbox_available")]

# the reference's Model ends the process it runs in when that is the baselines' (its HOME is that process's scratch
# folder, kernel-lsp-baselines-...): the judge's runs of it, in the sandbox child, are unaffected
DIES_AS_BASELINE = RELU_PROBLEM.replace("""    def forward(self, x):
        return torch.relu(x)""", """    def forward(self, x):
        import os
        if "kernel-lsp-baselines-" in os.environ.get("HOME", ""):
            os._exit(3)
        return torch.relu(x)""")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("verify-cache")


@pytest.fixture
async def sandbox():
    sandbox = Sandbox(preload=("torch",))
    yield sandbox
    await sandbox.close()


async def test_eager_is_timed_in_a_process_of_its_own_by_the_candidates_protocol(sandbox: Sandbox, cache_dir: Path):
    report = await verify(sandbox, cache_dir, HONEST, trials=2)
    assert report["verdict"] == "verified", report["integrity"]
    candidate, eager = report["timing"]["candidate"], report["timing"]["eager"]
    # a round trip is the median of pings to a process: the judge's own process answers none
    assert eager["round_trip_ms"] > 0 and eager["clock"] == candidate["clock"] == "judge-wall", eager
    assert (eager["rounds"], eager["batch"]) == (candidate["rounds"], candidate["batch"])
    assert report["speedup"]["eager"] is not None and report["timing"]["cached"]["eager"] is False
    assert "timing: the baselines' process" in report["phases_s"]


async def test_a_baselines_process_that_dies_costs_the_baselines_not_the_verdict(sandbox: Sandbox, cache_dir: Path):
    report = await verify(sandbox, cache_dir, HONEST, reference=DIES_AS_BASELINE, trials=2)
    assert report["verdict"] == "verified", report["integrity"]
    timing = report["timing"]
    assert timing["eager"] is None and report["speedup"]["eager"] is None
    assert timing["skipped"]["eager"].startswith("not timed: the baselines' process ended without answering"), timing

    # the candidate was timed again, alone, by the whole protocol
    assert timing["candidate"]["rounds"] >= 5 and len(timing["candidate"]["samples_ms"]) == timing["candidate"]["rounds"]
