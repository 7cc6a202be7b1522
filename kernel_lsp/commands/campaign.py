"""`kernel-lsp campaign DIR`: an agent pass per problem of a folder (a KernelBench level), resumable, with
per-problem and total budgets, in parallel on the Ray backend; prints the papers' table (fast_p against eager and
torch.compile, geometric-mean speedups, cost) and keeps everything under OUT (kernel_lsp.agent.campaign).

Exit 0 when every problem's pass ended, 1 when some were left for a resume (a total budget spent, a pass stopped
by a model API error), 2 for usage and environment errors (no problems, no API key, a key the API refuses, no
worker), 130 after Ctrl-C (the passes in flight ended; a resume runs them again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.credentials import API_KEY_ENV, api_key
from kernel_lsp.agent.setup import UnpricedModel, check_priced
from kernel_lsp.commands.optimize import BUDGET_OPTIONS, add_pass_options, budget_of
from kernel_lsp.commands.shared import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CommandUsageError,
    add_verify_options,
    add_worker_options,
    nearest_settings,
    reports_usage_errors,
    verify_option_overrides,
    worker_client,
)
from kernel_lsp.kinds.verify import verify_options

OUT_FOLDER = ".kernel-lsp-campaign"  # inside DIR by default; hidden, so no scan of DIR finds its files
EXIT_COMPLETE, EXIT_LEFT = 0, 1


def add_parser(sub: Any) -> None:
    campaign = sub.add_parser("campaign", help="run the optimization agent over every problem of a folder (a "
                              "KernelBench level): fast_p, geometric-mean speedups and cost, resumable")
    campaign.add_argument("folder", type=Path, metavar="DIR", help="folder of problems (.py files defining Model)")
    campaign.add_argument("--out", type=Path, help=f"the campaign's folder: state, copies, best candidates, "
                          f"trajectories (default: DIR/{OUT_FOLDER}); run again to resume")
    add_pass_options(campaign, "--max", " per problem")
    for option, kind, what in BUDGET_OPTIONS:
        campaign.add_argument(f"--total-{option}", type=kind, metavar="N",
                              help=f"the campaign's total budget: {what} (default and 0: unlimited)")
    campaign.add_argument("--parallel", type=int, metavar="N", help="passes at once (default: what the worker runs "
                          "at once: 1 locally, one per Ray actor)")
    campaign.add_argument("--only", action="append", metavar="TEXT", help="only the problems whose path under DIR "
                          "contains TEXT (repeatable)")
    campaign.add_argument("--limit", type=int, metavar="N", help="only the first N problems (KernelBench's order)")
    campaign.add_argument("--fresh", action="store_true", help="start over: forget the state under OUT")
    add_verify_options(campaign, " per candidate")
    add_worker_options(campaign)
    campaign.set_defaults(run=run)


@reports_usage_errors("campaign")
def run(args: argparse.Namespace) -> int:
    from kernel_lsp.agent.campaign import Campaign, CampaignError, PassSettings

    folder = args.folder
    if not folder.is_dir():
        raise CommandUsageError(f"not a folder: {folder}")
    for name in ("parallel", "limit"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise CommandUsageError(f"--{name} must be at least 1, got {getattr(args, name)}")
    workspace, settings = nearest_settings(folder, "campaign")
    if not (settings.agent.api_key or api_key()):
        raise CommandUsageError(f"no Anthropic API key: set {API_KEY_ENV} (or the anthropicApiKey setting) to let "
                                "the agent call Claude")
    options = verify_options(settings, unattended=True, **verify_option_overrides(args))
    passes = PassSettings(settings, options, budget_of(args, settings), _total_budget(args), args.model, args.plan,
                          args.objective, args.target)
    try:
        check_priced(settings, args.model, passes.budget.dollars or passes.total.dollars)
    except UnpricedModel as error:
        raise CommandUsageError(str(error)) from None
    out = args.out or folder / OUT_FOLDER
    client = worker_client(args, settings)
    try:
        campaign = Campaign(folder, out, passes, client, args.parallel, args.fresh, args.only, args.limit,
                            on_line=lambda line: print(f"kernel-lsp campaign: {line}", file=sys.stderr))
    except (CampaignError, OSError) as exc:
        raise CommandUsageError(str(exc)) from None
    print(f"kernel-lsp campaign: {len(campaign.keys)} problem(s) of {folder}; state {campaign.state.path}",
          file=sys.stderr)
    try:
        report = asyncio.run(_run(campaign))
    except KeyboardInterrupt:  # the passes in flight ended their trajectories; the next run reads them back
        print(f"kernel-lsp campaign: interrupted; run the same command again to resume (state {campaign.state.path})",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    _print(args.format, campaign, report)
    if report.aborted:
        print(f"kernel-lsp campaign: stopped: {report.aborted}", file=sys.stderr)
        return EXIT_USAGE
    left = [row["key"] for row in report.rows if row["status"] != "done"]
    if left:
        print(f"kernel-lsp campaign: {len(left)} problem(s) left for a resume (run the same command again): "
              f"{', '.join(left[:8])}{' …' if len(left) > 8 else ''}", file=sys.stderr)
        return EXIT_LEFT
    return EXIT_COMPLETE


def _total_budget(args: argparse.Namespace) -> Budget:
    values = {}
    for option, _, _ in BUDGET_OPTIONS:
        value = getattr(args, f"total_{option.replace('-', '_')}")
        if value is not None and value < 0:
            raise CommandUsageError(f"--total-{option} takes 0 (unlimited) or more, got {value}")
        values[option.replace("-", "_")] = value or None
    return Budget(**values)


async def _run(campaign: Any) -> Any:
    from kernel_lsp.worker.client import WorkerUnavailable

    try:
        return await campaign.run()
    except WorkerUnavailable as exc:
        raise CommandUsageError(f"the worker is unavailable: {exc}") from exc
    finally:
        await campaign.worker.close()


def _print(fmt: str, campaign: Any, report: Any) -> None:
    from kernel_lsp.agent.campaign import PLOT_FILE, TABLE_FILE
    from kernel_lsp.bench.papers import papers_text
    from kernel_lsp.bench.report import campaign_text

    if fmt == "json":
        print(json.dumps({"folder": str(campaign.folder), "out": str(campaign.out), "state": str(campaign.state.path),
                          "metrics": report.metrics.to_dict(), "levels": [row.to_dict() for row in report.levels],
                          "table": str(campaign.out / TABLE_FILE), "plot": str(campaign.out / PLOT_FILE),
                          "problems": report.rows, "totals": report.totals,
                          "aborted": report.aborted, "passes_run": report.ran, "resumed": report.resumed},
                         indent=2, default=str))
        return
    print(campaign_text(report.rows, report.metrics, report.totals))
    print("\n".join(["", *papers_text(report.levels, list(report.metrics.fast_p))]))
    print(f"state: {campaign.state.path}; best candidates under {campaign.out / 'best'}; the table per level "
          f"{campaign.out / TABLE_FILE} and its plot {campaign.out / PLOT_FILE}")
