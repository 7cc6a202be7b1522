"""The "profile" job's work in the worker; its handler is kernel_lsp.kinds.profile.handle.

On a GPU: a sandboxed child measures what needs torch (reference kernels, energy, ceilings, the extension's
binary), ncu profiles the candidate's own kernels, and the extension's SASS adds the SASS rules' hints. Without a
GPU, or when ncu profiled nothing, the static profile (ptxas + SASS from nvcc) stands in. Every failure of a tool
is a problem in the report; only the candidate's own crash is a finding of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernel_lsp.compile.units import CUDA_SUFFIXES
from kernel_lsp.config import Settings
from kernel_lsp.findings import Finding
from kernel_lsp.contracts.codec import ContractError, Wire, decode, encode
from kernel_lsp.contracts.job_metrics import ProfileMetrics
from kernel_lsp.contracts.options import DEFAULT_JOB_LIMITS, ProfileOptions
from kernel_lsp.contracts.profile_report import ProfileIsolation, ProfileMeasurements, ProfileProblem, ProfileReport
from kernel_lsp.profile.locations import kernel_locations
from kernel_lsp.profile.ncu_run import NcuPlan, profile_launches, profile_program, write_files
from kernel_lsp.profile.program import (
    build_program,
    confined_launch,
    has_main,
    program_header,
    run_program,
    runtime_findings,
)
from kernel_lsp.profile.report import (
    launch_profile,
    ncu_ceilings,
    profile_findings,
    profile_report,
    roofline_ceilings,
    summary_line,
)
from kernel_lsp.profile.static import NO_CUDA_SOURCE, REFERENCE_FOLDER, static_profile
from kernel_lsp.candidate.kernels import cute_kernel_function, own_kernel_names
from kernel_lsp.candidate.handle import tool_isolation
from kernel_lsp.verify.verdict import isolation_gaps
from kernel_lsp.worker.jobs import JobContext, missing_package, sandbox_run_finding, sandbox_limits
from kernel_lsp.worker.protocol import Job, Result
from kernel_lsp.worker.sandbox import SandboxTask
from profilers.ncu import DEFAULT_SECTIONS, KernelLaunch, NcuError
from profilers.roofline import Ceilings, kernel_point, roofline_svg
from profilers.sass import (
    SassStats,
    SassToolFailed,
    SassToolMissing,
    sass_stats_for_cubin,
)


NO_GPU = ProfileProblem("profile-no-gpu", "no GPU visible to the worker: ncu, energy and the reference's kernel "
                                          "times need one; this is the static profile (ptxas resources and SASS) of "
                                          "the candidate's CUDA")
NO_GPU_PLAIN = ProfileProblem("profile-no-gpu", "no GPU visible to the worker: ncu and energy need one; this is the "
                                                "static profile (ptxas resources and SASS) of the file's CUDA")  # no ref
ON_CPU = ProfileProblem("profile-on-cpu", "asked for on the CPU (device cpu): this is the static profile (ptxas "
                                          "resources and SASS) of the candidate's CUDA")
STATIC_STANDS_IN = ProfileProblem("profile-static-stands-in", "ncu profiled no kernel: the static profile (ptxas and "
                                                              "SASS) stands in")
CUDA_FILE_NO_MAIN = ProfileProblem("profile-cuda-file", "a .cu file without main() is profiled statically (ptxas "
                                                        "resources and SASS): a program with its own main() is built "
                                                        "and profiled live under ncu on a GPU worker")
CUDA_FILE = ProfileProblem("profile-cuda-file", "a .cu file is profiled statically, by the server (ptxas resources "
                                                "and SASS, no GPU run); ncu profiles the kernels of a .py candidate "
                                                "(ModelNew) on a GPU worker")


async def profile_result(job: Job, options: ProfileOptions, context: JobContext, on_gpu: bool) -> Result:
    config = job.config
    candidate = config["candidate"]
    if not on_gpu:
        await context.progress(f"no GPU: static profile of {candidate}")
        no_gpu = NO_GPU if config.get("reference") else NO_GPU_PLAIN
        return await static_result(job, options.kernels, ON_CPU if options.device == "cpu" else no_gpu)
    if candidate.endswith(CUDA_SUFFIXES):
        return await program_profile(job, options, context)
    return await gpu_profile(job, options, context)


async def program_profile(job: Job, options: ProfileOptions, context: JobContext) -> Result:
    """A standalone `.cu` program (its own main()) on the GPU: built with nvcc -lineinfo, run once (its failures
    are findings), then its own kernels under ncu, with the SASS rules from its binary; the static profile when
    it has no main() or ncu profiled nothing."""
    config = job.config
    candidate = config["candidate"]
    origins = config.get("origins") or {}
    text = job.source_files[candidate]
    if not has_main(text):
        return await static_result(job, options.kernels, CUDA_FILE_NO_MAIN)
    header = program_header(text)
    problems = list(header.problems)
    runtime: list[Finding] = []
    launches: list[KernelLaunch] = []
    sass: dict[str, SassStats] = {}
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-program-") as directory:
        folder = Path(directory)
        write_files(folder / "task", job.source_files)
        await context.progress(f"building {candidate} with nvcc")
        built = await build_program(folder / "task" / candidate, header, folder / "program")
        if not built.built:
            problems += built.problems
        else:
            await context.progress(f"running {candidate}")
            home = folder / "home"
            home.mkdir()
            argv, environment = confined_launch([str(folder / "program"), *header.run], home, options.allow_network)
            result = await run_program(argv, folder / "task", environment)
            runtime = runtime_findings(result, origins.get(candidate, candidate), text, Path(candidate).name)
            plan = ncu_plan(job, options)
            await context.progress(f"profiling {candidate} under ncu")
            try:
                # ncu starts the program itself (the scrubbed environment, not the confining exec: through it the
                # program failed at once under ncu and compute-sanitizer on the H100, in a recording that allowed
                # no writes to /dev and /proc; tests/gpu/RESULTS.md, 2026-12-05)
                launches = await profile_program(plan, [str(folder / "program"), *header.run], folder, environment)
            except NcuError as exc:
                problems.append(ProfileProblem("profile-ncu-failed", str(exc)))
            sass = await extension_sass([str(folder / "program")], problems)
    ceilings = ncu_ceilings(launches, None)
    kernels = [launch_profile(launch, ceilings, {}, sass.get(launch.base_name)) for launch in launches]
    if options.kernels:
        kernels = [k for k in kernels if k.kernel in options.kernels]
    report = profile_report("ncu", kernels, gpu=ceilings.gpu if ceilings else None, ceilings=ceilings,
                            problems=problems)
    if not report.kernels:
        report = await static_stands_in(report, job, options)
    result = profile_job_result(report, job, roofline_artifacts(ceilings, launches))
    result.findings[:0] = [f.to_dict() for f in runtime]
    return result


async def static_result(job: Job, kernels: Sequence[str], note: ProfileProblem,
                        settings: Settings | None = None) -> Result:
    """The job's static profile (ptxas and SASS of its CUDA) as the profile job's Result, `note` first among its
    problems (why it is static), unless the job holds no CUDA to profile statically (that problem says so alone).
    The worker runs it without a GPU; the server runs it itself for a `.cu` file."""
    config = job.config
    report = await static_profile(job.source_files, config["candidate"], config.get("origins") or {}, kernels,
                                  settings)
    if any(p.code == NO_CUDA_SOURCE for p in report.problems):  # no static profile for the note to introduce
        return profile_job_result(report, job)
    return profile_job_result(dataclasses.replace(report, problems=[note, *report.problems]), job)


async def static_stands_in(report: ProfileReport, job: Job, options: ProfileOptions) -> ProfileReport:
    """ncu profiled no kernel: the static profile's kernels, the report's problems and why, then its own."""
    config = job.config
    static = await static_profile(job.source_files, config["candidate"], config.get("origins") or {},
                                  options.kernels)
    return dataclasses.replace(report, source="static", kernels=static.kernels,
                               problems=[*report.problems, STATIC_STANDS_IN, *static.problems])


def profile_job_result(report: ProfileReport, job: Job, artifacts: dict[str, Any] | None = None) -> Result:
    """The job's Result: the hints placed on their lines, and its ProfileMetrics (the report and its line), encoded
    here, where they leave the worker."""
    origins = job.config.get("origins") or {}
    candidate = job.config["candidate"]
    locations = kernel_locations(candidate_files(job), origins)
    texts = {origins.get(name, name): text for name, text in job.source_files.items()}
    findings = profile_findings(report.kernels, locations, origins.get(candidate, candidate), texts)
    return Result("ok", [f.to_dict() for f in findings], encode(ProfileMetrics(report, summary_line(report))),
                  artifacts or {})


def candidate_files(job: Job) -> dict[str, str]:
    """The candidate's own files: everything but the reference (whose kernels are PyTorch's, not the user's)."""
    reference = job.config.get("reference")
    return {name: text for name, text in job.source_files.items()
            if name != reference and not name.startswith(REFERENCE_FOLDER)}


