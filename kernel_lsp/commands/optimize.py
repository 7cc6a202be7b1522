"""`kernel-lsp optimize FILE`: one agent pass from a terminal, and `--replay TRAJECTORY` to re-verify a recorded one.

Exit 0 when a verified improvement was found (kernel_lsp.agent.loop: faster than the original candidate's verified
time by more than its margin; when the original does not verify or the file has no ModelNew, faster than PyTorch
eager), 1 when none was, 2 for usage or environment errors: no API key (the message names ANTHROPIC_API_KEY), a key
the API refuses, a model API that stays unavailable, no worker, no reference; 130 after Ctrl-C (the pass's outcome
so far printed first, its best candidate written).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.credentials import API_KEY_ENV, api_key
from kernel_lsp.agent.setup import UnpricedModel, build_optimizer, settings_budget
from kernel_lsp.commands.shared import (
    CommandUsageError,
    add_verify_options,
    add_worker_options,
    kernelbench_roots,
    nearest_settings,
    reports_usage_errors,
    verify_option_overrides,
    worker_client,
)
from kernel_lsp.config import AGENT_TARGETS, Settings
from kernel_lsp.contracts.options import VerifyOptions
from kernel_lsp.kinds.verify import verify_options
from kernel_lsp.sources import parse_python
from kernel_lsp.verify.pairing import Pairing, ReferenceProblem, find_reference

if TYPE_CHECKING:  # the anthropic SDK takes ~2 s to import: only `optimize` itself pays for it
    from kernel_lsp.agent.loop import Optimizer, PassOutcome, ProgressEvent

EXIT_IMPROVED, EXIT_NONE, EXIT_USAGE = 0, 1, 2


def add_parser(sub: Any) -> None:
    optimize = sub.add_parser("optimize", help="improve a kernel with Claude in a verified generate-test-refine "
                              "loop; the best verified candidate is written beside FILE as NAME.kernel-lsp-best.py")
    optimize.add_argument("file", type=Path, metavar="FILE", help="a .py defining ModelNew (or only Model: the "
                          "agent writes the first ModelNew)")
    optimize.add_argument("--reference", type=Path, metavar="REF",
                          help="the reference (default: found as `kernel-lsp verify` finds it)")
    add_pass_options(optimize, "--max", "")
    optimize.add_argument("--replay", type=Path, metavar="TRAJECTORY",
                          help="re-verify the candidates of a recorded pass instead of running a new one")
    add_verify_options(optimize, " per candidate")
    add_worker_options(optimize)
    optimize.set_defaults(run=run)


BUDGET_OPTIONS = (("model-calls", int, "model calls"), ("tokens", int, "tokens, input and output together"),
                  ("dollars", float, "dollars"), ("wall-s", float, "wall seconds"),
                  ("evaluations", int, "worker evaluations (verify and profile jobs)"))


def add_pass_options(parser: Any, prefix: str, each: str) -> None:
    """A pass's budgets (PREFIX-model-calls, ...; `each` says per what), its model, objective and planning."""
    for option, kind, what in BUDGET_OPTIONS:
        parser.add_argument(f"{prefix}-{option}", type=kind, metavar="N", help=f"budget{each}: {what} (0: unlimited)")
    parser.add_argument("--model", help="Claude model id (default: the agentModel setting)")
    parser.add_argument("--objective", choices=("speed", "energy"),
                        help="the best candidate: the fastest, or the least energy at matched speed (default: the "
                             "agentObjective setting)")
    parser.add_argument("--target", choices=AGENT_TARGETS,
                        help="what the kernels are written in: the candidate's language (auto), cuda, triton, cute "
                             "(CuTe C++) or cute-dsl (default: the agentTarget setting)")
    parser.add_argument("--plan", action="store_true", default=None,
                        help="start with a planning turn: 2 to 4 strategies, one per branch (the agentPlanning "
                             "setting)")


def budget_of(args: argparse.Namespace, settings: Settings, prefix: str = "max") -> Budget:
    """The budget the PREFIX options give, each missing one from the settings; a negative one is a usage error."""
    values = [getattr(args, f"{prefix}_{option.replace('-', '_')}") for option, _, _ in BUDGET_OPTIONS]
    try:
        return settings_budget(settings, *values)
    except ValueError as error:
        raise CommandUsageError(str(error)) from None


