"""What the commands share: options, settings, the worker client (verify, bench, profile), printing findings."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_lsp.config import BACKENDS, BASELINE_KINDS, VERIFY_DEVICES, Settings, pyproject_settings, resolve_settings

if TYPE_CHECKING:
    from kernel_lsp.worker.protocol import Job, Result
    from kernel_lsp.worker.backend import JobRunner


EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C


def private_stdout():
    """A private handle on stdout for a protocol (LSP, the worker's); fd 1 itself then goes to stderr, so stray
    prints (ours, a library's, a child's) cannot corrupt the channel."""
    private = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return private


class CommandUsageError(Exception):
    """Bad options or an environment the command cannot run in; the message says which (exit status 2)."""


def reports_usage_errors(command: str) -> Callable[[Callable[[argparse.Namespace], int]],
                                                   Callable[[argparse.Namespace], int]]:
    """A command's run function that turns a CommandUsageError into one line on stderr and exit status 2."""
    def wrap(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(run)
        def guarded(args: argparse.Namespace) -> int:
            try:
                return run(args)
            except CommandUsageError as exc:
                print(f"kernel-lsp {command}: {exc}", file=sys.stderr)
                return EXIT_USAGE
        return guarded
    return wrap


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worker", metavar="ADDRESS",
                        help="unix:PATH or tcp:HOST:PORT (default: the worker setting, else a local worker)")
    parser.add_argument("--token-file", help="token for --worker (else workerTokenFile, else $KERNEL_LSP_TOKEN)")
    parser.add_argument("--backend", choices=BACKENDS, help="where jobs run: one worker (local, the default) or a "
                        "pool of Ray actors (ray; needs pip install 'kernel-lsp[ray]'); default: the backend setting")
    parser.add_argument("--address", metavar="RAY_ADDRESS", help="with --backend ray: the cluster (auto, HOST:PORT, "
                        "ray://HOST:PORT); default: the rayAddress setting, else a Ray instance started here")
    parser.add_argument("--actors", type=int, metavar="N", help="with --backend ray: actors in the pool (default: "
                        "rayActors, else one per GPU, else 2)")
    parser.add_argument("--fresh-worker", action="store_true", help="a private local worker for this command "
                        "alone, stopped with it (default: the shared one a command left running, else one started "
                        "and left running until idle; KERNEL_LSP_REUSE_WORKER=0 for always private)")
    parser.add_argument("--format", choices=["text", "json"], default="text")


def add_verify_options(parser: argparse.ArgumentParser, each: str) -> None:
    """Options that override the verification settings; `each` says per what ('' or ' per candidate')."""
    parser.add_argument("--kernelbench", action="append", type=Path, metavar="ROOT",
                        help="folder holding level<N>/ problems (repeatable; default: the kernelbenchRoots setting)")
    parser.add_argument("--device", choices=VERIFY_DEVICES, help="default: the verifyDevice setting")
    parser.add_argument("--trials", type=int, help=f"correctness trials{each} (default: the trials setting)")
    parser.add_argument("--calls", type=int, help=f"timed calls{each} (default: the timedCalls setting)")
    parser.add_argument("--baselines", help="comma-separated, from eager,compile; '' for none (default: the setting)")


def nearest_pyproject(folder: Path) -> Path | None:
    """The pyproject.toml in `folder` or the nearest folder above it."""
    start = folder.resolve()
    return next((f / "pyproject.toml" for f in (start, *start.parents) if (f / "pyproject.toml").is_file()), None)


def nearest_settings(folder: Path, command: str) -> tuple[Path | None, Settings]:
    """The nearest pyproject.toml above `folder` gives the workspace and its [tool.kernel-lsp] settings; problems
    with them are warnings on stderr."""
    found = nearest_pyproject(folder)
    workspace = found.parent if found else None
    layer, problems = pyproject_settings(workspace) if workspace else ({}, [])
    settings, more = resolve_settings(layer)
    for problem in problems + more:
        print(f"kernel-lsp {command}: warning: {problem}", file=sys.stderr)
    return workspace, settings


def kernelbench_roots(args: argparse.Namespace, workspace: Path | None, settings: Settings) -> list[Path]:
    if args.kernelbench:
        missing = [str(r) for r in args.kernelbench if not r.is_dir()]
        if missing:
            raise CommandUsageError(f"--kernelbench: not a folder: {', '.join(missing)}")
        return list(args.kernelbench)
    return settings.kernelbench_paths(workspace or Path.cwd())


def verify_option_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """--device, --trials, --calls and --baselines as VerifyOptions fields, for kinds.verify.verify_options."""
    overrides: dict[str, Any] = {}
    if args.device:
        overrides["device"] = args.device
    for name, key in (("trials", "trials"), ("calls", "timed_calls")):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CommandUsageError(f"--{name} must be at least 1, got {value}")
        if value is not None:
            overrides[key] = value
    if args.baselines is not None:
        baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
        if not set(baselines) <= set(BASELINE_KINDS):
            raise CommandUsageError(f"--baselines takes {','.join(BASELINE_KINDS)} (or ''), got {args.baselines!r}")
        overrides["baselines"] = tuple(baselines)
    return overrides


def worker_client(args: argparse.Namespace, settings: Settings) -> JobRunner:
    """The runner of the jobs: --backend ray (or the backend setting) a pool of Ray actors at --address; else a
    client for --worker (else the worker setting), with its token; else the user's shared local worker, found or
    left running for the next command (worker/rendezvous.py), or with --fresh-worker (or KERNEL_LSP_REUSE_WORKER=0)
    a private one."""
    from kernel_lsp.worker.backend import make_runner
    from kernel_lsp.worker.daemon import UsageError, read_token
    from kernel_lsp.worker.rendezvous import reuse_wanted

    backend = getattr(args, "backend", None)
    if (backend or settings.worker.backend) == "ray" and args.worker:
        raise CommandUsageError("--worker names one worker; with --backend ray the jobs go to Ray actors "
                                "(--address names the cluster)")
    try:
        token = read_token(args.token_file or settings.worker.token_file or None)
    except (UsageError, OSError) as exc:
        raise CommandUsageError(f"worker token: {exc}") from exc
    actors = getattr(args, "actors", None)
    if actors is not None and actors < 1:
        raise CommandUsageError(f"--actors must be at least 1, got {actors}")
    return make_runner(settings, token=token, worker=args.worker, backend=backend,
                       ray_address=getattr(args, "address", None), ray_actors=actors,
                       device=getattr(args, "device", None), shared=reuse_wanted() and not args.fresh_worker)


async def run_one_job(client: JobRunner, job: Job, title: str, fmt: str) -> Result:
    """One job on the command's runner, its progress on stderr (under `title` on a live line at a terminal: the
    worker's start-up says nothing for a minute); an unreachable worker is a usage error (exit 2). The runner is
    closed after it."""
    from kernel_lsp.commands.progress import command_progress
    from kernel_lsp.worker.client import WorkerUnavailable

    try:
        with command_progress(title, fmt, status="waiting for the worker") as progress:
            return await client.run(job, progress=progress.note)
    except WorkerUnavailable as exc:
        raise CommandUsageError(str(exc)) from exc
    finally:
        await client.close()


def shown(path: Path) -> str:
    cwd = Path.cwd()
    return str(path.relative_to(cwd) if path.is_relative_to(cwd) else path)


def print_findings(findings: list, fmt: str, summary: dict | None = None) -> None:
    """Findings one per line (text: path:line:column: severity: message [code], a count on stderr) or as JSON;
    `kernel-lsp check --summary`'s table after them."""
    from kernel_lsp.findings import uri_to_path

    rows = [(shown(uri_to_path(f.uri)), f) for f in sorted(findings, key=lambda f: (f.uri, f.range.start, f.code))]
    if fmt == "json":
        out = [{"path": p, "line": f.range.start.line + 1, "column": f.range.start.character + 1,
                "endLine": f.range.end.line + 1, "endColumn": f.range.end.character + 1,
                "severity": f.severity.label, "code": f.code, "message": f.message, "source": f.source,
                "related": [r.message for r in f.related], "data": f.data} for p, f in rows]
        print(json.dumps(out if summary is None else {"findings": out, **summary}, indent=2))
        return
    for p, f in rows:
        print(f"{p}:{f.range.start.line + 1}:{f.range.start.character + 1}: {f.severity.label}: "
              f"{' '.join(f.message.split())} [{f.code}]")  # one line per finding
    errors = sum(1 for _, f in rows if f.severity == 1)
    print(f"{len(rows)} finding{'s' if len(rows) != 1 else ''}, {errors} error{'s' if errors != 1 else ''}",
          file=sys.stderr)
    if summary is not None:
        print_summary(summary)


def print_summary(summary: dict) -> None:
    """One line per file under a header; the counts and the cache last."""
    files = summary["files"]
    table = [("FILE", "STATE", "ERRORS", "WARNINGS", "KERNELS", "RESOURCES")]
    for row in files:
        kernels = ", ".join(row["kernels"][:4]) + (f" (+{len(row['kernels']) - 4})" if len(row["kernels"]) > 4 else "")
        first = " ".join(row["resources"][0].split()) if row["resources"] else ""
        table.append((row["path"], row["state"], str(row["errors"]), str(row["warnings"]), kernels or "-", first))
    widths = [max(len(line[i]) for line in table) for i in range(5)]
    print()
    for line in table:
        print("  ".join(cell.ljust(widths[i]) if i < 5 else cell for i, cell in enumerate(line)).rstrip())
    states = [row["state"] for row in files]
    cached = sum(1 for row in files if row["cached"])
    where = f" ({summary['cache']})" if summary["cache"] else " (cache off)"
    print(f"{len(files)} file{'s' if len(files) != 1 else ''}: {states.count('compiles')} compile cleanly, "
          f"{states.count('warnings')} with warnings, {states.count('errors')} with errors; "
          f"{cached} from the cache{where}")