async def gpu_profile(job: Job, options: ProfileOptions, context: JobContext) -> Result:
    config = job.config
    task = SandboxTask(entry="kernel_lsp.profile.measure:measure_candidate", files=job.source_files,
                       origins=config.get("origins") or {},
                       args={"candidate": config["candidate"], "reference": config.get("reference"),
                             "cache_dir": str(context.cache_dir), "uses_cuda": True,
                             "allow_network": options.allow_network})
    await context.progress(f"building and measuring {config['candidate']} (reference kernels, energy, ceilings)")
    ran = await context.sandbox.run(task, sandbox_limits(options.limits or DEFAULT_JOB_LIMITS))
    if ran.status != "ok" and (missing := missing_package(ran)) is not None:  # the worker's install, not the file
        report = profile_report("ncu", [], problems=[ProfileProblem("profile-worker-package", missing)])
        return profile_job_result(report, job, {"sandbox_run": ran.to_dict()})
    if ran.status != "ok":
        problem = ProfileProblem("profile-candidate-failed", f"the candidate did not run ({ran.status}): "
                                                             f"{ran.message}")
        report = profile_report("ncu", [], problems=[problem])
        result = profile_job_result(report, job, {"sandbox_run": ran.to_dict()})
        result.findings.insert(0, sandbox_run_finding(ran, task).to_dict())
        return result
    try:
        measured = measurements(ran.value)
    except ContractError as exc:  # the measuring process's answer, in a form this worker does not read
        report = profile_report("ncu", [], problems=[ProfileProblem("profile-contract", str(exc))])
        return profile_job_result(report, job)
    await context.progress(f"profiling {config['candidate']} under ncu")
    report, artifacts = await ncu_report(job, options, measured)
    if not report.kernels:
        report = await static_stands_in(report, job, options)
    return profile_job_result(report, job, artifacts)