@reports_usage_errors("optimize")
def run(args: argparse.Namespace) -> int:
    file = args.file
    if not file.is_file() or file.suffix != ".py":
        raise CommandUsageError(f"not a .py file: {file}")
    workspace, settings = nearest_settings(file.parent, "optimize")
    options = verify_options(settings, unattended=True, **verify_option_overrides(args))
    if args.replay is not None:
        reference = _recorded_reference(args) or _reference(file, args, workspace, settings)
        return asyncio.run(_replay(file, reference, args, settings, options))
    reference = _reference(file, args, workspace, settings)
    optimizer = _optimizer(file, reference, args, workspace, settings, options)
    try:
        outcome = asyncio.run(_run_pass(optimizer))
    except KeyboardInterrupt:
        if optimizer.outcome is not None:  # the pass ended: its best so far is written, and shown before the exit
            _print_outcome(args.format, file, optimizer.outcome)
        raise
    _print_outcome(args.format, file, outcome)
    if outcome.error_kind is not None:
        print(f"kernel-lsp optimize: {outcome.stop_reason}", file=sys.stderr)
    if outcome.improved:
        return EXIT_IMPROVED
    return EXIT_USAGE if outcome.error_kind is not None else EXIT_NONE


# --- setting up a pass -------------------------------------------------------------------------------------

def _reference(file: Path, args: argparse.Namespace, workspace: Path | None, settings: Settings) -> Path:
    """--reference; else the file itself when it defines Model and no ModelNew; else as verify finds it."""
    if args.reference is not None:
        if not args.reference.is_file():
            raise CommandUsageError(f"--reference: not a file: {args.reference}")
        return args.reference
    text = _read(file)
    parts = parse_python(text).kernelbench
    if parts.model_new is None and parts.model is not None:
        return file
    found = find_reference(file, text, workspace, settings.verify.references,
                           kernelbench_roots(args, workspace, settings))
    if isinstance(found, ReferenceProblem):
        raise CommandUsageError(f"{file}:{found.line + 1}: {found.message}")
    if not isinstance(found, Pairing):
        raise CommandUsageError(f"no reference for {file}: pass --reference REF, add a '# kernel-lsp: reference=PATH' "
                                "line, define Model in the same file, or set references / kernelbenchRoots")
    return found.reference


def _recorded_reference(args: argparse.Namespace) -> Path | None:
    """For --replay without --reference: the reference the recorded pass used, when it is still there."""
    from kernel_lsp.agent.trajectory import read_trajectory

    if args.reference is not None:
        return None
    try:
        events = read_trajectory(args.replay)
    except (OSError, ValueError) as exc:
        raise CommandUsageError(f"--replay: cannot read {args.replay}: {exc}") from exc
    start = next((e for e in events if e.get("kind") == "start"), {})
    recorded = Path(start["reference"]) if start.get("reference") else None
    return recorded if recorded is not None and recorded.is_file() else None


def _optimizer(file: Path, reference: Path, args: argparse.Namespace, workspace: Path | None, settings: Settings,
               options: VerifyOptions) -> Optimizer:
    if not (settings.agent.api_key or api_key()):
        raise CommandUsageError(f"no Anthropic API key: set {API_KEY_ENV} (or the anthropicApiKey setting) to let "
                                "the agent call Claude")
    budget = budget_of(args, settings)
    start = _read(file) if parse_python(_read(file)).kernelbench.model_new is not None else ""
    try:
        return build_optimizer(file, reference, start, workspace, settings, worker_client(args, settings), options,
                               budget, args.model, _print_progress, planning=args.plan, objective=args.objective,
                               target=args.target)
    except UnpricedModel as error:
        raise CommandUsageError(str(error)) from None


async def _run_pass(optimizer: Optimizer) -> PassOutcome:
    print(f"kernel-lsp optimize: {optimizer.workbench.original} against {optimizer.workbench.reference}; "
          f"trajectory {optimizer.trajectory.path}", file=sys.stderr)
    try:
        return await optimizer.run()
    finally:
        await optimizer.workbench.worker.close()


