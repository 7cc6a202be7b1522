"""kernel-lsp command line: serve (the language server) and check (compile diagnostics in a terminal)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from kernel_lsp import __version__
from kernel_lsp.command_line import print_findings, shown

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
CHECKED_SUFFIXES = (".cu", ".cuh", ".py")
# findings that mean the environment is wrong rather than the code: exit status 2
ENVIRONMENT_CODES = {"nvcc-missing", "host-compiler-missing", "torch-missing"}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_level, getattr(args, "log_file", None))
    if args.command == "serve":
        return _serve(args)
    if args.command == "check":
        return _check(args)
    if args.command == "worker":
        return _worker(args)
    if args.command == "doctor":
        from kernel_lsp.doctor import run_doctor

        return run_doctor(args.worker, args.token_file)
    if args.command == "verify":
        from kernel_lsp.bench.verify_command import run_verify

        return run_verify(args)
    if args.command == "bench":
        from kernel_lsp.bench.command import run_bench

        return run_bench(args)
    if args.command == "profile":
        from kernel_lsp.profile.command import run_profile

        return run_profile(args)
    if args.command == "optimize":
        from kernel_lsp.agent.command import run_optimize

        return run_optimize(args)
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernel-lsp", description="Language server and checks for GPU kernels.")
    parser.add_argument("--version", action="version", version=f"kernel-lsp {__version__}")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the language server (stdio by default)")
    serve.add_argument("--tcp", metavar="HOST:PORT", help="listen on TCP instead of stdio")
    serve.add_argument("--log-file", help="write logs to this file instead of stderr")
    check = sub.add_parser("check", help="compile-check files or directories, compiler-style output")
    check.add_argument("paths", nargs="+", type=Path)
    check.add_argument("--format", choices=["text", "json"], default="text")
    check.add_argument("--arch", action="append", help="target architecture, e.g. sm_90 (repeatable)")
    check.add_argument("--nvcc", help="path to nvcc")
    check.add_argument("--summary", action="store_true",
                       help="after the findings, one line per file: compile state, kernels, registers")
    check.add_argument("--no-cache", action="store_true",
                       help="neither read nor write the on-disk results (default: the persistentCache setting)")
    check.add_argument("--config", type=Path, help="pyproject.toml to read [tool.kernel-lsp] from "
                       "(default: the nearest one above the current directory)")
    worker = sub.add_parser("worker", help="run a GPU worker (the server starts one itself; use --listen on a GPU "
                            "server)")
    where = worker.add_mutually_exclusive_group()
    where.add_argument("--stdio", action="store_true", help="serve one client on stdin/stdout (the default)")
    where.add_argument("--listen", metavar="unix:PATH|tcp:HOST:PORT", help="listen for clients")
    worker.add_argument("--token-file", help="file holding the token clients must present (else $KERNEL_LSP_TOKEN)")
    worker.add_argument("--max-frame-mib", type=int, default=64, help="largest message accepted (MiB)")
    doctor = sub.add_parser("doctor", help="what works and what is missing on this machine")
    doctor.add_argument("--worker", default="", metavar="ADDRESS",
                        help="check a running worker (unix:PATH or tcp:HOST:PORT) instead of starting a local one")
    doctor.add_argument("--token-file", help="token for --worker (else $KERNEL_LSP_TOKEN)")
    from kernel_lsp.bench.command import add_bench_parser
    from kernel_lsp.bench.verify_command import add_verify_parser

    from kernel_lsp.profile.command import add_profile_parser
    from kernel_lsp.agent.command import add_optimize_parser

    add_verify_parser(sub)
    add_bench_parser(sub)
    add_profile_parser(sub)
    add_optimize_parser(sub)
    return parser


def _worker(args: argparse.Namespace) -> int:
    from kernel_lsp.worker.daemon import UsageError, WorkerDaemon, parse_listen, read_token, run_listener, run_stdio

    try:
        token = read_token(args.token_file)
        if args.listen:
            parse_listen(args.listen, token)  # refuse a bad address before anything starts
    except (UsageError, OSError) as exc:
        print(f"kernel-lsp worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    daemon = WorkerDaemon(token=token, max_frame=args.max_frame_mib * 2**20, single_client=not args.listen)
    if args.listen:
        asyncio.run(run_listener(daemon, args.listen))
        return EXIT_OK
    protocol_out = _private_stdout()
    asyncio.run(run_stdio(daemon, sys.stdin, protocol_out))
    return EXIT_OK


def _private_stdout():
    """A private handle on stdout for a protocol; fd 1 itself then goes to stderr, so stray prints
    (ours, a library's, a child's) cannot corrupt the channel."""
    private = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return private


def _setup_logging(level: str, log_file: str | None) -> None:
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    logging.basicConfig(level=level, handlers=[handler], format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    logging.getLogger("pygls").setLevel(max(logging.WARNING, logging.getLevelName(level)))  # it logs every message


def _serve(args: argparse.Namespace) -> int:
    from kernel_lsp.server.setup import create_server

    server = create_server()
    if args.tcp:
        host, _, port = args.tcp.rpartition(":")
        if not host or not port.isdigit():
            print(f"kernel-lsp: --tcp expects HOST:PORT, got {args.tcp!r}", file=sys.stderr)
            return EXIT_USAGE
        server.start_tcp(host, int(port))
        return EXIT_OK
    server.start_io(sys.stdin.buffer, _private_stdout())
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    from kernel_lsp.config import pyproject_settings, resolve_settings

    missing = [p for p in args.paths if not p.exists()]
    if missing:
        print(f"kernel-lsp: no such file or directory: {', '.join(map(str, missing))}", file=sys.stderr)
        return EXIT_USAGE
    config = args.config or _nearest_pyproject(Path.cwd())
    layer, problems = pyproject_settings(config.parent) if config else ({}, [])
    overrides = {k: v for k, v in (("arch", args.arch), ("nvccPath", args.nvcc)) if v}
    settings, more = resolve_settings(layer, overrides)
    for problem in problems + more:
        print(f"kernel-lsp: warning: {problem}", file=sys.stderr)
    files = _targets(args.paths, settings)
    project = config.parent if config else Path.cwd()
    cache, disk = _result_cache(settings, project, enabled=not args.no_cache)
    results = asyncio.run(_check_files(files, settings, cache))
    if disk is not None:
        disk.flush()
    findings = [f for path in files for f in results[path][0]]
    print_findings(findings, args.format, _summary(files, results, disk) if args.summary else None)
    if any(f.code in ENVIRONMENT_CODES for f in findings):
        return EXIT_USAGE
    return EXIT_FINDINGS if any(f.severity == 1 for f in findings) else EXIT_OK


def _nearest_pyproject(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    return None


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
        scanned = survey([path], exclude_patterns(settings.workspace_exclude),
                         [Path(d) for d in settings.include_dirs])
        found.update(p for p in scanned.digests if p.suffix in CHECKED_SUFFIXES and scanned.checked_alone(p))
    return sorted(found)


def _result_cache(settings, project: Path, enabled: bool):
    """The results cache in front of the compiler: on disk (shared with a server opened on `project`) when the
    persistentCache setting and `enabled` allow it."""
    from kernel_lsp.jobs.cache import ResultCache
    from kernel_lsp.jobs.disk_cache import DiskCache
    from kernel_lsp.config import cache_dir
    from kernel_lsp.workspace.survey import results_file

    if not (enabled and settings.persistent_cache):
        return ResultCache(), None
    disk = DiskCache(results_file(cache_dir(), [project]))
    report = disk.load()
    if report.problem:
        print(f"kernel-lsp: warning: {report.problem}", file=sys.stderr)
    return ResultCache(max_entries=100_000, disk=disk), disk


async def _check_files(files: list[Path], settings, cache) -> dict[Path, tuple[list, bool]]:
    """Per file: its final findings and whether they came from the cache."""
    from kernel_lsp.compile.check import Document
    from kernel_lsp.compile.service import CompileService
    from kernel_lsp.findings import path_to_uri

    service = CompileService(cache)
    slots = asyncio.Semaphore(settings.max_parallel_compiles)

    async def one(path: Path) -> tuple[list, bool]:
        async with slots:
            text = path.read_bytes().decode("utf-8", errors="replace")
            final, cached = [], False
            async for report in service.run(Document(path_to_uri(path), path, text), settings):
                final, cached = report.findings, report.stage == "cache"
            return final, cached

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


if __name__ == "__main__":
    sys.exit(main())
