"""`kernel-lsp check PATH...`: compile diagnostics in a terminal, compiler-style (or JSON), folders surveyed as the
server surveys its workspace, results through the workspace's on-disk cache."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from kernel_lsp.commands.progress import PlainProgress, command_progress
from kernel_lsp.commands.shared import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, nearest_pyproject, print_findings, shown

CHECKED_SUFFIXES = (".cu", ".cuh", ".py")
# findings that mean the environment is wrong rather than the code: exit status 2
ENVIRONMENT_CODES = {"nvcc-missing", "host-compiler-missing", "torch-missing"}


def add_parser(sub: Any) -> None:
    check = sub.add_parser("check", help="compile-check files or directories, compiler-style output")
    check.add_argument("paths", nargs="+", type=Path, help="files or folders (a folder is scanned as the workspace)")
    check.add_argument("--format", choices=["text", "json"], default="text")
    check.add_argument("--arch", action="append", help="target architecture, e.g. sm_90 (repeatable)")
    check.add_argument("--nvcc", help="path to nvcc")
    check.add_argument("--summary", action="store_true",
                       help="after the findings, one line per file: compile state, kernels, registers")
    check.add_argument("--no-cache", action="store_true",
                       help="neither read nor write the on-disk results (default: the persistentCache setting)")
    check.add_argument("--config", type=Path, help="pyproject.toml to read [tool.kernel-lsp] from "
                       "(default: the nearest one above the current directory)")
    check.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kernel_lsp.config import pyproject_settings, resolve_settings

    missing = [p for p in args.paths if not p.exists()]
    if missing:
        print(f"kernel-lsp: no such file or directory: {', '.join(map(str, missing))}", file=sys.stderr)
        return EXIT_USAGE
    config = args.config or nearest_pyproject(Path.cwd())
    layer, problems = pyproject_settings(config.parent) if config else ({}, [])
    overrides = {k: v for k, v in (("arch", args.arch), ("nvccPath", args.nvcc)) if v}
    settings, more = resolve_settings(layer, overrides)
    for problem in problems + more:
        print(f"kernel-lsp: warning: {problem}", file=sys.stderr)
    files = _targets(args.paths, settings)
    project = config.parent if config else Path.cwd()
    cache, disk = _result_cache(settings, project, enabled=not args.no_cache)
    with command_progress(f"kernel-lsp check: {len(files)} file{'s' if len(files) != 1 else ''}", args.format,
                          total=len(files)) as progress:
        results = asyncio.run(_check_files(files, settings, cache, progress))
    if disk is not None:
        disk.flush()
    findings = [f for path in files for f in results[path][0]]
    print_findings(findings, args.format, _summary(files, results, disk) if args.summary else None)
    if any(f.code in ENVIRONMENT_CODES for f in findings):
        return EXIT_USAGE
    return EXIT_FINDINGS if any(f.severity == 1 for f in findings) else EXIT_OK


def _targets(paths: list[Path], settings) -> list[Path]:
    """Files named are checked; folders are scanned as the server scans its workspace (.gitignore and
    `workspaceExclude` honoured) for .cu, .cuh and .py files, less the headers another file includes (those are
    checked through their includers)."""
    from kernel_lsp.workspace.survey import exclude_patterns, survey

    found: set[Path] = set()
    for path in paths:
        if not path.is_dir():
            found.add(path.resolve())
            continue
        scanned = survey([path], exclude_patterns(settings.workspace.exclude),
                         [Path(d) for d in settings.compile.include_dirs])
        found.update(p for p in scanned.digests if p.suffix in CHECKED_SUFFIXES and scanned.checked_alone(p))
    return sorted(found)


def _result_cache(settings, project: Path, enabled: bool):
    """The results cache in front of the compiler: on disk (shared with a server opened on `project`) when the
    persistentCache setting and `enabled` allow it."""
    from kernel_lsp.jobs.cache import ResultCache
    from kernel_lsp.jobs.disk_cache import DiskCache
    from kernel_lsp.config import cache_dir
    from kernel_lsp.workspace.survey import results_file

    if not (enabled and settings.workspace.persistent_cache):
        return ResultCache(), None
    disk = DiskCache(results_file(cache_dir(), [project]))
    report = disk.load()
    if report.problem:
        print(f"kernel-lsp: warning: {report.problem}", file=sys.stderr)
    return ResultCache(max_entries=100_000, disk=disk), disk


async def _check_files(files: list[Path], settings, cache,
                       progress: PlainProgress) -> dict[Path, tuple[list, bool]]:
    """Per file: its final findings and whether they came from the cache; `progress` counts the files done and
    names those compiling."""
    from kernel_lsp.compile.check import Document
    from kernel_lsp.compile.service import CompileService
    from kernel_lsp.findings import path_to_uri

    service = CompileService(cache)
    slots = asyncio.Semaphore(settings.compile.max_parallel)
    compiling: list[str] = []

    async def one(path: Path) -> tuple[list, bool]:
        async with slots:
            compiling.append(shown(path))
            progress.say(", ".join(compiling))
            try:
                text = path.read_bytes().decode("utf-8", errors="replace")
                final, cached = [], False
                async for report in service.run(Document(path_to_uri(path), path, text), settings):
                    final, cached = report.findings, report.stage == "cache"
                return final, cached
            finally:
                compiling.remove(shown(path))
                progress.advance()
                progress.say(", ".join(compiling))

    results = await asyncio.gather(*(one(p) for p in files))
    return dict(zip(files, results))


def _summary(files: list[Path], results: dict[Path, tuple[list, bool]], disk) -> dict:
    from kernel_lsp.workspace.survey import compile_state, kernel_names, resources

    rows = []
    for path in files:
        findings, cached = results[path]
        state, errors, warnings = compile_state(findings)
        rows.append({"path": shown(path), "state": state, "errors": errors, "warnings": warnings,
                     "kernels": kernel_names(path), "resources": resources(findings), "cached": cached})
    return {"files": rows, "cache": str(disk.path) if disk is not None else None}
