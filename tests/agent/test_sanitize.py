"""compute-sanitizer in the agent (issue 22): a candidate that verifies but whose kernels compute-sanitizer finds
errors in scores zero, is never handed back, and the model's next turn is told each error's line; a check that
cannot run (no GPU) changes no score and the trajectory says why.

The passes drive the real anthropic client against the fake Messages API and a real local worker on the CPU
(Triton under TRITON_INTERPRET=1), which verifies every candidate. A CPU has no compute-sanitizer to run, so where
a pass must see the sanitizer's errors, `RecordedSanitizer` answers the "sanitize" jobs of the candidates it has a
recording for with compute-sanitizer's real output, recorded on a GPU by tests/gpu/record_sanitizer.py, made into
a Result by the worker's own code; every other job goes to the worker.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
from pathlib import Path

import pytest

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.loop import Optimizer
from kernel_lsp.agent.model import ModelClient
from kernel_lsp.agent.tools import Workbench
from kernel_lsp.agent.trajectory import TrajectoryWriter, read_trajectory
from kernel_lsp.config import Settings
from kernel_lsp.jobs.files import JOB_KEYS
from kernel_lsp.contracts.options import from_config
from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.sanitize_report import SanitizeProblem
from kernel_lsp.kinds.sanitize import SanitizeOptions
from kernel_lsp.profile.sanitize import NO_GPU, NO_GPU_CODE, SanitizeRun, ToolRun, sanitize_findings, sanitize_report, summary_line
from kernel_lsp.profile.worker_job import candidate_files
from kernel_lsp.worker.client import WorkerClient
from kernel_lsp.worker.protocol import Job, Result
from profilers.sanitizer import parse_report
from tests.agent.fake_api import FakeMessagesApi, tool_use_turn
from tests.agent.test_loop import FAST, SLOW, write_and_verify
from tests.agent.test_tools import RecordingWorker
from tests.paths import FIXTURES
from tests.problems import relu_problem

pytestmark = pytest.mark.timeout(300)

# compute-sanitizer's logs recorded on a GPU (<candidate>.<tool>.log of tests/gpu/sanitizer_candidates.py): where
# profilers/sanitizer.py says, or where tests/gpu/sanitizer_candidates.py says (KERNEL_LSP_SANITIZER_LOGS: another)
FOLDERS = [Path(__file__).resolve().parents[1] / "fixtures" / "sanitizer", FIXTURES / "sanitizer"]
SANITIZER_LOGS = Path(os.environ.get("KERNEL_LSP_SANITIZER_LOGS")
                      or next((folder for folder in FOLDERS if folder.is_dir()), FOLDERS[0]))
TOOLS = ("memcheck",)
RECORDED = [SANITIZER_LOGS / f"{name}.{tool}.log" for name in ("many", "clean") for tool in TOOLS]


def _present(path: Path) -> bool:
    return path.is_file() or path.with_name(path.name + ".gz").is_file()


def read_log(path: Path) -> str:
    """A recorded log, plain or gzipped (the largest are kept gzipped)."""
    if path.is_file():
        return path.read_text(errors="replace")
    return gzip.decompress(path.with_name(path.name + ".gz").read_bytes()).decode(errors="replace")


needs_recordings = pytest.mark.skipif(
    not all(_present(path) for path in RECORDED),
    reason=f"compute-sanitizer's recorded logs are not in {SANITIZER_LOGS} yet (tests/gpu/record_sanitizer.py "
           f"records them on a GPU): {', '.join(p.name for p in RECORDED if not _present(p))}")

# 4000 floats: x's file-backed pages on the CPU (candidate/exchange.py) end 384 bytes after it, so relu_far's read
# past its end reads a zero there (at 4096 floats it reads the next page, which may not be mapped: a SIGSEGV)
REFERENCE = relu_problem("torch.randn(4000)")
# the Triton twins of tests/gpu/sanitizer_candidates.py's MANY_OUT_OF_BOUNDS and CLEAN, whose recorded logs answer
# their sanitize jobs: the same kernel names, and in relu_far a read past the end (each element also reads the
# next one, so the last reads one past the end of x; the value read only matters if it is exactly 1234.5, so
# every trial passes)
PEEK = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_far(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    following = tl.load(x_ptr + offsets + 1, mask=mask)  # BUG: the last element reads one past the end
    tl.store(out_ptr + offsets, tl.where(following == 1234.5, x, tl.maximum(x, 0.0)), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_far[(triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), BLOCK=4096)
        return out
'''
CLEAN = FAST.replace("relu_kernel", "relu_clean")
OPTIONS = {"device": "auto", "trials": 2, "timedCalls": 5, "baselines": ["eager"]}  # the worker picks: its CPU here


@pytest.fixture(autouse=True)
def interpreted_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def problem(folder: Path, candidate: str) -> Path:
    (folder / "ref.py").write_text(REFERENCE)
    (folder / "relu.py").write_text(candidate)
    return folder / "relu.py"


def recorded_result(job: Job, name: str) -> Result:
    """What the worker's sanitize job answers (kinds.sanitize.sanitize_result) when each tool's run printed the
    recorded log `name.<tool>.log`: the same parse, the same findings on the job's own files, the same report."""
    options = from_config(SanitizeOptions, job.config, ignore=JOB_KEYS)
    runs = []
    for tool in options.tools:
        report = parse_report(read_log(SANITIZER_LOGS / f"{name}.{tool}.log"), tool)
        runs.append(ToolRun(tool, report, 0.0, problem=None if report.complete else
                            SanitizeProblem("sanitize-no-summary", f"{tool} printed no summary")))
    run = SanitizeRun(runs)
    findings, library = sanitize_findings(run, job.source_files, candidate_files(job), job.config["origins"],
                                          job.config["candidate"])
    return Result("ok", [f.to_dict() for f in findings],
                  {"sanitize": encode(sanitize_report(run, findings, library)),
                   "summary": summary_line(run, findings, library)},
                  {})


