"""The static profile: what a kernel's compiled code shows without a GPU (ptxas resources, SASS statistics and the
SASS rules' hints), for `.cu` files and the CUDA strings of load_inline calls.

Each unit is compiled as torch would build it (kernel_lsp.compile: load_inline's cuda.cu with torch's headers and
flags) but to a single-arch cubin with -lineinfo, so nvdisasm can give every instruction its source line; lines
of a generated cuda.cu are mapped back to the `.py` through its source map.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kernel_lsp.compile.commands import device_command
from kernel_lsp.compile.process import run_process
from kernel_lsp.compile.toolchain import (
    Tool,
    ToolProblem,
    TorchHeaders,
    find_nvcc,
    find_torch_headers,
)
from kernel_lsp.compile.units import (
    CUDA_SUFFIXES,
    CompileUnit,
    cuda_unit,
    load_inline_units,
)
from kernel_lsp.config import Settings
from kernel_lsp.contracts.profile_report import KernelMetrics, KernelProfile, ProfileProblem, ProfileReport, PtxasFigures
from kernel_lsp.profile.locations import Location, document_line, kernel_locations
from kernel_lsp.profile.report import profile_hint, profile_report, sass_summary
from kernel_lsp.sources import parse_python
from profilers.hints.sass_rules import sass_hints
from profilers.ptxas import KernelResources, parse_ptxas_verbose
from profilers.sass import (
    SassStats,
    SassToolFailed,
    SassToolMissing,
    sass_stats_for_cubin,
)

REFERENCE_FOLDER = "reference/"  # profile_job's name for a reference outside the candidate's folder


@dataclasses.dataclass(frozen=True)
class PlacedUnit:
    unit: CompileUnit
    path: str  # the user's file the unit's lines map to


NO_CUDA_SOURCE = "profile-no-cuda-source"
CHECK_POINTER = "`kernel-lsp check {path}` shows the errors on their lines"  # the editor points to its diagnostics


async def static_profile(files: dict[str, str], candidate: str, origins: dict[str, str] | None = None,
                         kernels: Sequence[str] = (), settings: Settings | None = None) -> ProfileReport:
    """A "static" ProfileReport of the candidate's CUDA: its .cu files and its load_inline CUDA strings (the
    reference's files are left out). `kernels` keeps only those base names."""
    settings, origins = settings or Settings(), origins or {}
    units = compile_units(files, candidate, origins, settings)
    problems: list[ProfileProblem] = []
    if not units:
        problems.append(ProfileProblem(NO_CUDA_SOURCE,
                                       f"{candidate} holds no CUDA source to compile (load_inline cuda_sources or a "
                                       ".cu file), so no static profile (ptxas and SASS) can stand in for ncu: "
                                       "Triton and CuTe DSL kernels are profiled by ncu on a GPU worker"))
        return profile_report("static", [], problems=problems)
    try:
        nvcc = await find_nvcc(settings)
        torch = await find_torch_headers(settings) if any(p.unit.torch_flags for p in units) else None
    except ToolProblem as exc:
        return profile_report("static", [], problems=[ProfileProblem("profile-tool-missing",
                                                                     f"no static profile: {exc}")])
    locations = kernel_locations(files, origins)
    profiles: list[KernelProfile] = []
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-profile-") as directory:
        for placed in units:
            profiles += await unit_profiles(placed, nvcc, torch, settings, Path(directory), locations, problems)
    if kernels:
        profiles = [p for p in profiles if p.kernel in kernels]
    profiles.sort(key=lambda p: (p.file or "", p.line or 0))
    profiles = [dataclasses.replace(profile, id=index) for index, profile in enumerate(profiles)]
    return profile_report("static", profiles, problems=problems)


def compile_units(files: dict[str, str], candidate: str, origins: dict[str, str],
                  settings: Settings) -> list[PlacedUnit]:
    """The device-side units: every CUDA file of the job but the reference's, and the candidate's load_inline
    CUDA strings."""
    units = []
    for name, text in sorted(files.items()):
        path = origins.get(name, name)
        if name.endswith(CUDA_SUFFIXES) and not name.startswith(REFERENCE_FOLDER):
            units.append(PlacedUnit(cuda_unit(Path(path), text, settings.compile.include_dirs,
                                              settings.compile.extra_flags), path))
        elif name == candidate and name.endswith(".py"):
            for ext in parse_python(text).extensions:
                if ext.kind == "load_inline":
                    units += [PlacedUnit(u, path) for u in load_inline_units(ext, Path(path),
                                                                             settings.compile.include_dirs)
                              if u.stage == "device"]
    return units


