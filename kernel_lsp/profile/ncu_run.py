"""Nsight Compute on a candidate, run by the worker (not inside the sandbox child: ncu must start the program it
profiles): the driver under `ncu --profile-from-start off`, then the report's details and raw pages parsed.

The driver is started as a candidate's process is (candidate/handle.py): no secret in its environment,
a scratch HOME, and confined (writes only there and in the build caches, no network unless allowed) before it
imports the candidate. ncu itself writes the report beside the task's files, outside the driver's reach."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kernel_lsp.contracts.options import DEFAULT_LAUNCH_COUNT
from kernel_lsp.compile.process import output_tail, run_process
from kernel_lsp.candidate.handle import candidate_launch, tool_in_sandbox
from kernel_lsp.candidate.kernels import CUTE_DSL_PREFIX
from kernel_lsp.process.isolation import with_package_on_path
from profilers.ncu import (
    DEFAULT_SECTIONS,
    KernelLaunch,
    NcuFailed,
    NcuNotFound,
    check_ncu_output,
    find_ncu,
    import_command,
    ncu_command,
    parse_details_csv,
    parse_raw_csv,
    with_raw,
)

NCU_TIMEOUT_S = 600.0
IMPORT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class NcuPlan:
    candidate: str  # job file names, relative to the folder the files are written to
    reference: str | None
    kernels: tuple[str, ...]  # names to profile; empty: every kernel the forward launches
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    launch_count: int = DEFAULT_LAUNCH_COUNT
    timeout_s: float = NCU_TIMEOUT_S
    allow_network: bool = False


def kernel_name_filter(kernels: Sequence[str]) -> list[str]:
    """`-k regex:...` matching each name with or without a namespace: ncu shows the function name it launched,
    and a namespaced kernel's displayed name may carry its namespace."""
    if not kernels:
        return []
    names = "|".join(map(re.escape, sorted({name.rsplit("::", 1)[-1] for name in kernels})))
    # or a kernel the CuTe DSL generated from a @cute.kernel function of that name (candidate.kernels.CUTE_DSL_PREFIX)
    return ["-k", f"regex:^(?:(?:.*::)?(?:{names})$|{re.escape(CUTE_DSL_PREFIX)}(?:{names})_)"]


def driver_program(plan: NcuPlan, writable: Sequence[str] = ()) -> list[str]:
    return driver_command(plan.candidate, plan.reference, writable, plan.allow_network)


def driver_command(candidate: str, reference: str | None, writable: Sequence[str], allow_network: bool,
                   *options: str) -> list[str]:
    """The profile driver's argv (kernel_lsp/profile/driver.py), with its own `options` (--warmup, --calls)."""
    program = [sys.executable, "-P", "-m", "kernel_lsp.profile.driver", "--candidate", candidate, *options]
    program += ["--reference", reference] if reference else []
    program += [f"--writable={folder}" for folder in writable]
    return program + (["--allow-network"] if writable and allow_network else [])


def profiling_command(plan: NcuPlan, ncu: str, report: Path, writable: Sequence[str] = ()) -> list[str]:
    """ncu_command with the name filter and --profile-from-start off (the driver's warm-up is not profiled)."""
    argv = ncu_command(driver_program(plan, writable), (), plan.sections, ncu=ncu, report=report,
                       launch_count=plan.launch_count)
    return argv[:1] + ["--profile-from-start", "off"] + kernel_name_filter(plan.kernels) + argv[1:]


async def profile_launches(plan: NcuPlan, files: dict[str, str]) -> list[KernelLaunch]:
    """Every profiled launch with its details and raw metrics; an NcuError says why there are none."""
    ncu = find_ncu()
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-ncu-") as directory:
        folder = Path(directory)
        write_files(folder / "task", files)
        home = folder / "home"  # the profiled program's HOME and TMPDIR, and the one folder it may write
        home.mkdir()
        environment, writable = candidate_launch(home)
        report = folder / "profile.ncu-rep"  # written by ncu itself, which is not confined
        argv, _ = tool_in_sandbox(profiling_command(plan, ncu, report, writable), [*writable, str(folder)],
                                  (str(folder / "task"), os.path.dirname(os.path.realpath(ncu))), plan.allow_network,
                                  counters=True)
        await run_ncu_async(argv, plan.timeout_s, folder / "task", environment)
        details = await run_ncu_async(import_command(report, "details", ncu=ncu), IMPORT_TIMEOUT_S, folder)
        raw = await run_ncu_async(import_command(report, "raw", ncu=ncu), IMPORT_TIMEOUT_S, folder)
    return with_raw(parse_details_csv(details), parse_raw_csv(raw))


async def profile_program(plan: NcuPlan, program: Sequence[str], folder: Path, environment: dict[str, str]
                          ) -> list[KernelLaunch]:
    """A standalone program's own kernels (plan.kernels) under ncu, from its start: each launch with its details
    and raw metrics. `program` is its confined launch (kernel_lsp/profile/program.py), run in `folder`/task."""
    ncu = find_ncu()
    report = folder / "program.ncu-rep"
    argv = ncu_command(program, (), plan.sections, ncu=ncu, report=report, launch_count=plan.launch_count)
    argv = argv[:1] + kernel_name_filter(plan.kernels) + argv[1:]
    await run_ncu_async(argv, plan.timeout_s, folder / "task", environment)
    details = await run_ncu_async(import_command(report, "details", ncu=ncu), IMPORT_TIMEOUT_S, folder)
    raw = await run_ncu_async(import_command(report, "raw", ncu=ncu), IMPORT_TIMEOUT_S, folder)
    return with_raw(parse_details_csv(details), parse_raw_csv(raw))


async def run_ncu_async(argv: list[str], timeout_s: float, cwd: Path, environment: dict[str, str] | None = None) -> str:
    """profilers.ncu.run_ncu as an asyncio subprocess: a cancelled job kills ncu and the program it runs.
    Without an environment, the worker's own (the report imports run no candidate code)."""
    if environment is None:
        environment = with_package_on_path(dict(os.environ))
    try:
        result = await run_process(argv, timeout_s=timeout_s, cwd=str(cwd), env=environment)
    except OSError as exc:
        raise NcuNotFound(f"cannot run {argv[0]}: {exc}") from exc
    if result.timed_out:
        raise NcuFailed(f"ncu ran past {timeout_s:.0f} s and was stopped (raise limits.wallTimeS, or profile "
                        "fewer launches with launchCount)")
    try:
        check_ncu_output(result.stdout + "\n" + result.stderr, result.returncode or 0)
    except NcuFailed as exc:  # the profiled program's own error is what the user needs to see
        raise NcuFailed(f"{exc}; last output: {output_tail(result.stderr or result.stdout)}") from exc
    return result.stdout


def write_files(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = (folder / name).resolve()
        if not path.is_relative_to(folder.resolve()):
            raise ValueError(f"file name {name!r} leaves the profile folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
