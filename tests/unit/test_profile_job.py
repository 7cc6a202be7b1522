"""The "profile" job: built from paths, and run by a real worker on this machine's CPU (the static profile)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.findings import Severity
from kernel_lsp.kinds.profile import profile_job, profile_options
from kernel_lsp.profile.worker_job import NO_GPU_PLAIN, ON_CPU, static_result
from kernel_lsp.worker.client import WorkerClient
from kernel_lsp.worker.protocol import Job, Result
from tests.unit.test_profile_static import LOAD_INLINE_CANDIDATE, LOCAL_ARRAY_LINE

PROBLEM = "import torch\n\nclass Model:\n    pass\n\ndef get_inputs():\n    return [torch.rand(8)]\n"


def test_files_are_named_from_the_candidates_folder(tmp_path: Path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.cu").write_text("__global__ void k() {}\n")
    candidate = tmp_path / "cand.py"
    candidate.write_text("from torch.utils.cpp_extension import load\next = load(name='e', sources=['kernels/k.cu'])\n")
    elsewhere = tmp_path.parent / f"{tmp_path.name}-problems"
    elsewhere.mkdir()
    (elsewhere / "1_Relu.py").write_text(PROBLEM)
    job = profile_job(candidate, elsewhere / "1_Relu.py", {"kernels": ["k"], "launchCount": 2})
    assert job.kind == "profile"
    assert sorted(job.source_files) == ["cand.py", "kernels/k.cu", "reference/1_Relu.py"]
    assert job.config["candidate"] == "cand.py" and job.config["reference"] == "reference/1_Relu.py"
    assert job.config["origins"]["kernels/k.cu"] == str((tmp_path / "kernels" / "k.cu").resolve())
    assert job.config["kernels"] == ["k"] and job.config["launchCount"] == 2
    assert job.content_hash == profile_job(candidate, elsewhere / "1_Relu.py", {"kernels": ["k"], "launchCount": 2}
                                           ).content_hash


def test_without_a_reference_the_job_has_none(tmp_path: Path):
    candidate = tmp_path / "both.py"
    candidate.write_text(PROBLEM + "class ModelNew:\n    pass\n")
    job = profile_job(candidate, None, {})
    assert list(job.source_files) == ["both.py"] and "reference" not in job.config


def test_unknown_options_are_refused(tmp_path: Path):
    candidate = tmp_path / "cand.py"
    candidate.write_text("")
    with pytest.raises(ValueError, match="unknown profile options: trials"):
        profile_job(candidate, None, {"trials": 3})


async def profile_on_a_worker(tmp_path: Path, options: dict, *, cpu_only: bool = False) -> Result:
    """The LOAD_INLINE_CANDIDATE's profile job on a local worker; cpu_only: skipped where the worker has a GPU."""
    candidate = tmp_path / "cand.py"
    candidate.write_text(LOAD_INLINE_CANDIDATE)
    client = WorkerClient(job_timeout_s=600)
    try:
        if cpu_only:
            info = await client.run(Job("device-info", {}, {}, ""), timeout_s=300)
            if info.metrics["cudaAvailable"]:
                pytest.skip("a GPU is present: the worker profiles with ncu (tests/gpu/test_profile_gpu.py)")
        result = await client.run(profile_job(candidate, None, options))
    finally:
        await client.close()
    assert result.status == "ok", result.error
    return result


@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.slow
async def test_the_worker_gives_the_static_profile_on_the_python_lines_without_a_gpu(tmp_path: Path):
    result = await profile_on_a_worker(tmp_path, {}, cpu_only=True)
    report = result.metrics["profile"]
    assert report["source"] == "static"
    assert report["problems"][0] == {"code": "profile-no-gpu", "message": NO_GPU_PLAIN.message}  # no reference named
    assert result.metrics["summary"].startswith("1 kernel (static): gather_kernel")
    local = next(f for f in result.findings if f["code"] == "hint-local-memory")
    assert local["uri"].endswith(f"{tmp_path.name}/cand.py")
    assert local["range"][0] == LOCAL_ARRAY_LINE - 1
    assert {f["severity"] for f in result.findings} <= {Severity.INFORMATION, Severity.HINT}
    assert local["message"].startswith("gather_kernel: ") and local["data"]["kernel"] == "gather_kernel"


