"""`kernel-lsp bench DIR`: one "verify" job per candidate through the worker, then the table, the metrics,
bench.json and bench.html. Exit 0 when the run completed (rejected candidates included), 2 for usage or
environment errors (no candidates, none paired, no worker, nothing could be verified)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernel_lsp import __version__
from kernel_lsp.bench.candidates import find_candidates, pair_candidates, problem_name
from kernel_lsp.bench.metrics import ProblemResult, bench_metrics
from kernel_lsp.bench.report import bench_json, html_report, text_report, write_json
from kernel_lsp.commands.shared import (
    EXIT_OK,
    EXIT_USAGE,
    CommandUsageError,
    add_verify_options,
    add_worker_options,
    reports_usage_errors,
    kernelbench_roots,
    nearest_settings,
    verify_option_overrides,
    worker_client,
)
from kernel_lsp.config import Settings
from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.options import VerifyOptions
from kernel_lsp.kinds.verify import VerifyOutcome, verify_job, verify_options
from kernel_lsp.verify.pairing import Pairing
from kernel_lsp.worker.protocol import Result

log = logging.getLogger(__name__)

OUT_FOLDER = ".kernel-lsp-bench"  # inside DIR by default; hidden, so the next run does not scan it


def add_parser(sub: Any) -> None:
    bench = sub.add_parser("bench", help="verify every candidate in a folder: per-problem table, fast_p, geometric "
                           "means, bench.json and bench.html")
    bench.add_argument("folder", type=Path, metavar="DIR", help="folder of candidates (.py files defining ModelNew)")
    add_verify_options(bench, " per candidate")
    bench.add_argument("--out", type=Path, help=f"where bench.json and bench.html go (default: DIR/{OUT_FOLDER})")
    add_worker_options(bench)
    bench.set_defaults(run=run)


@reports_usage_errors("bench")
def run(args: argparse.Namespace) -> int:
    folder = args.folder
    if not folder.is_dir():
        raise CommandUsageError(f"not a folder: {folder}")
    workspace, settings = nearest_settings(folder, "bench")
    pairs = _paired_candidates(folder, workspace, settings, kernelbench_roots(args, workspace, settings))
    options = verify_options(settings, unattended=True, **verify_option_overrides(args))
    started, start = datetime.now(UTC), time.monotonic()
    backend = args.backend or settings.worker.backend
    run = {"tool": f"kernel-lsp {__version__}", "folder": str(folder), "device": options.device,
           "trials": options.trials, "timed_calls": options.timed_calls, "baselines": list(options.baselines),
           "backend": backend, "worker": (f"ray:{args.address or settings.worker.ray_address or 'local'}"
                                          if backend == "ray" else args.worker or settings.worker.address or "local"),
           "started_at": started.isoformat(timespec="seconds")}
    results = asyncio.run(_verify_all(pairs, options, folder, settings, args, run))
    metrics = bench_metrics(results, list(options.baselines))
    run["duration_s"] = round(time.monotonic() - start, 1)
    written = _write_reports(args.out or folder / OUT_FOLDER, results, metrics, run)
    _print_outcome(args.format, results, metrics, run, written)
    if all(r.verdict == "unavailable" for r in results):
        print(f"kernel-lsp bench: nothing could be verified: {results[0].reason}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _paired_candidates(folder: Path, workspace: Path | None, settings: Settings, roots: list[Path]) -> list[Pairing]:
    candidates = find_candidates(folder)
    if not candidates:
        raise CommandUsageError(f"no candidates in {folder} (no .py file there defines ModelNew)")
    pairs, unpaired = pair_candidates(candidates, workspace, settings, roots)
    for skipped in unpaired:
        print(f"kernel-lsp bench: skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    if not pairs:
        raise CommandUsageError(f"none of the {len(candidates)} candidates has a reference: pass --kernelbench ROOT "
                              "(a folder of level<N>/ problems), set kernelbenchRoots or references in "
                              "[tool.kernel-lsp], or name one with a '# kernel-lsp: reference=PATH' line")
    return pairs


async def _verify_all(pairs: list[Pairing], options: VerifyOptions, folder: Path, settings: Settings,
                      args: argparse.Namespace, run: dict[str, Any]) -> list[ProblemResult]:
    """As many jobs at once as the backend has room for, each result printed as it comes: the local worker
    takes one at a time (candidates timed while another runs would slow each other down); the Ray backend one
    per actor (one per GPU, so timings never share a device)."""
    from kernel_lsp.worker.client import WorkerUnavailable

    client = worker_client(args, settings)
    results: list[ProblemResult | None] = [None] * len(pairs)
    done = 0

    async def one(number: int, pairing: Pairing, slots: asyncio.Semaphore) -> None:
        nonlocal done
        async with slots:
            shown = _shown(pairing.candidate, folder)
            print(f"[{number}/{len(pairs)}] {shown}: verifying against {pairing.reference}", file=sys.stderr)
            start = time.monotonic()
            job = verify_job(pairing.candidate, pairing.reference, options)
            result = await client.run(job, progress=lambda message, _, shown=shown: log.info("%s: %s", shown, message))
            results[number - 1] = problem_result(pairing, result, shown)
            done += 1
            print(f"[{number}/{len(pairs)}] {shown}: {_one_line(results[number - 1])} "
                  f"({time.monotonic() - start:.1f} s; {done} of {len(pairs)} done)", file=sys.stderr)

    try:
        await client.ping()  # starts the worker, or the Ray actors: then the capacity is known
        run["parallel"] = client.capacity
        run["workerDevice"] = client.status.gpu
        slots = asyncio.Semaphore(max(1, client.capacity))
        await asyncio.gather(*(one(number, pairing, slots) for number, pairing in enumerate(pairs, 1)))
    except WorkerUnavailable as exc:
        raise CommandUsageError(str(exc)) from exc
    finally:
        await client.close()
    return [r for r in results if r is not None]


def problem_result(pairing: Pairing, result: Result, shown: str) -> ProblemResult:
    """A worker's answer to one "verify" job as a row of the bench; a job that did not end 'ok' is unavailable."""
    outcome = VerifyOutcome.of(result, for_reward=True)
    report = outcome.report
    name = problem_name(pairing)
    timed = report.timing.candidate if report is not None and report.timing is not None else None
    return ProblemResult(
        candidate=shown, reference=str(pairing.reference), level=name.level, problem_id=name.problem_id,
        name=name.name, verdict=outcome.verdict, device=report.device if report else None,
        speedup=dict(report.speedup) if report else {},
        interval={kind: list(bounds) for kind, bounds in report.interval.items()} if report else {},
        candidate_ms=timed.median_ms if timed else None,
        reason=None if outcome.verdict == "verified" else outcome.reason(), summary=outcome.summary,
        report=encode(report) if report is not None else None, findings=list(result.findings))


def _one_line(result: ProblemResult) -> str:
    return f"{result.verdict}: {result.summary if result.verdict == 'verified' else result.reason}"


def _shown(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix() if path.is_relative_to(folder) else str(path)


def _write_reports(out: Path, results: list[ProblemResult], metrics: Any, run: dict[str, Any]) -> list[Path]:
    try:
        out.mkdir(parents=True, exist_ok=True)
        json_path, html_path = out / "bench.json", out / "bench.html"
        write_json(json_path, bench_json(results, metrics, run))
        html_path.write_text(html_report(results, metrics, run), encoding="utf-8")
    except OSError as exc:
        raise CommandUsageError(f"cannot write the reports to {out}: {exc}") from exc
    return [json_path, html_path]


def _print_outcome(fmt: str, results: list[ProblemResult], metrics: Any, run: dict[str, Any],
                   written: list[Path]) -> None:
    if fmt == "json":
        rows = [{k: v for k, v in r.to_dict().items() if k not in ("report", "findings")} for r in results]
        print(json.dumps({"run": run, "metrics": metrics.to_dict(), "problems": rows,
                          "reports": [str(p) for p in written]}, indent=2))
        return
    print(text_report(results, metrics))
    print(f"reports: {', '.join(map(str, written))}")