class RecordedSanitizer:
    """A JobRunner over a real worker: the "sanitize" jobs of the texts in `recordings` (text -> the recorded
    candidate's name) are answered from the recorded logs; every other job goes to the worker, and is logged."""

    def __init__(self, worker, recordings: dict[str, str] | None = None) -> None:
        self.worker = worker
        self.recordings = recordings or {}
        self.answered: list[str] = []  # the recordings answered, in order
        self.passed: list[str] = []  # the kinds of the jobs the worker ran, in order

    def __getattr__(self, name: str):  # status, capacity, ping, close: the worker's
        return getattr(self.worker, name)

    async def run(self, job: Job, progress=None, timeout_s=None) -> Result:
        name = self.recordings.get(job.source_files[job.config["candidate"]]) if job.kind == "sanitize" else None
        if name is None:
            self.passed.append(job.kind)
            return await self.worker.run(job, progress, timeout_s)
        self.answered.append(name)
        return recorded_result(job, name)


async def run_pass(file: Path, worker, script, settings: Settings) -> tuple[Optimizer, object, FakeMessagesApi]:
    workbench = Workbench(file, file.parent / "ref.py", file.read_text(), settings, worker, OPTIONS, "t1")
    with FakeMessagesApi(script) as api:
        model = ModelClient("test-key", api.url, "claude-sonnet-4-5", 2048, None, max_retries=0, timeout_s=60)
        optimizer = Optimizer(model, workbench, Budget(), TrajectoryWriter(file.parent / "trajectories", "t1"), "auto")
        try:
            outcome = await optimizer.run()
        finally:
            await worker.close()
    return optimizer, outcome, api


def verify_answer(api: FakeMessagesApi, request: int) -> dict:
    """The verify tool's answer the model read in request `request` (a write_candidate and a verify per turn)."""
    return json.loads(api.requests[request].body["messages"][-1]["content"][1]["content"])


def line_of(text: str, fragment: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if fragment in line)