def measurements(value: Wire) -> ProfileMeasurements:
    """The measuring sandbox child's answer (profile.measure.measure_candidate), decoded where it arrives."""
    return decode(ProfileMeasurements, value)


async def ncu_report(job: Job, options: ProfileOptions, measured: ProfileMeasurements
                     ) -> tuple[ProfileReport, dict[str, Any]]:
    """The ncu ProfileReport and its artifacts (the roofline chart) from the sandbox's measurements."""
    problems = list(measured.problems)
    gaps = isolation_gaps(measured.isolation)
    if gaps:
        problems.append(ProfileProblem("profile-not-isolated", "the candidate ran without full isolation: "
                                                               + "; ".join(gaps)))
    launches: list[KernelLaunch] = []
    plan = ncu_plan(job, options)
    try:
        launches = [_named_by_function(launch, plan.kernels)
                    for launch in await profile_launches(plan, job.source_files)]
    except NcuError as exc:
        problems.append(ProfileProblem("profile-ncu-failed", str(exc)))
    measured_ceilings = roofline_ceilings(measured.ceilings) if measured.ceilings is not None else None
    ceilings = ncu_ceilings(launches, measured_ceilings)
    sass = await extension_sass(measured.extensions, problems)
    state = measured.gpu_state
    energy = measured.energy
    kernels = [dataclasses.replace(launch_profile(launch, ceilings, state, sass.get(launch.base_name)),
                                   energy_mj_per_call=energy.mj_per_call if energy else None)  # the whole call's
               for launch in launches]
    if options.kernels:
        kernels = [k for k in kernels if k.kernel in options.kernels]
    name = state.get("name")
    report = profile_report("ncu", kernels, gpu=name if isinstance(name, str) and name else
                            (ceilings.gpu if ceilings else None),
                            ceilings=ceilings, reference_kernels=measured.reference_kernels, problems=problems)
    confined = measured.isolation
    report = dataclasses.replace(
        report, energy=energy,
        # of the measuring process, and of ncu's run of the candidate (in the sandbox where counters allow it)
        isolation=ProfileIsolation(files=confined.files, network=confined.network, processes=confined.processes,
                                   namespaces=confined.namespaces, ncu=tool_isolation(counters=True)),
        reference_energy=measured.reference_energy)  # the reference forward, read the same way
    return report, roofline_artifacts(ceilings, launches)


def _named_by_function(launch: KernelLaunch, own: Sequence[str]) -> KernelLaunch:
    """A kernel the CuTe DSL generated goes by its @cute.kernel function's name, where hints and hover find it."""
    function = cute_kernel_function(launch.base_name, own)
    return launch if function is None else dataclasses.replace(launch, base_name=function)


def ncu_plan(job: Job, options: ProfileOptions) -> NcuPlan:
    config = job.config
    kernels = options.kernels or tuple(sorted(own_kernel_names(candidate_files(job))))
    return NcuPlan(candidate=config["candidate"], reference=config.get("reference"), kernels=kernels,
                   sections=options.sections or DEFAULT_SECTIONS, launch_count=options.launch_count,
                   timeout_s=float(options.limits.get("wallTimeS", NcuPlan.timeout_s)),
                   allow_network=options.allow_network)


async def extension_sass(binaries: list[str], problems: list[ProfileProblem]) -> dict[str, SassStats]:
    """Base name -> SASS statistics of the kernels in the candidate's extension libraries (cuobjdump reads
    shared libraries; it prints no source lines)."""
    found: dict[str, SassStats] = {}
    for binary in binaries:
        try:
            kernels = await asyncio.to_thread(sass_stats_for_cubin, binary)  # not a cubin: cuobjdump --dump-sass
        except (SassToolMissing, SassToolFailed) as exc:
            problems.append(ProfileProblem("profile-no-sass", f"no SASS of {binary}: {exc}"))
            continue
        for stats in kernels:
            found.setdefault(stats.base_name, stats)
    return found


def roofline_artifacts(ceilings: Ceilings | None, launches: list[KernelLaunch]) -> dict[str, Any]:
    points = [p for p in (kernel_point(launch, ceilings) for launch in launches) if p is not None]
    if ceilings is None or not points:
        return {}
    return {"roofline_svg": roofline_svg(ceilings, points)}