def cubin_command(nvcc: str, unit: CompileUnit, settings: Settings, torch: TorchHeaders | None,
                  output: str) -> list[str]:
    """The check's device command, writing one cubin (one arch: the first of the arch setting) for nvdisasm."""
    argv = device_command(nvcc, unit, settings.replaced(arch=settings.compile.arch[:1]), torch, output)
    return ["-cubin" if arg == "-fatbin" else arg for arg in argv]


async def unit_profiles(placed: PlacedUnit, nvcc: Tool, torch: TorchHeaders | None, settings: Settings,
                        directory: Path, locations: dict[str, Location],
                        problems: list[ProfileProblem]) -> list[KernelProfile]:
    """Compiles one unit and profiles each of its kernels; a failure becomes a problem and no profiles."""
    unit = placed.unit
    (directory / unit.file_name).write_text(unit.text, encoding="utf-8", errors="replace")
    cubin = directory / (Path(unit.file_name).stem + ".cubin")
    argv = cubin_command(nvcc.path, unit, settings, torch, str(cubin))
    result = await run_process(argv, timeout_s=settings.compile.timeout_s, cwd=str(directory))
    if result.timed_out or result.returncode != 0:
        why = "timed out" if result.timed_out else f"exit status {result.returncode}"
        problems.append(ProfileProblem("profile-build-failed", f"nvcc could not compile {unit.label} ({why}): "
                                                               f"{CHECK_POINTER.format(path=placed.path)}"))
        return []
    resources = [r for r in parse_ptxas_verbose(result.output) if r.is_entry]
    try:
        stats = {s.mangled: s for s in await asyncio.to_thread(sass_stats_for_cubin, cubin)}
    except (SassToolMissing, SassToolFailed) as exc:
        problems.append(ProfileProblem("profile-no-sass", f"no SASS for {unit.label}, ptxas figures only: {exc}"))
        stats = {}
    return [kernel_profile(r, stats.get(r.mangled), placed, locations.get(r.base_name)) for r in resources]


def kernel_profile(resources: KernelResources, stats: SassStats | None, placed: PlacedUnit,
                   location: Location | None) -> KernelProfile:
    """One kernel's static KernelProfile: ptxas figures, SASS summary, and the SASS rules' hints on their lines."""
    hints = sass_hints(in_document(stats, placed), resources) if stats is not None else []
    return KernelProfile(kernel=resources.base_name, name=resources.name, id=0, bound=None,
                         metrics=KernelMetrics(ptxas=ptxas_metrics(resources)),
                         findings=[profile_hint(h, h.file, h.line) for h in hints], registers=resources.registers,
                         sass=sass_summary(stats) if stats is not None else None, arch=resources.arch,
                         file=location.file if location else placed.path,
                         line=location.range.start.line + 1 if location else None)


def in_document(stats: SassStats, placed: PlacedUnit) -> SassStats:
    """The stats with each site's line a line of the user's file, so the hints' messages name lines the user
    sees; sites in headers or in torch's generated code get none."""
    return dataclasses.replace(stats, sites=[dataclasses.replace(site, file=file, line=line) for site in stats.sites
                                             for file, line in [site_place(site.file, site.line, placed)]])


def site_place(file: str | None, line: int | None, placed: PlacedUnit) -> tuple[str | None, int | None]:
    """A line of the compiled unit as (user's file, 1-based line); (None, None) inside headers."""
    if file is None or line is None or Path(file).name != placed.unit.file_name:
        return None, None
    mapped = document_line(placed.unit, line)
    return (placed.path, mapped) if mapped is not None else (None, None)


def ptxas_metrics(resources: KernelResources) -> PtxasFigures:
    return PtxasFigures(arch=resources.arch, registers=resources.registers, stack_frame=resources.stack_frame,
                        spill_stores=resources.spill_stores, spill_loads=resources.spill_loads,
                        shared_bytes=resources.shared_bytes, barriers=resources.barriers)
