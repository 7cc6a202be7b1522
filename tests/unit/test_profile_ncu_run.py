"""ncu as the profile job runs it: the command line, and its failures from a real (fake) `ncu` on PATH."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.options import ProfileOptions
from kernel_lsp.kinds.profile import profile_job
from kernel_lsp.profile.ncu_run import (
    NcuPlan,
    kernel_name_filter,
    profile_launches,
    profiling_command,
)
from kernel_lsp.profile.worker_job import measurements, ncu_report
from profilers.ncu import (
    PERMISSION_DOCS,
    NcuFailed,
    NcuNoKernelsProfiled,
    NcuPermissionDenied,
)

CANDIDATE = '''
from torch.utils.cpp_extension import load_inline
source = """
namespace fast { __global__ void scale_kernel(float* y, int n) { y[threadIdx.x] *= 2.0f; } }
__global__ void add_kernel(float* y, int n) { y[threadIdx.x] += 1.0f; }
"""
ext = load_inline(name="ext", cpp_sources="", cuda_sources=source, functions=[])

class ModelNew:
    pass
'''

PERMISSION_OUTPUT = """==PROF== Connected to process 1234
==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on the \
target device 0. For instructions on enabling permissions and to get more information see \
https://developer.nvidia.com/ERR_NVGPUCTRPERM
==PROF== Disconnected from process 1234"""

NO_KERNELS_OUTPUT = """==PROF== Disconnected from process 1234
==WARNING== No kernels were profiled.
Available Kernels:
1. vectorized_elementwise_kernel
2. add_kernel
"""


# the stand-in ncu writes what it was given into the test's folder, which the candidate's sandbox hides
pytestmark = pytest.mark.usefixtures("without_sandbox")

def fake_ncu(folder: Path, monkeypatch, output: str, status: int = 1) -> Path:
    """An `ncu` first on PATH that prints `output` and exits with `status`, as the real one does."""
    folder.mkdir(exist_ok=True)
    (folder / "output.txt").write_text(output)
    script = folder / "ncu"
    script.write_text(f"#!/bin/sh\ncat '{folder / 'output.txt'}'\necho \"$@\" > '{folder / 'argv.txt'}'\n"
                      f"exit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


def test_the_filter_matches_own_kernels_with_or_without_their_namespace():
    (_, pattern) = kernel_name_filter(["fast::scale_kernel", "add_kernel"])
    regex = re.compile(pattern.removeprefix("regex:"))
    assert all(regex.match(name) for name in ("scale_kernel", "fast::scale_kernel", "add_kernel"))
    assert not any(regex.match(name) for name in ("add_kernel_2", "vectorized_elementwise_kernel"))
    # kernels the CuTe DSL generated from a @cute.kernel function of one of the names, and no other
    assert regex.match("kernel_cutlass_add_kernel_tensorptrf32gmemo10241_tensorptrf32gmemo10241_0")
    assert not any(regex.match(name) for name in ("kernel_cutlass_add_kernelx_0", "kernel_cutlass_other_0",
                                                  "void at::kernel_cutlass_add_kernel_0"))
    assert kernel_name_filter([]) == []


def test_the_command_skips_the_warm_up_and_bounds_the_launches():
    plan = NcuPlan(candidate="cand.py", reference="reference/ref.py", kernels=("add_kernel",), launch_count=3)
    argv = profiling_command(plan, "ncu", Path("/tmp/out.ncu-rep"))
    assert argv[:5] == ["ncu", "--profile-from-start", "off", "-k",
                         "regex:^(?:(?:.*::)?(?:add_kernel)$|kernel_cutlass_(?:add_kernel)_)"]
    assert argv[argv.index("--clock-control") + 1] == "none"
    assert argv[argv.index("--launch-count") + 1] == "3" and "--export" in argv
    assert argv[-6:] == ["-m", "kernel_lsp.profile.driver", "--candidate", "cand.py", "--reference",
                         "reference/ref.py"]


async def test_counter_permission_refused_raises_with_the_fix(tmp_path: Path, monkeypatch):
    fake_ncu(tmp_path / "bin", monkeypatch, PERMISSION_OUTPUT)
    with pytest.raises(NcuPermissionDenied) as raised:
        await profile_launches(NcuPlan("cand.py", None, ("add_kernel",)), {"cand.py": CANDIDATE})
    assert "NVreg_RestrictProfilingToAdminUsers=0" in str(raised.value) and PERMISSION_DOCS in str(raised.value)
    argv = (tmp_path / "bin" / "argv.txt").read_text()
    assert "--profile-from-start off" in argv and "kernel_lsp.profile.driver --candidate cand.py" in argv


async def test_no_kernel_profiled_lists_what_the_program_launched(tmp_path: Path, monkeypatch):
    fake_ncu(tmp_path / "bin", monkeypatch, NO_KERNELS_OUTPUT, status=0)
    with pytest.raises(NcuNoKernelsProfiled, match="vectorized_elementwise_kernel, add_kernel"):
        await profile_launches(NcuPlan("cand.py", None, ("scale_kernel",)), {"cand.py": CANDIDATE})


async def test_a_failing_program_shows_its_own_last_output(tmp_path: Path, monkeypatch):
    fake_ncu(tmp_path / "bin", monkeypatch, "Traceback (most recent call last):\nRuntimeError: CUDA error: oops\n")
    with pytest.raises(NcuFailed, match="exit status 1; last output: .*RuntimeError: CUDA error: oops"):
        await profile_launches(NcuPlan("cand.py", None, ()), {"cand.py": CANDIDATE})


async def test_the_job_turns_an_ncu_failure_into_a_problem_and_profiles_its_own_kernels(tmp_path: Path,
                                                                                         monkeypatch):
    fake_ncu(tmp_path / "bin", monkeypatch, PERMISSION_OUTPUT)
    candidate = tmp_path / "cand.py"
    candidate.write_text(CANDIDATE)
    measured = {"problems": [{"code": "profile-no-energy", "message": "no energy reading: test"}], "extensions": [],
                "ceilings": None,
                "gpu_state": {"name": "NVIDIA H200"}, "energy": None,
                "reference_kernels": [{"name": "void at::native::add_kernel", "device_ms": 0.01, "calls": 1}],
                "reference_energy": None, "isolation": {"files": "isolated: test", "network": "isolated: test"}}
    report, artifacts = await ncu_report(profile_job(candidate, None, {}), ProfileOptions(), measurements(measured))
    report = encode(report)  # as the job's result carries it
    assert report["kernels"] == [] and artifacts == {}
    assert report["problems"][0] == {"code": "profile-no-energy", "message": "no energy reading: test"}
    failed = report["problems"][1]
    assert failed["code"] == "profile-ncu-failed"
    assert "ERR_NVGPUCTRPERM" in failed["message"] and "NVreg_RestrictProfilingToAdminUsers" in failed["message"]
    assert report["gpu"] == "NVIDIA H200" and report["reference_kernels"][0]["calls"] == 1
    argv = (tmp_path / "bin" / "argv.txt").read_text()
    assert "regex:^(?:(?:.*::)?(?:add_kernel|scale_kernel)$|kernel_cutlass_(?:add_kernel|scale_kernel)_)" in argv
