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
from kernel_lsp.bench.candidates import find_candidates, pair_candidates, problem_name, verify_job, verify_options
from kernel_lsp.bench.metrics import VERDICTS, ProblemResult, bench_metrics
from kernel_lsp.bench.report import bench_json, html_report, text_report, write_json
from kernel_lsp.config import BASELINE_KINDS, VERIFY_DEVICES, Settings, pyproject_settings, resolve_settings
from kernel_lsp.verify.pairing import Pairing
from kernel_lsp.worker.protocol import Result

log = logging.getLogger(__name__)

EXIT_OK, EXIT_USAGE = 0, 2
OUT_FOLDER = ".kernel-lsp-bench"  # inside DIR by default; hidden, so the next run does not scan it


class BenchUsageError(Exception):
    """Bad options or an environment that cannot run the bench; the message says which."""


def add_bench_parser(sub: Any) -> None:
    bench = sub.add_parser("bench", help="verify every candidate in a folder: per-problem table, fast_p, geometric "
                           "means, bench.json and bench.html")
    bench.add_argument("folder", type=Path, metavar="DIR", help="folder of candidates (.py files defining ModelNew)")
    bench.add_argument("--kernelbench", action="append", type=Path, metavar="ROOT",
                       help="folder holding level<N>/ problems (repeatable; default: the kernelbenchRoots setting)")
    bench.add_argument("--device", choices=VERIFY_DEVICES, help="default: the verifyDevice setting")
    bench.add_argument("--trials", type=int, help="correctness trials per candidate (default: the trials setting)")
    bench.add_argument("--calls", type=int, help="timed calls per candidate (default: the timedCalls setting)")
    bench.add_argument("--baselines", help="comma-separated, from eager,compile; '' for none (default: the setting)")
    bench.add_argument("--out", type=Path, help=f"where bench.json and bench.html go (default: DIR/{OUT_FOLDER})")
    bench.add_argument("--worker", metavar="ADDRESS",
                       help="unix:PATH or tcp:HOST:PORT (default: the worker setting, else a local worker)")
    bench.add_argument("--token-file", help="token for --worker (else workerTokenFile, else $KERNEL_LSP_TOKEN)")
    bench.add_argument("--format", choices=["text", "json"], default="text")