@needs_recordings
async def test_a_candidate_with_sanitizer_errors_scores_zero_and_the_model_is_told_where(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    worker = RecordedSanitizer(WorkerClient(), {PEEK: "many", CLEAN: "clean"})
    script = [write_and_verify(PEEK), write_and_verify(CLEAN), tool_use_turn("finish", {"summary": "fixed the read"})]
    optimizer, outcome, api = await run_pass(file, worker, script, Settings.of(sanitize_tools=TOOLS))
    unsafe, clean = optimizer.tree.nodes[1], optimizer.tree.nodes[2]
    assert unsafe.evaluation["verdict"] == "verified"  # every trial passed: only the sanitizer sees the bug
    assert unsafe.rubric.outcome == "unsafe" and unsafe.score == 0 and unsafe.reward == 0
    assert clean.rubric.verified and clean.score > 0
    assert outcome.best_source == CLEAN and outcome.side_file.read_text() == CLEAN
    # the original is the user's and is never handed back: not sanitized; each candidate once
    assert worker.answered == ["many", "clean"] and "sanitize" not in worker.passed

    told = verify_answer(api, 1)
    kernel_line = line_of(PEEK, "def relu_far")  # the recorded run's kernel, placed by its name in the text
    assert told["verdict"] == "rejected" and told["summary"].startswith(f"unsafe: line {kernel_line}: ")
    (error, *_) = told["sanitizer_errors"]
    assert error["line"] == kernel_line and error["tool"] == "memcheck" and "file" not in error
    assert "Invalid __global__ read" in error["message"] and "relu_far" in error["message"]
    assert "speedup" not in told and "scores zero" in told["note"]
    assert verify_answer(api, 2)["sanitizer"].startswith("clean: memcheck 0")
    assert f"#1 from #0: unsafe: line {kernel_line}: compute-sanitizer memcheck: " in optimizer.tree.memory()

    events = read_trajectory(outcome.trajectory_path)
    checks = {e["node"]: e["evaluation"].get("sanitize") for e in events if e["kind"] == "evaluation"}
    assert checks[0] is None and checks[1]["status"] == "errors" and checks[2]["status"] == "clean"
    assert {e["node"]: e["codes"] for e in events if e["kind"] == "evaluation"}[1] == ["sanitizer-memcheck"]
    scores = {e["node"]: (e["outcome"], e["score"]) for e in events if e["kind"] == "score"}
    assert scores[1] == ("unsafe", 0.0) and scores[2][0] == "verified"
    assert outcome.spend["evaluations"] == 5  # three verifies and two sanitize jobs


async def test_on_a_worker_without_a_gpu_sanitizing_is_skipped_and_recorded(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    again = FAST + "# again\n"
    worker = RecordedSanitizer(WorkerClient())  # no recordings: the worker answers every job itself
    script = [write_and_verify(FAST), write_and_verify(again), tool_use_turn("finish", {"summary": "done"})]
    optimizer, outcome, api = await run_pass(file, worker, script, Settings())
    first, second = optimizer.tree.nodes[1], optimizer.tree.nodes[2]
    assert first.rubric.verified and second.rubric.verified and first.score > 0 and second.score > 0
    assert outcome.best_source in (FAST, again) and outcome.improved and outcome.stop_reason.startswith("the model")
    # asked once; its answer (no GPU) holds for the rest of the pass
    assert worker.passed == ["verify", "verify", "sanitize", "verify"] and outcome.spend["evaluations"] == 4
    events = read_trajectory(outcome.trajectory_path)
    checks = {e["node"]: e["evaluation"].get("sanitize") for e in events if e["kind"] == "evaluation"}
    for node in (1, 2):
        assert checks[node]["status"] == "not-run" and NO_GPU in checks[node]["reason"], checks[node]
        assert checks[node]["summary"].startswith("not sanitized: ")
    told = verify_answer(api, 1)
    assert told["verdict"] == "verified" and "sanitizer" not in told and told["speedup"]["eager"] > 0


# --- the workbench alone, over workers that answer as a CPU worker does -----------------------------------------

class NoGpuWorker(RecordingWorker):
    """Verifies every candidate; answers "sanitize" as a worker without a GPU does (kinds.sanitize.handle), after
    `delay_s`."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def run(self, job: Job, progress=None, timeout_s=None) -> Result:
        if job.kind != "sanitize":
            return await super().run(job, progress, timeout_s)
        self.jobs.append(job)
        await asyncio.sleep(self.delay_s)
        return Result("failed", [], {}, {}, NO_GPU, NO_GPU_CODE)  # as kinds.sanitize.handle answers


def workbench(tmp_path: Path, worker, options: dict, settings: Settings = Settings()) -> Workbench:
    file = problem(tmp_path, SLOW)
    return Workbench(file, tmp_path / "ref.py", SLOW, settings, worker, options, "p1")


@pytest.mark.parametrize("options, settings, reason", [
    ({"device": "cpu"}, Settings(), "the pass verifies on the CPU"),
    ({"device": "auto"}, Settings.of(agent_sanitize=False), "agentSanitize setting is off"),
])
async def test_no_sanitize_job_on_the_cpu_or_with_the_setting_off(tmp_path: Path, options, settings, reason):
    worker = NoGpuWorker()
    bench = workbench(tmp_path, worker, options, settings)
    result = await bench.evaluate(FAST)
    assert [job.kind for job in worker.jobs] == ["verify"] and result.worker_jobs == 1
    assert result.evaluation["sanitize"]["status"] == "not-run" and reason in result.evaluation["sanitize"]["reason"]


async def test_the_original_is_never_sanitized(tmp_path: Path):
    worker = NoGpuWorker()
    bench = workbench(tmp_path, worker, {"device": "auto"})
    result = await bench.evaluate(SLOW)
    assert [job.kind for job in worker.jobs] == ["verify"] and "sanitize" not in result.evaluation


async def test_a_text_verified_by_two_expansions_at_once_is_sanitized_once(tmp_path: Path):
    worker = NoGpuWorker(delay_s=0.3)
    bench = workbench(tmp_path, worker, {"device": "auto"})
    first, second = await asyncio.gather(bench.fork(FAST).evaluate(FAST), bench.fork(FAST).evaluate(FAST))
    assert [job.kind for job in worker.jobs].count("sanitize") == 1
    assert first.worker_jobs + second.worker_jobs == 3  # two verifies, one sanitize job
    assert first.evaluation["sanitize"] == second.evaluation["sanitize"]
    later = await bench.evaluate(CLEAN)  # the worker said it has no GPU: not asked again
    assert [job.kind for job in worker.jobs].count("sanitize") == 1 and later.worker_jobs == 1
    assert NO_GPU in later.evaluation["sanitize"]["reason"]
