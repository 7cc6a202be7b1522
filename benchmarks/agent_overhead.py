"""The agent harness's own cost per step: everything but the model's time and the evaluation (the GPU work).

    .venv/bin/python benchmarks/agent_overhead.py [--repeat N] [--record]

A real Optimizer pass on the CPU path: a Triton ReLU candidate under TRITON_INTERPRET=1 (4096 floats), device cpu,
2 trials, 5 timed calls, baseline eager, a real local worker, and the real `anthropic` client against the fake
Messages API (tests/agent/fake_api.py) answering from a script of 2N steps, write_candidate (a new text each time,
so every verify is a real worker job) then verify, repeated N times, then finish. A step is one model turn and the
tool it calls, from the start of one ModelClient.turn to the start of the next.

    overhead = step wall time - model time - evaluation time

- model time: measured on the fake server's side, from the request's arrival in its handler to the last byte of
  the answer written (the API's own time). The `anthropic` client's work (building the client, the HTTP exchange,
  parsing the streamed events) is harness overhead and is shown in the breakdown as "SDK client".
- evaluation time: the verify job's `durationS` from the worker's result metrics (the sandbox's time from sending
  the task to the child's reply: importing the candidate, trials, timing).
The breakdown also shows the worker plumbing (the job's round trip minus durationS: the protocol, the task folder,
and waiting for the sandbox's pre-started child) and the agent-side compile check (parse, imports).

The script runs twice: with the model answering at once, and with every answer delayed MODEL_DELAY_S, as a real
model's time would be; then the sandbox's next child has started before the next verify needs it.
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the worker starts: its sandbox children inherit it

import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report
from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.loop import Optimizer
from kernel_lsp.agent.model import ModelClient
from kernel_lsp.agent.tools import Workbench
from kernel_lsp.agent.trajectory import TrajectoryWriter
from kernel_lsp.config import Settings
from kernel_lsp.worker.client import WorkerClient
from tests.agent.fake_api import FakeMessagesApi, Turn, delayed, tool_use_turn
from tests.agent.test_tools import REFERENCE, TRITON

FAST = TRITON.replace("x.numel(), 64)", "x.numel(), 4096)").replace("BLOCK=64", "BLOCK=4096")
OPTIONS = {"device": "cpu", "trials": 2, "timedCalls": 5, "baselines": ["eager"]}
MODEL_DELAY_S = 2.0


@dataclass
class Timings:
    """Intervals (perf_counter seconds) gathered by the wrappers during one pass."""

    turns: list[tuple[float, float]] = field(default_factory=list)  # inside ModelClient.turn
    answers: list[tuple[float, float]] = field(default_factory=list)  # the fake server's handler, per request
    jobs: list[tuple[float, float, float]] = field(default_factory=list)  # worker.run: start, end, durationS
    compiles: list[tuple[float, float]] = field(default_factory=list)  # Workbench._compile_report
    tools: list[tuple[str, float, float]] = field(default_factory=list)  # Workbench.execute: name, start, end
    end: float = 0.0


def script(pairs: int, delay_s: float) -> list[Turn]:
    turns = []
    for number in range(pairs):
        turns.append(tool_use_turn("write_candidate", {"source": FAST + f"# variant {number}\n"}))
        turns.append(tool_use_turn("verify", {}))
    turns.append(tool_use_turn("finish", {"summary": "done"}))
    return [delayed(turn, delay_s) for turn in turns]


def timed_server(api: FakeMessagesApi, timings: Timings) -> None:
    """Times each request in the fake server's handler: the model's own time, as the API's side sees it."""
    handler = api._server.RequestHandlerClass

    class TimedHandler(handler):  # type: ignore[misc, valid-type]
        def do_POST(self) -> None:
            start = time.perf_counter()
            try:
                super().do_POST()
            finally:
                timings.answers.append((start, time.perf_counter()))

    api._server.RequestHandlerClass = TimedHandler


