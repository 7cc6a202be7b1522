"""`kernel-lsp sanitize FILE`: a candidate under compute-sanitizer (memcheck, racecheck, initcheck, synccheck)
through the worker, its errors on the source lines of the accesses.

FILE.py is a candidate (ModelNew; its reference found as `verify` finds it, or --reference; or one file that
defines get_inputs); FILE.cu with a main() is a standalone program, built with nvcc and run by the worker. Exit 0:
clean (every tool ran to its end and found nothing in the candidate's code); 1: errors found; 2: usage or
environment (no GPU, no compute-sanitizer, a candidate that does not build, a tool that did not finish).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from kernel_lsp.commands.shared import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    CommandUsageError,
    add_worker_options,
    nearest_settings,
    print_findings,
    run_one_job,
    reports_usage_errors,
    worker_client,
)
from kernel_lsp.contracts.codec import encode
from kernel_lsp.profile.sanitize import CHECKS, NO_GPU, NO_GPU_CODE

NO_GPU_HERE = f"{NO_GPU}: run it where an NVIDIA GPU is, or pass --worker tcp:HOST:PORT (a GPU worker)"


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("sanitize", help="check a candidate's memory safety with compute-sanitizer through the "
                            "worker (memcheck, racecheck, initcheck, synccheck), and kernel-lsp's shared-memory check "
                            "(shared-init): errors on the lines of the accesses")
    parser.add_argument("file", type=Path, metavar="FILE",
                        help="a .py candidate (ModelNew) or a standalone .cu program with main()")
    parser.add_argument("--tool", action="append", choices=CHECKS, metavar="TOOL",
                        help=f"one of {', '.join(CHECKS)} (repeatable; default: the sanitizeTools setting, all five)")
    parser.add_argument("--reference", type=Path, metavar="REF",
                        help="the problem (Model, get_inputs) for a .py candidate (default: found as verify finds it)")
    parser.add_argument("--timeout-s", type=float, metavar="S",
                        help="wall time per tool (default: the sanitizeTimeoutS setting)")
    add_worker_options(parser)
    parser.set_defaults(run=run)


@reports_usage_errors("sanitize")
def run(args: argparse.Namespace) -> int:
    if not args.file.is_file():
        raise CommandUsageError(f"not a file: {args.file}")
    if args.file.suffix not in (".py", ".cu"):
        raise CommandUsageError(f"{args.file}: expected a .py candidate or a .cu program")
    outcome = asyncio.run(_sanitize(args))
    report = outcome.report
    error = NO_GPU_HERE if outcome.code == NO_GPU_CODE else outcome.error  # the remedy a terminal has
    if args.format == "json":
        print(json.dumps({"file": str(args.file), "summary": outcome.summary, "clean": outcome.clean,
                          "error": error, **(encode(report) if report else {}),
                          "findings": [f.to_dict() for f in outcome.findings]}, indent=2))
    else:
        print_findings(outcome.findings, "text")
        for problem in [*report.problems, *(run.problem for run in report.tools if run.problem)] if report else []:
            print(f"problem: {problem.message}")
        print(f"{args.file}: {error if outcome.code == NO_GPU_CODE else (outcome.summary or error)}")
    if outcome.user_errors:
        return EXIT_FINDINGS
    if error is not None or not outcome.clean:
        print(f"kernel-lsp sanitize: not proven clean: {error or outcome.summary}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


async def _sanitize(args: argparse.Namespace) -> Any:
    from kernel_lsp.commands.profile import reference_for
    from kernel_lsp.kinds.sanitize import SanitizeOutcome, client_timeout_s, sanitize_job, sanitize_options

    settings = nearest_settings(args.file.parent, "sanitize")[1]
    overrides: dict[str, Any] = {}
    if args.tool:
        overrides["tools"] = tuple(dict.fromkeys(args.tool))
    if args.timeout_s is not None:
        if not args.timeout_s > 0:
            raise CommandUsageError("--timeout-s: must be more than 0")
        overrides["timeout_s"] = args.timeout_s
    reference = reference_for(args, settings) if args.file.suffix == ".py" else None
    options = sanitize_options(settings, **overrides)
    job = sanitize_job(args.file, reference, options)
    client = worker_client(args, settings.replaced(job_timeout_s=client_timeout_s(options, settings)))
    print(f"kernel-lsp sanitize: {args.file}" + (f" with reference {reference}" if reference else ""),
          file=sys.stderr)
    return SanitizeOutcome.of(await run_one_job(client, job, f"kernel-lsp sanitize: {args.file.name}", args.format))