@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.slow
async def test_device_cpu_asks_for_the_static_profile_and_says_so(tmp_path: Path):
    result = await profile_on_a_worker(tmp_path, {"device": "cpu"})
    report = result.metrics["profile"]
    assert report["source"] == "static"
    assert report["problems"][0] == {"code": "profile-on-cpu", "message": ON_CPU.message}


async def test_without_cuda_source_no_note_says_this_is_the_static_profile(tmp_path: Path):
    """A Triton file without a GPU: the one problem says there is nothing to profile statically; the note that
    would introduce "the static profile" (there is none) is left out, so the two never contradict each other."""
    path = tmp_path / "t.py"
    path.write_text("import triton\n")
    result = await static_result(profile_job(path, None, profile_options(Settings())), (), NO_GPU_PLAIN)
    assert [p["code"] for p in result.metrics["profile"]["problems"]] == ["profile-no-cuda-source"]


async def test_a_package_missing_where_the_worker_runs_is_the_workers_problem_not_the_candidates():
    """The measuring sandbox stopped at the candidate's `import cutlass.cute` on a worker without the DSL: the
    report says which package and how to install it, and no Error lands on the candidate's import line."""
    from types import SimpleNamespace

    from kernel_lsp.contracts.options import ProfileOptions
    from kernel_lsp.profile.worker_job import gpu_profile
    from kernel_lsp.worker.sandbox import SandboxRun, TracebackFrame

    def stopped_at(module: str) -> SandboxRun:
        frame = TracebackFrame("/work/cand.py", 3, "<module>", f"import {module}")
        return SandboxRun("python-exception", f"ModuleNotFoundError: No module named '{module}'", None, "", "",
                          False, 0.5, 1, None, [frame], "ModuleNotFoundError")

    async def profile_of(ran: SandboxRun) -> Result:
        async def run(task, limits):
            return ran

        async def progress(*_args, **_kwargs) -> None:
            return None

        context = SimpleNamespace(sandbox=SimpleNamespace(run=run), cache_dir=Path("/nonexistent"), progress=progress)
        job = Job("profile", {"cand.py": "import cutlass.cute\n"}, {"candidate": "cand.py",
                                                                   "origins": {"cand.py": "/work/cand.py"}}, "key")
        return await gpu_profile(job, ProfileOptions(), context)

    missing = (await profile_of(stopped_at("cutlass.cute"))).metrics["profile"]["problems"]
    assert [p["code"] for p in missing] == ["profile-worker-package"], missing
    assert "pip install 'kernel-lsp[cute-dsl]'" in missing[0]["message"], missing
    own = await profile_of(stopped_at("my_kernels"))  # the user's own module: the candidate's failure, on its line
    assert [p["code"] for p in own.metrics["profile"]["problems"]] == ["profile-candidate-failed"]
    assert any(f["code"] == "run-python-exception" and f["severity"] == Severity.ERROR for f in own.findings)


def test_the_sanitizer_reads_a_missing_worker_package_from_its_warm_calls_output():
    """The sanitizer's warm call is a child process known by what it printed: a real interpreter's traceback for a
    package of the worker's install that it lacks names the package and its install command; the user's own
    module is not the worker's to install."""
    import subprocess
    import sys

    from kernel_lsp.worker.jobs import missing_package_in

    def printed(module: str) -> str:  # -S: no site-packages, so neither triton nor a made-up module imports
        done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import {module}"], capture_output=True, text=True)
        assert done.returncode == 1, done
        return "building cand.py with -lineinfo...\n" + done.stdout + done.stderr

    said = missing_package_in(printed("triton.language"))
    assert said is not None and "no triton module" in said and "pip install 'kernel-lsp[worker]'" in said, said
    assert missing_package_in(printed("my_kernels")) is None
    assert missing_package_in("exit 1: CUDA error: an illegal memory access was encountered") is None
