"""The worker's own job kinds (JOB_KINDS) and what every handler gets (JobContext). A handler takes a Job and a
JobContext and returns a protocol Result, whose metrics are its kind's class of contracts.job_metrics, encoded; the
candidate's kinds (verify, profile: kernel_lsp/kinds/) are registered beside these where the worker is started
(kernel_lsp/commands/worker.py). Handlers see the worker through the context, never the daemon itself.

Candidates run only through the sandbox, so a candidate's crash is a finding in an `ok` result, never a
failure of the worker.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.job_metrics import BuildMetrics, DeviceInfoMetrics, RunMetrics
from kernel_lsp.findings import SOURCE, Finding, Range, Severity, path_to_uri
from kernel_lsp.jobs.cache import cache_key
from kernel_lsp.verify.verdict import isolation_gaps
from kernel_lsp.worker.environment import device_summary, package_version
from kernel_lsp.worker.protocol import Job, Result
from kernel_lsp.worker.sandbox import SandboxLimits, SandboxRun, SandboxTask

if TYPE_CHECKING:
    from kernel_lsp.worker.startup import TorchStartup
    from kernel_lsp.worker.sandbox import Sandbox

BUILT_MARKER = "kernel-lsp-built"


@dataclass
class JobContext:
    """What a handler may use of the worker that runs it."""

    progress: Callable[..., Awaitable[None]]  # progress(text, fraction=None): to the client that sent the job
    sandbox: "Sandbox"  # runs a task in a fresh child under limits: the judge's side (it starts candidates itself)
    user_sandbox: "Sandbox"  # the same, with each child confined like a candidate's process: for user code
    startup: "TorchStartup"  # torch imported and CUDA initialised (await startup.wait(); cuda_available, problem)
    cache_dir: Path  # the worker's cache folder
    gpu_slot: Callable[[], AbstractAsyncContextManager[None]]  # `async with context.gpu_slot():` the GPU alone
    build_lock: Callable[[str], asyncio.Lock]  # one build per content hash at a time
    versions: Callable[[], dict[str, str | None]]  # package versions, CUDA and the driver


Handler = Callable[[Job, JobContext], Awaitable[Result]]


async def noop(job: Job, context: JobContext) -> Result:
    """Does nothing: what a round trip costs."""
    return Result("ok", [], {}, {})


async def device_info(job: Job, context: JobContext) -> Result:
    """Versions and the GPU's facts, once torch is imported and CUDA initialised."""
    await context.startup.wait()
    warm = context.startup
    device = device_summary()
    metrics = DeviceInfoMetrics(context.versions(), warm.cuda_available, device)
    problems = [p for p in (warm.problem, None if device else "no GPU visible to NVML on the worker's machine")
                if p]
    return Result("ok", [], encode(metrics), {}, "; ".join(problems) or None)


def sandbox_limits(raw: dict[str, Any]) -> SandboxLimits:
    defaults = SandboxLimits()
    return SandboxLimits(
        wall_time_s=float(raw.get("wallTimeS", defaults.wall_time_s)),
        host_memory_bytes=raw.get("hostMemoryBytes", defaults.host_memory_bytes),
        gpu_memory_fraction=raw.get("gpuMemoryFraction", defaults.gpu_memory_fraction),
        output_bytes=int(raw.get("outputBytes", defaults.output_bytes)),
        disk_bytes=raw.get("diskBytes", defaults.disk_bytes),
    )


async def on_device(context: JobContext, on_gpu: bool, work: Callable[[], Awaitable[Result]]) -> Result:
    """`work()`, holding the GPU slot when it runs on the GPU: one such job at a time, so timings and profiles
    never share the device."""
    if not on_gpu:
        return await work()
    async with context.gpu_slot():
        return await work()


async def run_python(job: Job, context: JobContext) -> Result:
    """Calls `function(**kwargs)` of one of the job's files in a sandboxed child; with usesCuda it waits for
    the GPU slot."""
    return await on_device(context, bool(job.config.get("usesCuda")), lambda: _run_python(job, context))


async def _run_python(job: Job, context: JobContext) -> Result:
    config = job.config
    task = SandboxTask(entry="kernel_lsp.worker.tasks:call_function",
                       args={"file": config["file"], "function": config["function"],
                             "kwargs": config.get("kwargs") or {}, "uses_cuda": bool(config.get("usesCuda"))},
                       files=job.source_files, origins=config.get("origins") or {})
    await context.progress(f"running {config['function']} from {config['file']} in a sandbox")
    ran = await context.user_sandbox.run(task, sandbox_limits(config.get("limits") or {}))
    findings = user_code_findings(ran, task)
    return Result("ok", findings, encode(RunMetrics(ran.duration_s, ran.status)), {"sandbox_run": ran.to_dict()})