def run_bench(args: argparse.Namespace) -> int:
    try:
        return _bench(args)
    except BenchUsageError as exc:
        print(f"kernel-lsp bench: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _bench(args: argparse.Namespace) -> int:
    folder = args.folder
    if not folder.is_dir():
        raise BenchUsageError(f"not a folder: {folder}")
    workspace, settings = _settings(folder)
    pairs = _paired_candidates(folder, workspace, settings, _kernelbench_roots(args, workspace, settings))
    options = {**verify_options(settings), **_option_overrides(args)}
    started, start = datetime.now(UTC), time.monotonic()
    results = asyncio.run(_verify_all(pairs, options, folder, settings, args))
    metrics = bench_metrics(results, options["baselines"])
    run = {"tool": f"kernel-lsp {__version__}", "folder": str(folder), "device": options["device"],
           "trials": options["trials"], "timed_calls": options["timedCalls"], "baselines": options["baselines"],
           "worker": args.worker or settings.worker or "local", "started_at": started.isoformat(timespec="seconds"),
           "duration_s": round(time.monotonic() - start, 1)}
    written = _write_reports(args.out or folder / OUT_FOLDER, results, metrics, run)
    _print_outcome(args.format, results, metrics, run, written)
    if all(r.verdict == "unavailable" for r in results):
        print(f"kernel-lsp bench: nothing could be verified: {results[0].reason}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _settings(folder: Path) -> tuple[Path | None, Settings]:
    """The nearest pyproject.toml above DIR gives the workspace and its [tool.kernel-lsp] settings."""
    workspace = next((f for f in (folder.resolve(), *folder.resolve().parents) if (f / "pyproject.toml").is_file()),
                     None)
    layer, problems = pyproject_settings(workspace) if workspace else ({}, [])
    settings, more = resolve_settings(layer)
    for problem in problems + more:
        print(f"kernel-lsp bench: warning: {problem}", file=sys.stderr)
    return workspace, settings


def _kernelbench_roots(args: argparse.Namespace, workspace: Path | None, settings: Settings) -> list[Path]:
    if args.kernelbench:
        missing = [str(r) for r in args.kernelbench if not r.is_dir()]
        if missing:
            raise BenchUsageError(f"--kernelbench: not a folder: {', '.join(missing)}")
        return list(args.kernelbench)
    base = workspace or Path.cwd()
    return [base / Path(root).expanduser() for root in settings.kernelbench_roots]  # an absolute root stays absolute


def _paired_candidates(folder: Path, workspace: Path | None, settings: Settings, roots: list[Path]) -> list[Pairing]:
    candidates = find_candidates(folder)
    if not candidates:
        raise BenchUsageError(f"no candidates in {folder} (no .py file there defines ModelNew)")
    pairs, unpaired = pair_candidates(candidates, workspace, settings, roots)
    for skipped in unpaired:
        print(f"kernel-lsp bench: skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    if not pairs:
        raise BenchUsageError(f"none of the {len(candidates)} candidates has a reference: pass --kernelbench ROOT "
                              "(a folder of level<N>/ problems), set kernelbenchRoots or references in "
                              "[tool.kernel-lsp], or name one with a '# kernel-lsp: reference=PATH' line")
    return pairs


def _option_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if args.device:
        overrides["device"] = args.device
    for name, key in (("trials", "trials"), ("calls", "timedCalls")):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise BenchUsageError(f"--{name} must be at least 1, got {value}")
        if value is not None:
            overrides[key] = value
    if args.baselines is not None:
        baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
        if not set(baselines) <= set(BASELINE_KINDS):
            raise BenchUsageError(f"--baselines takes {','.join(BASELINE_KINDS)} (or ''), got {args.baselines!r}")
        overrides["baselines"] = baselines
    return overrides


async def _verify_all(pairs: list[Pairing], options: dict[str, Any], folder: Path, settings: Settings,
                      args: argparse.Namespace) -> list[ProblemResult]:
    """One job at a time: candidates timed while another runs would slow each other down."""
    from kernel_lsp.worker.client import WorkerClient, WorkerUnavailable
    from kernel_lsp.worker.daemon import UsageError, read_token

    try:
        token = read_token(args.token_file or settings.worker_token_file or None)
    except (UsageError, OSError) as exc:
        raise BenchUsageError(f"worker token: {exc}") from exc
    client = WorkerClient(address=args.worker if args.worker is not None else settings.worker, token=token,
                          max_frame=settings.max_frame_mib * 2**20, job_timeout_s=settings.job_timeout_s)
    results = []
    try:
        for number, pairing in enumerate(pairs, 1):
            shown = _shown(pairing.candidate, folder)
            print(f"[{number}/{len(pairs)}] {shown}: verifying against {pairing.reference}", file=sys.stderr)
            start = time.monotonic()
            job = verify_job(pairing.candidate, pairing.reference, options)
            result = await client.run(job, progress=lambda message, _, shown=shown: log.info("%s: %s", shown, message))
            results.append(problem_result(pairing, result, shown))
            print(f"[{number}/{len(pairs)}] {shown}: {_one_line(results[-1])} ({time.monotonic() - start:.1f} s)",
                  file=sys.stderr)
    except WorkerUnavailable as exc:
        raise BenchUsageError(str(exc)) from exc
    finally:
        await client.close()
    return results


def problem_result(pairing: Pairing, result: Result, shown: str) -> ProblemResult:
    """A worker's answer to one "verify" job as a row of the bench; a job that did not end 'ok' is unavailable."""
    metrics = result.metrics if result.status == "ok" else {}
    report = metrics.get("report") or {}
    verdict = metrics.get("verdict") if metrics.get("verdict") in VERDICTS else "unavailable"
    name = problem_name(pairing)
    return ProblemResult(
        candidate=shown, reference=str(pairing.reference), level=name.level, problem_id=name.problem_id,
        name=name.name, verdict=verdict, device=report.get("device"), speedup=dict(report.get("speedup") or {}),
        candidate_ms=((report.get("timing") or {}).get("candidate") or {}).get("median_ms"),
        reason=None if verdict == "verified" else _reason(result), summary=metrics.get("summary"),
        report=report or None, findings=list(result.findings))


def _reason(result: Result) -> str:
    if result.status != "ok":
        return f"job {result.status}: {result.error or 'no message'}"
    errors = [f for f in result.findings if f.get("severity") == 1] or result.findings
    if errors:
        message = " ".join(str(errors[0].get("message", "")).split())  # one line for the table
        return f"{errors[0].get('code')}: {message}"
    return result.error or result.metrics.get("summary") or "no reason given"


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
        raise BenchUsageError(f"cannot write the reports to {out}: {exc}") from exc
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
