"""`kernel-lsp verify CANDIDATE`: one candidate's verdict through the worker, compiler-style or as JSON.

Exit 0 when verified correct, 1 when rejected (compile error, runtime error, mismatch or integrity), 2 for usage
or environment errors (no reference, no worker, no GPU for --device cuda, a reference that fails itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from kernel_lsp.bench.candidates import verify_job, verify_options
from kernel_lsp.bench.command import BenchUsageError, _kernelbench_roots, _option_overrides, _settings
from kernel_lsp.config import VERIFY_DEVICES, Settings
from kernel_lsp.findings import Finding
from kernel_lsp.verify.pairing import Pairing, ReferenceProblem, find_reference
from kernel_lsp.worker.protocol import Result

EXIT_VERIFIED, EXIT_REJECTED, EXIT_USAGE = 0, 1, 2


def add_verify_parser(sub: Any) -> None:
    verify = sub.add_parser("verify", help="verify one candidate against its reference: correctness, integrity "
                            "checks, timing against eager and torch.compile")
    verify.add_argument("candidate", type=Path, metavar="CANDIDATE", help="a .py file defining ModelNew")
    verify.add_argument("--reference", type=Path, metavar="REF",
                        help="the reference (default: found as in the README's 'What is checked against what')")
    verify.add_argument("--kernelbench", action="append", type=Path, metavar="ROOT",
                        help="folder holding level<N>/ problems (repeatable; default: the kernelbenchRoots setting)")
    verify.add_argument("--device", choices=VERIFY_DEVICES, help="default: the verifyDevice setting")
    verify.add_argument("--trials", type=int, help="correctness trials (default: the trials setting)")
    verify.add_argument("--calls", type=int, help="timed calls (default: the timedCalls setting)")
    verify.add_argument("--baselines", help="comma-separated, from eager,compile; '' for none (default: the setting)")
    verify.add_argument("--worker", metavar="ADDRESS",
                        help="unix:PATH or tcp:HOST:PORT (default: the worker setting, else a local worker)")
    verify.add_argument("--token-file", help="token for --worker (else workerTokenFile, else $KERNEL_LSP_TOKEN)")
    verify.add_argument("--format", choices=["text", "json"], default="text")


def run_verify(args: argparse.Namespace) -> int:
    try:
        return _verify(args)
    except BenchUsageError as exc:
        print(f"kernel-lsp verify: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _verify(args: argparse.Namespace) -> int:
    candidate = args.candidate
    if not candidate.is_file():
        raise BenchUsageError(f"not a file: {candidate}")
    workspace, settings = _settings(candidate.parent)
    pairing = _pairing(candidate, args, workspace, settings)
    options = {**verify_options(settings), **_option_overrides(args)}
    result = asyncio.run(_run_job(pairing, options, settings, args))
    verdict = result.metrics.get("verdict") if result.status == "ok" else "unavailable"
    summary = result.metrics.get("summary") or f"job {result.status}: {result.error or 'no message'}"
    findings = [Finding.from_dict(f) for f in result.findings]
    _print(args.format, pairing, verdict, summary, result, findings)
    return {"verified": EXIT_VERIFIED, "rejected": EXIT_REJECTED}.get(verdict, EXIT_USAGE)


def _pairing(candidate: Path, args: argparse.Namespace, workspace: Path | None, settings: Settings) -> Pairing:
    if args.reference is not None:
        if not args.reference.is_file():
            raise BenchUsageError(f"--reference: not a file: {args.reference}")
        return Pairing(candidate, args.reference, "command line", f"--reference {args.reference}")
    text = candidate.read_bytes().decode("utf-8", errors="replace")
    found = find_reference(candidate, text, workspace, settings.references,
                           _kernelbench_roots(args, workspace, settings))
    if isinstance(found, ReferenceProblem):
        raise BenchUsageError(f"{candidate}:{found.line + 1}: {found.message}")
    if found is None:
        raise BenchUsageError(f"no reference for {candidate}: pass --reference REF, add a '# kernel-lsp: "
                              "reference=PATH' line, define Model in the same file, or set references / "
                              "kernelbenchRoots in [tool.kernel-lsp]")
    return found


async def _run_job(pairing: Pairing, options: dict[str, Any], settings: Settings, args: argparse.Namespace) -> Result:
    from kernel_lsp.worker.client import WorkerClient, WorkerUnavailable
    from kernel_lsp.worker.daemon import UsageError, read_token

    try:
        token = read_token(args.token_file or settings.worker_token_file or None)
    except (UsageError, OSError) as exc:
        raise BenchUsageError(f"worker token: {exc}") from exc
    client = WorkerClient(address=args.worker if args.worker is not None else settings.worker, token=token,
                          max_frame=settings.max_frame_mib * 2**20, job_timeout_s=settings.job_timeout_s)
    print(f"kernel-lsp verify: {pairing.candidate} against {pairing.reference} ({pairing.how})", file=sys.stderr)
    try:
        return await client.run(verify_job(pairing.candidate, pairing.reference, options),
                                progress=lambda message, _: print(f"  {message}", file=sys.stderr))
    except WorkerUnavailable as exc:
        raise BenchUsageError(str(exc)) from exc
    finally:
        await client.close()


def _print(fmt: str, pairing: Pairing, verdict: str, summary: str, result: Result, findings: list[Finding]) -> None:
    if fmt == "json":
        print(json.dumps({"candidate": str(pairing.candidate), "reference": str(pairing.reference),
                          "verdict": verdict, "summary": summary, "report": result.metrics.get("report"),
                          "findings": result.findings, "status": result.status, "error": result.error}, indent=2))
        return
    from kernel_lsp.cli import _print_findings

    _print_findings(findings, "text")
    print(f"{pairing.candidate}: {summary}")
