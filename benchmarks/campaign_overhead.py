"""A campaign's own bookkeeping per problem: everything `kernel-lsp campaign` does beside the passes themselves.

    .venv/bin/python benchmarks/campaign_overhead.py [--repeat N] [--record]

N problems (copies of a KernelBench-shaped ReLU problem, N in SIZES) and a model (the fake Messages API of
tests/agent/fake_api.py, through the real `anthropic` client) that finishes each pass at its first turn, so a pass
is one model call and no evaluation; a real local worker, started before the clock starts. Per problem:

    bookkeeping = (campaign set-up + Campaign.run wall time - the passes' own time) / N

- set-up: finding the problems, copying them under OUT, reading or creating the state;
- the passes' own time: each trajectory's "end" event time (from the pass's first event to its last);
- what is left: building each pass (model client, workbench, trajectory file), the state saved after each change
  (campaign.json rewritten whole, so its cost grows with N), the ledger, and the final table.
A resumed campaign with every problem done is timed too: reading the state and the table, per problem. A campaign
of one problem runs first, untimed in the figures (its first pass imports the anthropic SDK).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report
from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.campaign import Campaign, PassSettings
from kernel_lsp.config import Settings
from kernel_lsp.contracts.options import VerifyOptions
from kernel_lsp.worker.client import WorkerClient
from tests.agent.fake_api import FakeMessagesApi, tool_use_turn
from tests.problems import relu_problem

SIZES = (10, 100)


def finish_at_once(body: dict):
    return tool_use_turn("finish", {"summary": "nothing to do"})


async def one_campaign(size: int, worker: WorkerClient, api: FakeMessagesApi) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="kl-campaign-bench-"))
    for number in range(1, size + 1):
        (folder / f"{number}_ReLU_{number}.py").write_text(relu_problem())
    passes = PassSettings(Settings(), VerifyOptions(device="cpu", trials=2, timed_calls=5, baselines=("eager",)),
                          Budget(), Budget())
    started = time.perf_counter()
    campaign = Campaign(folder, folder / ".out", passes, worker, parallel=1)
    set_up = time.perf_counter() - started
    outcome = await campaign.run()
    total = time.perf_counter() - started
    passes_s = sum(_pass_seconds(Path(row["trajectories"][-1])) for row in outcome.rows)
    assert all(row["status"] == "done" for row in outcome.rows) and len(outcome.rows) == size
    resumed_at = time.perf_counter()
    again = Campaign(folder, folder / ".out", passes, worker, parallel=1)
    await again.run()
    resumed = time.perf_counter() - resumed_at
    return {"per_problem_ms": (total - passes_s) / size * 1000, "set_up_ms": set_up / size * 1000,
            "pass_ms": passes_s / size * 1000, "resume_ms": resumed / size * 1000,
            "state_kb": (folder / ".out" / "campaign.json").stat().st_size / 1024}


def _pass_seconds(trajectory: Path) -> float:
    events = [json.loads(line) for line in trajectory.read_text().splitlines() if line.strip()]
    return events[-1]["t"]


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    os.environ.setdefault("ANTHROPIC_API_KEY", "bench-key")
    rows = []
    with FakeMessagesApi([], responder=finish_at_once) as api:
        os.environ["ANTHROPIC_BASE_URL"] = api.url
        worker = WorkerClient()
        await worker.ping()
        try:
            warm = time.perf_counter()
            await one_campaign(1, worker, api)  # the first pass imports the anthropic SDK (~2 s): not bookkeeping
            rows.append(("a first campaign of 1 problem (imports the anthropic SDK)",
                         f"{(time.perf_counter() - warm) * 1000:.0f} ms", "", ""))
            for size in SIZES:
                runs = [await one_campaign(size, worker, api) for _ in range(repeat)]
                def median(key: str) -> float:
                    return statistics.median(run[key] for run in runs)
                rows += [
                    (f"{size} problems: bookkeeping per problem (wall - passes' own time)",
                     f"{median('per_problem_ms'):.1f} ms", "(recorded)", f"n={repeat}"),
                    (f"{size} problems: of which set-up (find, copy, state) per problem", f"{median('set_up_ms'):.2f} ms",
                     "", ""),
                    (f"{size} problems: for scale: a pass's own time (one instant model call)",
                     f"{median('pass_ms'):.1f} ms", "", ""),
                    (f"{size} problems: a resume with every problem done, per problem",
                     f"{median('resume_ms'):.2f} ms", "", ""),
                    (f"{size} problems: campaign.json", f"{median('state_kb'):.0f} KiB", "", ""),
                ]
        finally:
            await worker.close()
    return rows


def machine() -> str:
    import anthropic

    return f"Python {platform.python_version()}, anthropic {anthropic.__version__}; fake Messages API, local worker"


if __name__ == "__main__":
    report.main("campaign_overhead.py", measure, default_repeat=3, machine_extra=machine)