def instrument(optimizer: Optimizer, timings: Timings) -> None:
    """Wraps the model turn, the tools, the worker jobs and the compile check on this pass's objects only."""
    model, workbench = optimizer.model, optimizer.workbench
    turn, execute, run, compile_report = model.turn, workbench.execute, workbench.worker.run, workbench._compile_report

    async def timed_turn(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await turn(*args, **kwargs)
        finally:
            timings.turns.append((start, time.perf_counter()))

    async def timed_execute(name: str, arguments: dict[str, Any]) -> Any:
        start = time.perf_counter()
        try:
            return await execute(name, arguments)
        finally:
            timings.tools.append((name, start, time.perf_counter()))

    async def timed_run(job: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = await run(job, *args, **kwargs)
        timings.jobs.append((start, time.perf_counter(), float(result.metrics.get("durationS") or 0.0)))
        return result

    async def timed_compile(source: str) -> Any:
        start = time.perf_counter()
        try:
            return await compile_report(source)
        finally:
            timings.compiles.append((start, time.perf_counter()))

    model.turn = timed_turn  # type: ignore[method-assign]
    workbench.execute = timed_execute  # type: ignore[method-assign]
    workbench.worker.run = timed_run  # type: ignore[method-assign]
    workbench._compile_report = timed_compile  # type: ignore[method-assign]


async def one_pass(pairs: int, delay_s: float) -> tuple[list[dict[str, Any]], Any]:
    timings = Timings()
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        (folder / "ref.py").write_text(REFERENCE)
        file = folder / "relu.py"
        file.write_text(TRITON)
        with FakeMessagesApi(script(pairs, delay_s)) as api:
            timed_server(api, timings)
            model = ModelClient("bench-key", api.url, "claude-sonnet-4-5", 2048, None, max_retries=0, timeout_s=60)
            workbench = Workbench(file, folder / "ref.py", file.read_text(), Settings(), WorkerClient(), OPTIONS,
                                  "bench")
            optimizer = Optimizer(model, workbench, Budget(), TrajectoryWriter(folder / "trajectories", "bench"),
                                  "cpu")
            instrument(optimizer, timings)
            try:
                outcome = await optimizer.run()
            finally:
                await workbench.worker.close()
            timings.end = time.perf_counter()
    assert outcome.stop_reason == "the model finished: done", outcome.stop_reason
    assert outcome.spend["evaluations"] == pairs + 1, outcome.spend  # the original, then one job per verify
    return steps(timings, 2 * pairs), outcome


def within(start: float, end: float, moment: float) -> bool:
    return start <= moment < end


def steps(timings: Timings, count: int) -> list[dict[str, Any]]:
    """Per scripted step (the finish turn left out): its wall time and the parts of it."""
    assert len(timings.turns) == count + 1 and len(timings.answers) == count + 1, (timings.turns, timings.answers)
    bounds = [start for start, _ in timings.turns] + [timings.end]
    found = []
    for index in range(count):
        start, end = bounds[index], bounds[index + 1]
        turn_start, turn_end = timings.turns[index]
        answer_start, answer_end = timings.answers[index]
        jobs = [job for job in timings.jobs if within(start, end, job[0])]
        tool = next(name for name, begun, _ in timings.tools if within(start, end, begun))
        model_s = answer_end - answer_start
        evaluation_s = sum(duration for _, _, duration in jobs)
        wall_s = end - start
        client_s = (turn_end - turn_start) - model_s
        plumbing_s = sum(job_end - job_start - duration for job_start, job_end, duration in jobs)
        compile_s = sum(c_end - c_start for c_start, c_end in timings.compiles if within(start, end, c_start))
        overhead_s = wall_s - model_s - evaluation_s
        found.append({"tool": tool, "wall": wall_s, "model": model_s, "evaluation": evaluation_s,
                      "overhead": overhead_s, "client": client_s, "plumbing": plumbing_s, "compile": compile_s,
                      "rest": overhead_s - client_s - plumbing_s - compile_s})
    return found


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.9 * len(ordered)) - 1))]


def ms(value: float) -> str:
    return f"{value * 1000:.1f} ms"


def spread(values: list[float]) -> str:
    return f"{ms(statistics.median(values))} (p90 {ms(p90(values))})"


def rows_for(label: str, found: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    verify = [s for s in found if s["tool"] == "verify"]
    write = [s for s in found if s["tool"] == "write_candidate"]
    rows = [(f"{label}: overhead per step, all {len(found)} steps", spread([s["overhead"] for s in found]),
             "(recorded)", ""),
            (f"{label}: overhead per verify step (n={len(verify)})", spread([s["overhead"] for s in verify]),
             "(recorded)", ""),
            (f"{label}: overhead per write_candidate step (n={len(write)})", spread([s["overhead"] for s in write]),
             "(recorded)", "")]
    for part, what in (("client", "SDK client (turn minus the server's answer)"),
                       ("plumbing", "worker plumbing (job round trip minus durationS)"),
                       ("compile", "compile check (agent side)"),
                       ("rest", "loop: tree, rubric, trajectory, prompts, budgets")):
        both = f"{ms(statistics.median(s[part] for s in verify))} / {ms(statistics.median(s[part] for s in write))}"
        rows.append((f"{label}: of which {what}, verify steps / write steps", both, "", ""))
    scale = (f"{ms(statistics.median(s['model'] for s in found))} / "
             f"{ms(statistics.median(s['evaluation'] for s in verify))}")
    rows.append((f"{label}: for scale: model time (server side) / evaluation (durationS) per verify step", scale, "",
                 ""))
    return rows


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    instant, _ = await one_pass(repeat, 0.0)
    waiting, _ = await one_pass(repeat, MODEL_DELAY_S)
    return rows_for("model answers at once", instant) + rows_for(f"model answers after {MODEL_DELAY_S:g} s", waiting)


def machine() -> str:
    import anthropic
    import torch
    import triton

    return (f"CPU path (TRITON_INTERPRET=1), Python {platform.python_version()}, torch {torch.__version__}, "
            f"triton {triton.__version__}, anthropic {anthropic.__version__}")


if __name__ == "__main__":
    report.main("agent_overhead.py", measure, default_repeat=10, machine_extra=machine)
