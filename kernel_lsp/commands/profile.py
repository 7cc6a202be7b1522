"""`kernel-lsp profile FILE` and `kernel-lsp profile --import-csv FILE`: what limits each kernel, with numbers.

FILE.py runs the "profile" job through the worker (ncu on a GPU; the static ptxas + SASS profile without one);
FILE.cu is profiled statically here, no worker needed, unless it is a program with its own main(): the worker
builds, runs and profiles that live under ncu when it has a GPU (statically without one); --import-csv reads an `ncu --csv --page details` export
made elsewhere. Exit 0 on success, 2 for usage or environment errors (and when nothing could be profiled).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from kernel_lsp.compile.units import CUDA_SUFFIXES
from kernel_lsp.commands.shared import (
    EXIT_OK,
    EXIT_USAGE,
    CommandUsageError,
    add_worker_options,
    reports_usage_errors,
    nearest_settings,
    run_one_job,
    worker_client,
)
from kernel_lsp.config import Settings
from kernel_lsp.contracts.codec import Wire, encode
from kernel_lsp.contracts.profile_report import KernelProfile, ProfileProblem, ProfileReport, ReferenceKernel
from kernel_lsp.profile.program import has_main
from kernel_lsp.profile.report import (
    finding_severity,
    gain_text,
    imported_kernels,
    kernel_phrase,
    problem_messages,
    summary_line,
)

MESSAGE_CHARS = 300  # text output keeps each hint to a few lines; --format json has it whole
NAME_CHARS = 100
TOP_NCU_HINTS = 5  # ncu's rules shown per kernel in text, the largest gains; our own hint-* rules always show


def add_parser(sub: Any) -> None:
    profile = sub.add_parser("profile", help="profile a candidate's kernels (ncu through the worker; ptxas + SASS "
                             "without a GPU) or read an ncu CSV export: bound, time, hints with estimated gains")
    profile.add_argument("file", type=Path, nargs="?", metavar="FILE",
                         help="a .py candidate (ModelNew; load_inline or Triton) or a .cu file (static profile)")
    profile.add_argument("--import-csv", type=Path, metavar="CSV",
                         help="an `ncu --csv --page details` export: the hints for every kernel in it")
    profile.add_argument("--raw-csv", type=Path, metavar="CSV",
                         help="with --import-csv: the same report's `--page raw` export (local-memory counters, "
                              "theoretical roofline ceilings)")
    profile.add_argument("--reference", type=Path, metavar="REF",
                         help="the problem (Model, get_inputs) for a .py candidate (default: found as verify finds it; "
                              "optional when the candidate defines get_inputs)")
    profile.add_argument("--kernel", action="append", metavar="NAME", help="only this kernel (repeatable)")
    add_worker_options(profile)
    profile.set_defaults(run=run)


@reports_usage_errors("profile")
def run(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.import_csv is None):
        raise CommandUsageError("give either FILE or --import-csv CSV")
    if args.import_csv is not None:
        return _import_csv(args)
    if not args.file.is_file():
        raise CommandUsageError(f"not a file: {args.file}")
    if args.file.suffix in CUDA_SUFFIXES and not has_main(_read(args.file, "FILE")):
        report = asyncio.run(_static_cuda_report(args.file, args.kernel or ()))
    elif args.file.suffix in CUDA_SUFFIXES:  # a program: built, run and profiled live by a GPU worker
        report = asyncio.run(_worker_report(args, program=True))
    elif args.file.suffix == ".py":
        report = asyncio.run(_worker_report(args))
    else:
        raise CommandUsageError(f"{args.file}: expected a .py candidate or a .cu file")
    _print_report(args.format, args.file, report)
    return EXIT_OK if report.kernels else EXIT_USAGE


# --- --import-csv ---------------------------------------------------------------------------------------

def _import_csv(args: argparse.Namespace) -> int:
    details = _read(args.import_csv, "--import-csv")
    raw = _read(args.raw_csv, "--raw-csv") if args.raw_csv is not None else None
    kernels = imported_kernels(details, raw)
    if not kernels:
        raise CommandUsageError(f"{args.import_csv}: no kernel launches found; expected the output of "
                                "`ncu --import REPORT --csv --page details`")
    if args.kernel:
        kernels = [k for k in kernels if k.kernel in args.kernel]
    if args.format == "json":
        print(json.dumps(with_diagnostic_severity(kernels), indent=2))
    else:
        print("\n".join(line for kernel in kernels for line in kernel_lines(kernel)))
    return EXIT_OK


def _read(path: Path, option: str) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise CommandUsageError(f"{option}: cannot read {path}: {exc.strerror or exc}") from exc


# --- FILE -----------------------------------------------------------------------------------------------

async def _static_cuda_report(path: Path, kernels: tuple[str, ...] | list[str]) -> ProfileReport:
    from kernel_lsp.profile.static import static_profile

    return await static_profile({path.name: _read(path, "FILE")}, path.name, {path.name: str(path.resolve())},
                                kernels, nearest_settings(path.parent, "profile")[1])


async def _worker_report(args: argparse.Namespace, program: bool = False) -> ProfileReport:
    from kernel_lsp.kinds.profile import ProfileOutcome, profile_job, profile_options
    settings = nearest_settings(args.file.parent, "profile")[1]
    reference = None if program else reference_for(args, settings)
    client = worker_client(args, settings)
    job = profile_job(args.file, reference,
                      profile_options(settings, **({"kernels": tuple(args.kernel)} if args.kernel else {})))
    print(f"kernel-lsp profile: {args.file}" + (f" with reference {reference}" if reference else ""), file=sys.stderr)
    outcome = ProfileOutcome.of(await run_one_job(client, job, f"kernel-lsp profile: {args.file.name}", args.format))
    if outcome.report is None:
        raise CommandUsageError(outcome.summary)
    failures = [ProfileProblem(f.code, f.message) for f in outcome.findings if f.code.startswith("run-")]
    return dataclasses.replace(outcome.report, problems=[*failures, *outcome.report.problems])


def reference_for(args: argparse.Namespace, settings: Settings) -> Path | None:
    """--reference, else the reference verify would use, else None (the candidate must define get_inputs)."""
    from kernel_lsp.verify.pairing import Pairing, find_reference

    if args.reference is not None:
        if not args.reference.is_file():
            raise CommandUsageError(f"--reference: not a file: {args.reference}")
        return args.reference
    text = _read(args.file, "FILE")
    workspace = next((f for f in (args.file.resolve().parent, *args.file.resolve().parents)
                      if (f / "pyproject.toml").is_file()), None)
    roots = [(workspace or Path.cwd()) / Path(root).expanduser() for root in settings.verify.kernelbench_roots]
    found = find_reference(args.file, text, workspace, settings.verify.references, roots)
    if isinstance(found, Pairing) and found.reference.resolve() != args.file.resolve():
        return found.reference
    return None


# --- output ---------------------------------------------------------------------------------------------

def _print_report(fmt: str, file: Path, report: ProfileReport) -> None:
    if fmt == "json":
        kernels = with_diagnostic_severity(report.kernels)
        print(json.dumps({"file": str(file), "summary": summary_line(report), **encode(report), "kernels": kernels},
                         indent=2))
        return
    lines = [f"{file}: {summary_line(report)}"]
    for kernel in report.kernels:
        lines += kernel_lines(kernel)
    lines += reference_lines(report.reference_kernels)
    lines += [f"problem: {problem}" for problem in problem_messages(report)]
    print("\n".join(lines))


def with_diagnostic_severity(kernels: list[KernelProfile]) -> list[Wire]:
    """The kernels as the wire has them, each finding with its `diagnostic_severity`: the severity the editor shows
    it with (the rule's own `severity`, a warning for ncu, stays: hints are advice, never warnings or errors in the
    editor)."""
    return [{**encode(kernel), "findings": [{**encode(f), "diagnostic_severity": finding_severity(f).label}
                                            for f in kernel.findings]} for kernel in kernels]


def kernel_lines(kernel: KernelProfile) -> list[str]:
    """The kernel's headline (bound, time, registers, occupancy), then its hints, the largest gains first."""
    facts = [kernel_phrase(kernel)]
    if kernel.registers is not None:
        facts.append(f"{kernel.registers} registers")
    ptxas = kernel.metrics.ptxas
    if ptxas is not None and (ptxas.spill_stores or ptxas.spill_loads):
        facts.append(f"{ptxas.spill_stores}/{ptxas.spill_loads} B spill stores/loads")
    if ptxas is not None and ptxas.shared_bytes:
        facts.append(f"{ptxas.shared_bytes} B static shared memory")
    if kernel.occupancy_pct is not None:
        facts.append(f"occupancy {kernel.occupancy_pct:.1f}%")
    if kernel.energy_mj_per_call is not None:
        facts.append(f"{kernel.energy_mj_per_call:.3g} mJ per forward call")
    lines = ["", f"{kernel.name[:NAME_CHARS]}", "  " + ", ".join(facts)]
    ranked = sorted(kernel.findings, key=lambda f: -(f.estimated_speedup or 0.0))
    ncu_rules = [f for f in ranked if f.code.startswith("ncu-")]
    shown = [f for f in ranked if f in ncu_rules[:TOP_NCU_HINTS] or not f.code.startswith("ncu-")]
    for finding in shown:
        where = f"line {finding.line}: " if finding.line else ""
        message = " ".join(finding.message.split())
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS - 3] + "..."
        severity = finding_severity(finding).label  # as the editor shows it
        lines.append(f"  {severity:<11} {finding.code}{gain_text(finding)}: {where}{message}")
    if len(shown) < len(ranked):
        lines.append(f"  ({len(ranked) - len(shown)} more ncu rule result(s) with smaller gains: --format json)")
    return lines


def reference_lines(kernels: list[ReferenceKernel]) -> list[str]:
    if not kernels:
        return []
    lines = ["", "reference forward (PyTorch kernels the candidate replaces), per call:"]
    lines += [f"  {k.device_ms:9.4f} ms  x{k.calls:<3} {k.name[:NAME_CHARS]}" for k in kernels]
    return lines
