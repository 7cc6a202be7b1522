"""What a pass's input costs, with prompt caching off and on (issue 40), measured in one run:

    .venv/bin/python benchmarks/agent_cost.py [--repeat N] [--record]

A real Optimizer pass on the CPU path (a Triton ReLU under TRITON_INTERPRET=1, a real local worker, the default
settings but for the verify options of agent_overhead.py) and the real `anthropic` client against the fake Messages
API, whose prompt cache counts each request's input as the API documents (tests/agent/fake_api.PromptCache: reads
of the longest cached prefix, writes up to the last breakpoint, the rest at the input price). The script: 20
expansions, each read_candidate, write_candidate (a new text), verify, then a short text that ends the expansion;
then finish. `N` repeats the pair of passes.

Per expansion: the input tokens billed at the full price, the cache writes and reads, and their price in input
tokens (write 1.25x, read 0.1x). Target: at least 60% fewer billed input tokens with caching on.
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the worker starts: its sandbox children inherit it

import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from kernel_lsp.agent.budget import Budget  # noqa: E402
from kernel_lsp.agent.loop import Optimizer  # noqa: E402
from kernel_lsp.agent.model import ModelClient, priced_input_tokens  # noqa: E402
from kernel_lsp.agent.tools import Workbench  # noqa: E402
from kernel_lsp.agent.trajectory import TrajectoryWriter  # noqa: E402
from kernel_lsp.config import Settings  # noqa: E402
from kernel_lsp.worker.client import WorkerClient  # noqa: E402
from tests.agent.fake_api import FakeMessagesApi, Turn, text_turn, tool_use_turn  # noqa: E402
from tests.agent.test_tools import REFERENCE, TRITON  # noqa: E402

EXPANSIONS = 20
OPTIONS = {"device": "cpu", "trials": 2, "timedCalls": 5, "baselines": ["eager"]}
FAST = TRITON.replace("x.numel(), 64)", "x.numel(), 4096)").replace("BLOCK=64", "BLOCK=4096")


def script() -> list[Turn]:
    turns: list[Turn] = []
    for number in range(EXPANSIONS):
        turns += [tool_use_turn("read_candidate", {}),
                  tool_use_turn("write_candidate", {"source": FAST + f"# variant {number}\n"}),
                  tool_use_turn("verify", {}), text_turn("next")]
    return turns + [tool_use_turn("finish", {"summary": "done"})]


async def one_pass(folder: Path, caching: bool) -> dict[str, float]:
    (folder / "ref.py").write_text(REFERENCE)
    (folder / "relu.py").write_text(TRITON)
    settings = Settings()
    with FakeMessagesApi(script(), prompt_cache=True) as api:
        workbench = Workbench(folder / "relu.py", folder / "ref.py", TRITON, settings, WorkerClient(), OPTIONS, "b1")
        model = ModelClient("bench-key", api.url, settings.agent.model, settings.agent.max_tokens, None,
                            max_retries=0, prompt_caching=caching)
        budget = Budget(model_calls=4 * EXPANSIONS + 1, evaluations=EXPANSIONS + 1)
        optimizer = Optimizer(model, workbench, budget, TrajectoryWriter(folder / "trajectories", "b1"), "cpu")
        try:
            await optimizer.run()
        finally:
            await workbench.worker.close()
    spend = optimizer.spend
    expansions = max(1, sum(node.expansions for node in optimizer.tree.nodes))
    priced = priced_input_tokens(spend.input_tokens, spend.cache_write_tokens, spend.cache_read_tokens)
    return {"expansions": expansions, "calls": spend.model_calls, "input": spend.input_tokens / expansions,
            "write": spend.cache_write_tokens / expansions, "read": spend.cache_read_tokens / expansions,
            "priced": priced / expansions, "dollars": spend.dollars}


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(repeat):
        for caching in (False, True):
            with tempfile.TemporaryDirectory() as folder:
                runs[caching].append(await one_pass(Path(folder), caching))
    median = {caching: {key: statistics.median(run[key] for run in done) for key in done[0]}
              for caching, done in runs.items()}
    off, on = median[False], median[True]
    fewer = 1 - on["priced"] / off["priced"]
    rows = []
    for caching, figures in ((False, off), (True, on)):
        label = f"caching {'on' if caching else 'off'} ({figures['expansions']:.0f} expansions, {figures['calls']:.0f} calls)"
        rows.append((f"{label}: input tokens billed per expansion, at the input price", f"{figures['input']:,.0f}",
                     "", ""))
        rows.append((f"{label}: cache written / read per expansion", f"{figures['write']:,.0f} / {figures['read']:,.0f}",
                     "", ""))
        rows.append((f"{label}: priced in input tokens per expansion", f"{figures['priced']:,.0f}", "", ""))
        rows.append((f"{label}: dollars for the pass ({Settings().agent.model})", f"${figures['dollars']:.3f}", "", ""))
    rows.append(("billed input, caching on vs off", f"{fewer:.0%} fewer", ">= 60% fewer",
                 "met" if fewer >= 0.6 else "NOT met"))
    return rows


if __name__ == "__main__":
    report.main("agent_cost.py", measure, default_repeat=1)
