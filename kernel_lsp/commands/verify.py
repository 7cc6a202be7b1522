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

from kernel_lsp.commands.shared import (
    CommandUsageError,
    add_verify_options,
    add_worker_options,
    reports_usage_errors,
    kernelbench_roots,
    nearest_settings,
    print_findings,
    run_one_job,
    verify_option_overrides,
    worker_client,
)
from kernel_lsp.config import Settings
from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.options import VerifyOptions
from kernel_lsp.kinds.verify import VerifyOutcome, verify_job, verify_options
from kernel_lsp.verify.pairing import Pairing, ReferenceProblem, find_reference, is_reference
from kernel_lsp.worker.protocol import Result

EXIT_VERIFIED, EXIT_REJECTED, EXIT_USAGE = 0, 1, 2


def add_parser(sub: Any) -> None:
    verify = sub.add_parser("verify", help="verify one candidate against its reference: correctness, integrity "
                            "checks, timing against eager and torch.compile")
    verify.add_argument("candidate", type=Path, metavar="CANDIDATE", help="a .py file defining ModelNew")
    verify.add_argument("--reference", type=Path, metavar="REF",
                        help="the reference (default: found as in the README's 'What is checked against what')")
    add_verify_options(verify, "")
    add_worker_options(verify)
    verify.set_defaults(run=run)


@reports_usage_errors("verify")
def run(args: argparse.Namespace) -> int:
    candidate = args.candidate
    if not candidate.is_file():
        raise CommandUsageError(f"not a file: {candidate}")
    workspace, settings = nearest_settings(candidate.parent, "verify")
    pairing = _pairing(candidate, args, workspace, settings)
    options = verify_options(settings, **verify_option_overrides(args))
    result = asyncio.run(_run_job(pairing, options, settings, args))
    outcome = VerifyOutcome.of(result)
    _print(args.format, pairing, outcome, result)
    return {"verified": EXIT_VERIFIED, "rejected": EXIT_REJECTED}.get(outcome.verdict, EXIT_USAGE)


def _pairing(candidate: Path, args: argparse.Namespace, workspace: Path | None, settings: Settings) -> Pairing:
    if args.reference is not None:
        if not args.reference.is_file():
            raise CommandUsageError(f"--reference: not a file: {args.reference}")
        return Pairing(candidate, args.reference, "command line", f"--reference {args.reference}")
    text = candidate.read_bytes().decode("utf-8", errors="replace")
    found = find_reference(candidate, text, workspace, settings.verify.references,
                           kernelbench_roots(args, workspace, settings))
    if isinstance(found, ReferenceProblem):
        raise CommandUsageError(f"{candidate}:{found.line + 1}: {found.message}")
    if found is None and is_reference(candidate, text):
        raise CommandUsageError(f"{candidate} is a reference (Model, and no ModelNew to verify): verify the candidate "
                                f"that defines ModelNew against it (kernel-lsp verify CANDIDATE --reference "
                                f"{candidate}), or have kernel-lsp optimize {candidate} write one")
    if found is None:
        raise CommandUsageError(f"no reference for {candidate}: pass --reference REF, add a '# kernel-lsp: "
                              "reference=PATH' line, define Model in the same file, or set references / "
                              "kernelbenchRoots in [tool.kernel-lsp]")
    return found


async def _run_job(pairing: Pairing, options: VerifyOptions, settings: Settings, args: argparse.Namespace) -> Result:
    client = worker_client(args, settings)
    print(f"kernel-lsp verify: {pairing.candidate} against {pairing.reference} ({pairing.how})", file=sys.stderr)
    return await run_one_job(client, verify_job(pairing.candidate, pairing.reference, options),
                             f"kernel-lsp verify: {pairing.candidate.name}", args.format)


def _print(fmt: str, pairing: Pairing, outcome: VerifyOutcome, result: Result) -> None:
    if fmt == "json":
        print(json.dumps({"candidate": str(pairing.candidate), "reference": str(pairing.reference),
                          "verdict": outcome.verdict, "summary": outcome.summary,
                          "report": encode(outcome.report) if outcome.report is not None else None,
                          "findings": result.findings, "status": result.status, "error": result.error}, indent=2))
        return
    print_findings(outcome.findings, "text")
    print(f"{pairing.candidate}: {outcome.summary}")