# --- replay ------------------------------------------------------------------------------------------------

async def _replay(file: Path, reference: Path, args: argparse.Namespace, settings: Settings,
                  options: VerifyOptions) -> int:
    """Re-verify the original and every distinct candidate the trajectory evaluated; exit as a pass would."""
    from kernel_lsp.agent import rubric
    from kernel_lsp.agent.loop import best_candidate, improvement
    from kernel_lsp.agent.search import SearchTree
    from kernel_lsp.agent.tools import Workbench
    from kernel_lsp.agent.trajectory import candidates_of
    from kernel_lsp.worker.client import WorkerUnavailable

    try:
        sources = candidates_of(args.replay)
    except (OSError, ValueError) as exc:
        raise CommandUsageError(f"--replay: cannot read {args.replay}: {exc}") from exc
    original = _read(file) if parse_python(_read(file)).kernelbench.model_new is not None else ""
    workbench = Workbench(file.resolve(), reference.resolve(), original, settings, worker_client(args, settings),
                          options, "replay")
    tree = SearchTree(original)
    texts = [original] * bool(original.strip()) + list(dict.fromkeys(s for s in sources if s != original))
    nodes = [tree.root if text == original else tree.add_child(tree.root, text) for text in texts]

    async def one(node, slots: asyncio.Semaphore) -> None:
        async with slots:
            result = await workbench.evaluate(node.source)
        tree.record(node, result.evaluation, rubric.score(result.evaluation), result.evaluation["summary"])
        print(f"  #{node.id}: {node.outcome}", file=sys.stderr)

    try:
        await workbench.worker.ping()  # the worker, or the Ray actors, started: their capacity known
        slots = asyncio.Semaphore(max(1, workbench.worker.capacity))  # independent: as many at once as it runs
        await asyncio.gather(*(one(node, slots) for node in nodes))
    except WorkerUnavailable as exc:
        raise CommandUsageError(f"--replay: the worker is unavailable: {exc}") from exc
    finally:
        await workbench.worker.close()
    improved, sentence = improvement(tree.root, best_candidate(tree))
    rows = [{"node": n.id, "outcome": n.outcome, "score": n.score} for n in tree.nodes]
    if args.format == "json":
        print(json.dumps({"file": str(file), "trajectory": str(args.replay), "improved": improved,
                          "improvement": sentence, "candidates": rows}, indent=2))
    else:
        print("\n".join([f"#{r['node']}: {r['outcome']}" for r in rows] + [f"{file}: {sentence}"]))
    return EXIT_IMPROVED if improved else EXIT_NONE


# --- output ------------------------------------------------------------------------------------------------

def _print_progress(event: ProgressEvent) -> None:
    best = f" · {event.best}" if event.best else ""
    spend = event.spend
    print(f"  [{event.stage}] {event.message}{best} · {spend['model_calls']} calls, ${spend['dollars']:.2f}, "
          f"{spend['evaluations']} evaluations", file=sys.stderr)


def _print_outcome(fmt: str, file: Path, outcome: PassOutcome) -> None:
    if fmt == "json":
        document = {key: str(value) if isinstance(value, Path) else value for key, value in asdict(outcome).items()}
        print(json.dumps({"file": str(file), **document}, indent=2))
        return
    lines = [f"{file}: {outcome.improvement}", f"stopped: {outcome.stop_reason}"]
    if outcome.best_summary:
        lines.append(f"best: {outcome.best_summary}")
    if outcome.side_file:
        what = "the best verified candidate" if outcome.best_source else "the best attempt (not verified)"
        lines.append(f"side file: {outcome.side_file} ({what})")
    spend = outcome.spend
    lines.append(f"spend: {spend['model_calls']} model calls, {spend['input_tokens'] + spend['output_tokens']} "
                 f"tokens, ${spend['dollars']:.2f}, {spend['evaluations']} evaluations, {spend['wall_s']:.0f} s")
    lines.append(f"trajectory: {outcome.trajectory_path}")
    print("\n".join(lines))


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")
