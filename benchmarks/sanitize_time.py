"""Wall time of compute-sanitizer on a candidate, per tool, through a warm worker (GPU, issue 22):

    python benchmarks/sanitize_time.py [--repeat N] [--problem NAME] [--tool-timeout S] [--record]

For KernelBench level1/19_ReLU (a 4096 x 393216 fp32 input: 6.4 GB) and level1/1_Square_matrix_multiplication_
(4096 x 4096) with the honest CUDA load_inline candidates of tests/gpu/candidates.py, the "sanitize" job as
`kernel-lsp sanitize` sends it, one tool per job: the warm call (the extension built with -lineinfo the first
time, then loaded), then one forward call under compute-sanitizer (for kernel-lsp's shared-init: a warm call and
four forward calls, each after a shared-memory fill). Each row gives the job's wall time and the
tool's own run (its `wallS`), beside the plain warm call's, so the tool's cost reads as a ratio measured in the
same run. A tool that ran past its limit says so: --tool-timeout sets that limit (the `sanitizeTimeoutS`
setting's default, 300 s, unless given); --problem (19_ReLU or 1_Square_matmul, repeatable) measures only
those, so each fits one device call. --record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from benchmarks.verify_latency import gpu_name, warm_worker  # noqa: E402
from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.kinds.sanitize import SanitizeOutcome, sanitize_job  # noqa: E402
from kernel_lsp.profile.sanitize import CHECKS  # noqa: E402
from kernel_lsp.worker.client import WorkerClient  # noqa: E402
from tests.gpu import candidates  # noqa: E402


async def timed_sanitize(client: WorkerClient, candidate: Path, problem: str, tool: str, limit_s: float
                         ) -> tuple[float, SanitizeOutcome]:
    start = time.perf_counter()
    job = sanitize_job(candidate, candidates.KERNELBENCH / problem, {"tools": [tool], "timeoutS": limit_s})
    outcome = SanitizeOutcome.of(await client.run(job, timeout_s=limit_s + 1000))
    elapsed = time.perf_counter() - start
    print(f"{problem} {tool}: {elapsed:.1f} s wall; {outcome.summary}; {outcome.error or ''}", file=sys.stderr)
    return elapsed, outcome


def tool_seconds(outcome: SanitizeOutcome, limit_s: float) -> tuple[float | None, float | None, str]:
    """(the tool's run, the warm call's, a note) from the job's report."""
    report = outcome.report or {}
    runs = report.get("tools") or []
    warm = (report.get("warm") or {}).get("wallS")
    if not runs:
        return None, warm, outcome.error or "no tool ran"
    run = runs[0]
    note = f"stopped at its {limit_s:g} s limit" if run.get("timedOut") else (run.get("problem") or "")
    return run.get("wallS"), warm, note or ("clean" if outcome.clean else outcome.summary)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--problem", action="append", default=[], help="a candidate's name (19_ReLU, 1_Square_matmul)")
    parser.add_argument("--tool-timeout", type=float, default=Settings().sanitize.timeout_s)


async def measure(repeat: int, options: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    rows = []
    limit = options.tool_timeout
    async with warm_worker() as (_, written, client):
        unknown = set(options.problem) - {name for name, _, _ in written}
        if unknown:
            raise SystemExit(f"sanitize_time.py: no candidate named {', '.join(sorted(unknown))}; "
                             f"there are {', '.join(name for name, _, _ in written)}")
        for name, problem, candidate in written:
            if options.problem and name not in options.problem:
                continue
            first, _ = await timed_sanitize(client, candidate, problem, "memcheck", limit)  # builds with -lineinfo
            rows.append((f"{name}: first sanitize job (memcheck; -lineinfo build)", f"{first:.1f} s", "", ""))
            for tool in CHECKS:
                jobs, runs, warms, note = [], [], [], ""
                for _ in range(max(repeat, 1)):
                    elapsed, outcome = await timed_sanitize(client, candidate, problem, tool, limit)
                    seconds, warm, note = tool_seconds(outcome, limit)
                    jobs.append(elapsed)
                    if seconds is not None:
                        runs.append(seconds)
                    if warm is not None:
                        warms.append(warm)
                tool_run = statistics.median(runs) if runs else None
                warm = statistics.median(warms) if warms else None
                ratio = f"{tool_run / warm:.1f}x the plain warm call" if tool_run and warm else ""
                rows.append((f"{name}: {tool} (n={len(jobs)})",
                             f"{statistics.median(jobs):.1f} s job, " + (f"{tool_run:.1f} s {tool}" if tool_run
                                                                        else "no run"),
                             ratio, note))
    return rows


if __name__ == "__main__":
    report.main("sanitize_time.py", measure, default_repeat=1, machine_extra=gpu_name, add_options=add_options)