def user_code_findings(ran: SandboxRun, task: SandboxTask) -> list[dict[str, Any]]:
    """How user code's run ended (nothing when it returned), and what kept it in, when that was not all."""
    findings = [] if ran.status == "ok" else [sandbox_run_finding(ran, task)]
    gaps = isolation_gaps(ran.isolation)
    if gaps:
        findings.append(Finding(path_to_uri(_first_file(task)), Range.line(0), Severity.WARNING, SOURCE,
                                "run-not-isolated", "the code ran without full isolation: " + "; ".join(gaps)))
    return [finding.to_dict() for finding in findings]


def _first_file(task: SandboxTask) -> str:
    return next(iter(task.origins.values()), next(iter(task.files), "candidate"))


# Packages a candidate may import that the worker's Python may lack, by top-level module: what installs each where
# the worker runs. A run one of them stopped says nothing of the candidate: the worker's install is to fix.
WORKER_PACKAGES = {"cutlass": "pip install 'kernel-lsp[cute-dsl]' (nvidia-cutlass-dsl)",
                   "triton": "pip install 'kernel-lsp[worker]' (triton)",
                   "numpy": "pip install 'kernel-lsp[worker]' (numpy)"}
_NO_MODULE = re.compile(r"No module named '(?P<name>[\w.]+)'")


_MODULE_NOT_FOUND = re.compile("ModuleNotFoundError: " + _NO_MODULE.pattern)  # in a traceback's text


def missing_package(ran: SandboxRun) -> str | None:
    """Why a run that a package of WORKER_PACKAGES missing stopped proves nothing, with the command that installs
    it; None for any other ending (a missing module of the user's own is the candidate's to fix)."""
    found = _NO_MODULE.search(ran.message) if ran.error_type == "ModuleNotFoundError" else None
    return _worker_package(found["name"] if found else None)


def missing_package_in(output: str) -> str | None:
    """missing_package for a run known only by what it printed (a tool's child process: the sanitizer's warm
    call): the last ModuleNotFoundError of its traceback."""
    found = _MODULE_NOT_FOUND.findall(output)
    return _worker_package(found[-1] if found else None)


def _worker_package(module: str | None) -> str | None:
    top = module.split(".")[0] if module else None
    if top not in WORKER_PACKAGES:
        return None
    return (f"the worker's Python has no {top} module, which the candidate imports: {WORKER_PACKAGES[top]} where "
            "the worker runs (not a fault of the candidate)")


def sandbox_run_finding(ran: SandboxRun, task: SandboxTask) -> Finding:
    """How a candidate run ended, on the deepest traceback line inside the user's own files."""
    user_files = set(task.origins.values())
    frame = next((f for f in reversed(ran.traceback) if f.file in user_files), None)
    if frame is not None:
        uri, rng = path_to_uri(frame.file), Range.line(max(frame.line - 1, 0))
    else:
        uri, rng = path_to_uri(_first_file(task)), Range.line(0)
    return Finding(uri, rng, Severity.ERROR, SOURCE, f"run-{ran.status}", ran.message,
                   data={"status": ran.status, "errorType": ran.error_type,
                         "signal": ran.signal_name, "exitCode": ran.exit_code})


async def build_extension(job: Job, context: JobContext) -> Result:
    """A load_inline extension built once per content hash: the same sources and flags reuse the build. It is
    built in a child confined like a candidate's process (its code runs when it loads); the child makes its folder.

    Builds use the CPU and never wait for the GPU slot, so they overlap with GPU jobs.
    """
    config = job.config
    key = cache_key("extension", job.source_files, config, package_version("torch"))[:24]
    directory = context.cache_dir / "extensions" / key
    async with context.build_lock(key):
        cached = (directory / BUILT_MARKER).is_file()
        await context.progress(f"{'loading cached' if cached else 'building'} extension {config['name']}")
        task = SandboxTask(entry="kernel_lsp.worker.tasks:build_extension", files={},
                           args={"name": config["name"], "cpp_sources": [job.source_files.get("main.cpp", "")],
                                 "cuda_sources": [job.source_files["cuda.cu"]] if "cuda.cu" in job.source_files else [],
                                 "functions": config.get("functions"), "extra_cflags": config.get("extraCflags", []),
                                 "extra_cuda_cflags": config.get("extraCudaCflags", []),
                                 "build_directory": str(directory)})
        ran = await context.user_sandbox.run(task, sandbox_limits(config.get("limits") or {"wallTimeS": 900}))
        if ran.status == "ok":
            (directory / BUILT_MARKER).write_text(key)
    findings = user_code_findings(ran, task)
    return Result("ok", findings, encode(BuildMetrics(ran.duration_s, ran.status, cached, str(directory))),
                  {"sandbox_run": ran.to_dict()})


JOB_KINDS: dict[str, Handler] = {
    "noop": noop,
    "device-info": device_info,
    "run-python": run_python,
    "build-extension": build_extension,
}
