"""Whole passes: the real anthropic client against the fake Messages API, a real local worker on the CPU (Triton
under TRITON_INTERPRET=1). The model's turns are scripted; the verdicts, scores, tree and files are real."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.loop import Optimizer, ProgressEvent, side_file_path
from kernel_lsp.commands.optimize import _print_progress
from kernel_lsp.server.optimize_feature import progress_message
from kernel_lsp.agent.memory import KernelMemory
from kernel_lsp.agent.model import ModelClient
from kernel_lsp.agent.tools import Workbench
from kernel_lsp.agent.trajectory import TrajectoryWriter, read_trajectory
from kernel_lsp.config import Settings
from kernel_lsp.worker.client import WorkerClient
from tests.agent.fake_api import (
    text,
    FakeMessagesApi,
    broken_stream,
    delayed,
    error_turn,
    pinging,
    raw_turn,
    text_turn,
    tool_use_turn,
)
from tests.agent.test_tools import REFERENCE, TRITON
from tests.problems import verified_report_wire

pytestmark = pytest.mark.timeout(300)

SLOW = TRITON  # 64 programs of 64 elements: each one interpreted
FAST = TRITON.replace("x.numel(), 64)", "x.numel(), 4096)").replace("BLOCK=64", "BLOCK=4096")
BROKEN = FAST.replace("mask = offsets < n", "mask = offsets <")
WRONG = FAST.replace("tl.maximum(x, 0.0)", "x * 3.0")
MUTATES_INPUT = FAST.replace("out = torch.empty_like(x)", "out = x  # writes over the caller's input")
OPTIONS = {"device": "cpu", "trials": 2, "timedCalls": 5, "baselines": ["eager"]}


@pytest.fixture(autouse=True)
def interpreted_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton kernels run on the CPU only through its interpreter


def problem(folder: Path, candidate: str | None) -> Path:
    """ref.py, and relu.py holding `candidate`; the file to optimize (the reference itself when no candidate)."""
    (folder / "ref.py").write_text(REFERENCE)
    if candidate is None:
        return folder / "ref.py"
    (folder / "relu.py").write_text(candidate)
    return folder / "relu.py"


def optimizer(api: FakeMessagesApi, file: Path, budget: Budget = Budget(), max_turn_s: float = 900.0,
              memory: KernelMemory | None = None, thinking_budget: int = 0, prompt_caching: bool = True) -> Optimizer:
    start = "" if file.name == "ref.py" else file.read_text()
    workbench = Workbench(file, file.parent / "ref.py", start, Settings(), WorkerClient(), OPTIONS, "t1")
    model = ModelClient("test-key", api.url, "claude-sonnet-4-5", 2048, None, max_retries=0, timeout_s=60,
                        max_turn_s=max_turn_s, thinking_budget=thinking_budget, prompt_caching=prompt_caching)
    return Optimizer(model, workbench, budget, TrajectoryWriter(file.parent / "trajectories", "t1"), "cpu",
                     memory=memory)


async def run_pass(api: FakeMessagesApi, file: Path, budget: Budget = Budget(), max_turn_s: float = 900.0,
                   events: list[ProgressEvent] | None = None, thinking_budget: int = 0, prompt_caching: bool = True):
    pass_ = optimizer(api, file, budget, max_turn_s, thinking_budget=thinking_budget, prompt_caching=prompt_caching)
    if events is not None:
        pass_.on_event = events.append
    try:
        return pass_, await pass_.run()
    finally:
        await pass_.workbench.worker.close()


def edit(line: int, text: str) -> dict:
    return {"edits": [{"start_line": line, "end_line": line, "text": text}]}


async def test_a_compile_error_is_fixed_then_verified_and_offered(tmp_path: Path, capsys):
    file = problem(tmp_path, SLOW)
    script = [tool_use_turn("read_candidate", {}), tool_use_turn("write_candidate", {"source": BROKEN}),
              tool_use_turn("compile", {}), tool_use_turn("write_candidate", edit(10, "    mask = offsets < n")),
              tool_use_turn("compile", {}), tool_use_turn("verify", {}),
              tool_use_turn("finish", {"summary": "one program of 4096"})]
    progress: list[ProgressEvent] = []
    with FakeMessagesApi(script) as api:
        pass_, outcome = await run_pass(api, file, events=progress)
    assert outcome.stop_reason == "the model finished: one program of 4096"
    assert outcome.best_source == FAST and outcome.improved, outcome.improvement
    assert outcome.original_verdict == "verified"
    assert "faster than the original under the CPU interpreter" in outcome.improvement, outcome.improvement
    assert "×" not in outcome.improvement, outcome.improvement  # no interpreter ratio (issue 21)
    assert outcome.side_file == side_file_path(file) and outcome.side_file.read_text() == FAST
    assert file.read_text() == SLOW  # the user's file is the user's: the edit is only offered
    compile_answer = api.requests[3].body["messages"][-1]["content"][0]
    assert '"ok":false' in compile_answer["content"] and '"line":10' in compile_answer["content"]
    fixed_answer = api.requests[5].body["messages"][-1]["content"][0]["content"]
    assert '"ok":true' in fixed_answer and '"first_call":"ran' in fixed_answer  # Triton: one call on the worker
    assert outcome.spend["model_calls"] == 7 and outcome.spend["evaluations"] == 3  # verify ×2, the first call
    assert not list(tmp_path.glob(".relu.kernel-lsp-agent-*"))  # no scratch file left behind
    events = read_trajectory(outcome.trajectory_path)
    assert [e["kind"] for e in events][:1] == ["start"] and events[-1]["kind"] == "end"
    evaluations = [e for e in events if e["kind"] == "evaluation"]
    assert [(e["node"], e["verdict"]) for e in evaluations] == [(0, "verified"), (1, "verified")]
    assert evaluations[1]["source"] == FAST
    assert [e["name"] for e in events if e["kind"] == "tool_call"][-1] == "finish"
    prompts = [e for e in events if e["kind"] == "message" and e["role"] == "user"]
    assert prompts[0]["node"] == 0 and "#0 (the original): verified" in prompts[0]["content"]
    assert_cpu_progress(progress, capsys)


CPU_BEST = "best: verified (CPU: timings not comparable; 1 candidate verified)"


def assert_cpu_progress(progress: list[ProgressEvent], capsys) -> None:
    """A pass on the CPU: its progress, in the editor and the CLI, counts the verified candidates and shows no
    speedup ratio (the interpreter's times say nothing of a GPU), though the events carry the ratio measured."""
    assert progress and all(event.cpu for event in progress)
    before = [e for e in progress if e.verified == 0]
    after = [e for e in progress if e.verified == 1]
    assert before and after and progress[-1].verified == 1
    assert all("nothing verified yet" in progress_message(e) for e in before)
    assert after[-1].best_speedup_eager is not None  # measured, not shown
    capsys.readouterr()
    shown = [e for e in after if e.stage != "done"]  # the last sentence compares the interpreter's times itself
    for event in shown:
        assert CPU_BEST in progress_message(event) and "×" not in progress_message(event), progress_message(event)
        _print_progress(event)
    printed = capsys.readouterr().err.splitlines()
    assert len(printed) == len(shown) and all(CPU_BEST in line and "×" not in line for line in printed)
    verified = [e.message for e in after if e.stage == "verified"]
    assert verified == ["#1: correct 2/2 · run on the CPU: timings not comparable"]


def test_gpu_progress_shows_the_best_speedup():
    event = ProgressEvent("verify", "verifying #2", 1.4, {"model_calls": 3, "dollars": 0.1, "evaluations": 2}, 1)
    assert progress_message(event) == "verify: verifying #2 · best 1.4× eager · 3 calls, $0.10, 2 evaluations"
    assert ProgressEvent("start", "", None, {}).best is None


async def test_a_wrong_kernel_scores_zero_and_the_right_one_is_kept(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    script = [tool_use_turn("write_candidate", {"source": WRONG}), tool_use_turn("verify", {}),
              tool_use_turn("write_candidate", {"source": FAST}), tool_use_turn("verify", {}),
              tool_use_turn("finish", {"summary": "fixed the arithmetic"})]
    with FakeMessagesApi(script) as api:
        pass_, outcome = await run_pass(api, file)
    wrong, right = pass_.tree.nodes[1], pass_.tree.nodes[2]
    assert wrong.rubric.outcome == "rejected" and wrong.score == 0 and "verify-mismatch" in wrong.outcome
    assert right.parent_id == wrong.id and right.rubric.verified  # the fix hangs under what it fixes
    assert outcome.best_source == FAST and outcome.improved
    verify_answer = api.requests[2].body["messages"][-1]["content"][0]["content"]
    assert '"verdict":"rejected"' in verify_answer
    memory = text(api.requests[2].body["messages"][0]["content"])
    assert "#0 (the original): verified" in memory
    # the trajectory, fit for training: where it ran, what each turn was offered and asked with, the codes
    events = read_trajectory(outcome.trajectory_path)
    (environment,) = [e for e in events if e["kind"] == "environment"]
    assert environment["kernel_lsp"] and environment["python"] and environment["worker"]["address"] == "local"
    assert "torch" in environment["worker"]["versions"]
    turns = [e for e in events if e["kind"] == "message" and e["role"] == "assistant"]
    assert len(turns) == 5 and turns[0]["request"]["model"] == "claude-sonnet-4-5"
    assert "verify" in turns[0]["request"]["tools"]
    assert all(turn["request"]["tools"] == turns[0]["request"]["tools"] for turn in turns)  # one list: cacheable
    codes = {e["node"]: e["codes"] for e in events if e["kind"] == "evaluation"}
    assert codes[wrong.id] == ["verify-mismatch"] and codes[right.id] == []


async def test_a_cheat_is_rejected_scores_zero_and_is_never_the_best(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    script = [tool_use_turn("write_candidate", {"source": MUTATES_INPUT}), tool_use_turn("verify", {}),
              tool_use_turn("finish", {"summary": "gave up"})]
    with FakeMessagesApi(script) as api:
        pass_, outcome = await run_pass(api, file)
    cheat = pass_.tree.nodes[1]
    assert cheat.rubric.outcome == "integrity" and cheat.score == 0 and cheat.dead
    assert outcome.best_source is None and not outcome.improved and outcome.side_file is None
    assert '"integrity":["integrity-input-mutated"]' in api.requests[2].body["messages"][-1]["content"][0]["content"]
    scores = [e for e in read_trajectory(outcome.trajectory_path) if e["kind"] == "score"]
    assert [(s["node"], s["outcome"], s["score"]) for s in scores][1] == (1, "integrity", 0.0)


async def test_the_pass_stops_at_the_model_call_budget_and_says_so(tmp_path: Path):
    file = problem(tmp_path, None)
    script = [tool_use_turn("read_reference", {}), tool_use_turn("read_candidate", {}),
              tool_use_turn("write_candidate", {"source": FAST})]
    with FakeMessagesApi(script) as api:
        pass_, outcome = await run_pass(api, file, Budget(model_calls=2))
    assert outcome.stop_reason == "the budget of 2 model calls is spent"
    assert len(api.requests) == 2 and api.turns_left == 1
    assert outcome.best_source is None and outcome.side_file is None
    assert "There is no candidate yet" in text(api.requests[0].body["messages"][0]["content"])
    assert read_trajectory(outcome.trajectory_path)[-1]["stop_reason"] == outcome.stop_reason


FAILURES = {  # how a model call can fail after an improvement was verified: the improvement must survive each
    "an HTML page from a proxy": (raw_turn("text/html", "<html><body>502 Bad Gateway</body></html>"), "malformed"),
    "broken JSON in the stream": (broken_stream('event: content_block_delta\ndata: {"type": "content_block_de\n\n'),
                                  "malformed"),
    "an API error": (error_turn(400, "invalid_request_error", "prompt is too long"), "bad-request"),
    "a server that only pings": (pinging(text_turn("never"), 60.0), "timeout"),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
async def test_an_improvement_survives_a_model_call_that_fails_after_it(tmp_path: Path, failure: str):
    file = problem(tmp_path, SLOW)
    turn, kind = FAILURES[failure]
    with FakeMessagesApi([write_and_verify(FAST), turn]) as api:
        pass_, outcome = await run_pass(api, file, max_turn_s=3.0)  # the pinging server is cut off after 3 s
    assert outcome.error_kind == kind, outcome.stop_reason
    assert outcome.improved and outcome.best_source == FAST
    assert outcome.side_file is not None and outcome.side_file.read_text() == FAST
    events = read_trajectory(outcome.trajectory_path)
    assert events[-1]["kind"] == "end" and events[-1]["improved"] is True
    assert events[-1]["stop_reason"].startswith("model API error: ") and "Traceback" not in outcome.stop_reason


async def test_a_bug_of_ours_mid_pass_still_ends_it_with_the_improvement(tmp_path: Path, monkeypatch):
    file = problem(tmp_path, SLOW)

    with FakeMessagesApi([write_and_verify(FAST), text_turn("more?")]) as api:
        pass_ = optimizer(api, file)
        chosen = []
        select = pass_.tree.select

        def broken():  # the first expansion is chosen as usual; choosing the second fails
            if chosen:
                raise RuntimeError("a bug in the search")
            chosen.append(select())
            return chosen[0]

        monkeypatch.setattr(pass_.tree, "select", broken)
        try:
            outcome = await pass_.run()
        finally:
            await pass_.workbench.worker.close()
    assert outcome.error_kind == "internal" and "RuntimeError: a bug in the search" in outcome.stop_reason
    assert outcome.improved and outcome.side_file.read_text() == FAST
    assert read_trajectory(outcome.trajectory_path)[-1]["kind"] == "end"


async def test_cancelling_after_an_improvement_still_writes_it_beside_the_original(tmp_path: Path):
    """Ctrl-C in the CLI and cancel in the editor both cancel the pass's task."""
    file = problem(tmp_path, SLOW)
    with FakeMessagesApi([write_and_verify(FAST), delayed(text_turn("too late"), 30)]) as api:
        pass_ = optimizer(api, file)
        task = asyncio.create_task(pass_.run())
        while len(api.requests) < 2:  # the improvement is verified; the next turn is in flight
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await pass_.workbench.worker.close()
    outcome = pass_.outcome
    assert outcome.stop_reason == "cancelled" and outcome.improved
    assert outcome.side_file == side_file_path(file) and outcome.side_file.read_text() == FAST
    assert read_trajectory(outcome.trajectory_path)[-1]["kind"] == "end"


async def test_cancelling_a_pass_keeps_its_trajectory(tmp_path: Path):
    file = problem(tmp_path, None)
    script = [tool_use_turn("write_candidate", {"source": WRONG}), delayed(text_turn("too late"), 30)]
    with FakeMessagesApi(script) as api:
        pass_ = optimizer(api, file)
        task = asyncio.create_task(pass_.run())
        while len(api.requests) < 2:  # the second turn is in flight
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await pass_.workbench.worker.close()
    assert pass_.outcome.stop_reason == "cancelled"
    events = read_trajectory(pass_.outcome.trajectory_path)
    assert [e["kind"] for e in events if e["kind"] in ("tool_call", "end")] == ["tool_call", "end"]
    assert events[-1]["stop_reason"] == "cancelled"


async def test_a_profile_with_both_energies_adds_the_energy_term_to_the_profiled_node(tmp_path: Path):
    from tests.agent.test_tools import RecordingWorker  # answers verified at 0.5x eager; profiles read 40 / 50 mJ

    file = problem(tmp_path, SLOW)
    worker = RecordingWorker()
    workbench = Workbench(file, tmp_path / "ref.py", file.read_text(), Settings(), worker, OPTIONS, "t1")
    script = [tool_use_turn("write_candidate", {"source": FAST}), tool_use_turn("verify", {}),
              tool_use_turn("write_candidate", {"source": FAST + "\n"}), tool_use_turn("verify", {}),
              tool_use_turn("profile", {}), tool_use_turn("finish", {"summary": "profiled"})]
    with FakeMessagesApi(script) as api:
        model = ModelClient("test-key", api.url, "claude-sonnet-4-5", 2048, None, max_retries=0, timeout_s=60)
        pass_ = Optimizer(model, workbench, Budget(), TrajectoryWriter(tmp_path / "trajectories", "t1"), "cpu")
        outcome = await pass_.run()
    unprofiled, profiled = pass_.tree.nodes[1], pass_.tree.nodes[2]
    assert "energy" not in unprofiled.rubric.parts and profiled.rubric.parts["energy"] > 0  # 50 / 40 mJ
    assert profiled.evaluation["energy"] == {"candidate_mj_per_call": 40.0, "reference_mj_per_call": 50.0}
    assert profiled.score > unprofiled.score and outcome.best_source == FAST + "\n"
    assert pass_.tree.root.value == pytest.approx(sum(node.reward for node in pass_.tree.nodes))
    scores = [e for e in read_trajectory(outcome.trajectory_path) if e["kind"] == "score" and e["node"] == 2]
    assert len(scores) == 2 and scores[-1]["energy"]["reference_mj_per_call"] == 50.0


class PoolWorker:
    """A worker with room for two jobs at once (as a Ray pool of two actors): each verify takes 0.5 s and answers
    verified, at 2x eager for texts with 'pool-b' in them and 1.5x for the rest; it records how many ran at once."""

    capacity = 2

    def __init__(self) -> None:
        self.running = self.most = 0
        self.sources: list[str] = []

    async def run(self, job, progress=None, timeout_s=None):
        from kernel_lsp.worker.protocol import Result

        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.5)
        finally:
            self.running -= 1
        source = job.source_files[job.config["candidate"]]
        self.sources.append(source)
        eager = 2.0 if "pool-b" in source else 1.5
        report = verified_report_wire(eager=eager, median_ms=2.0 / eager)
        return Result("ok", metrics={"verdict": "verified", "summary": f"correct 2/2 · {eager}× eager",
                                     "report": report})


def write_and_verify(source: str):
    from tests.agent.fake_api import Turn

    turn = tool_use_turn("write_candidate", {"source": source})
    verify = tool_use_turn("verify", {})
    return Turn(turn.blocks + verify.blocks, "tool_use")


async def test_with_room_for_two_jobs_two_expansions_run_at_once(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    worker = PoolWorker()
    workbench = Workbench(file, tmp_path / "ref.py", file.read_text(), Settings(), worker, OPTIONS, "t1")
    a, b = FAST + "# pool-a\n", FAST + "# pool-b\n"
    # round 1: each expansion writes and verifies one candidate, then ends its turn; rounds 2 and 3: nothing
    script = [write_and_verify(a), write_and_verify(b)] + [text_turn("no more ideas")] * 6
    with FakeMessagesApi(script) as api:
        model = ModelClient("test-key", api.url, "claude-sonnet-4-5", 2048, None, max_retries=0, timeout_s=60)
        pass_ = Optimizer(model, workbench, Budget(), TrajectoryWriter(tmp_path / "trajectories", "t1"), "cpu")
        outcome = await pass_.run()
        requests = len(api.requests)
    assert pass_.parallel == 2 and worker.most == 2  # the two candidates' verifies ran together
    assert requests == 8 and outcome.stop_reason == "the model stopped proposing candidates"
    children = [pass_.tree.nodes[i] for i in pass_.tree.root.children]
    assert sorted(n.source for n in children) == sorted([a, b]) and all(n.rubric.verified for n in children)
    assert outcome.best_source == b and outcome.improved
    events = read_trajectory(outcome.trajectory_path)
    assert {e.get("expansion") for e in events if e["kind"] == "tool_call"} == {1, 2}
    assert pass_.tree.root.visits == 3 and pass_.tree.root.value == pytest.approx(
        sum(node.reward for node in pass_.tree.nodes))


async def test_earlier_candidates_are_read_by_number_and_passes_remember_each_other(tmp_path: Path):
    """read_node gives the model an earlier candidate's code and results; the next pass on the same file is told
    what this one tried, its fastest marked."""
    file = problem(tmp_path, SLOW)
    memory = KernelMemory(tmp_path / "memory", file)
    script = [write_and_verify(WRONG), tool_use_turn("read_node", {"node": 1}), tool_use_turn("read_node", {"node": 9}),
              write_and_verify(FAST), tool_use_turn("finish", {"summary": "done"})]
    with FakeMessagesApi(script) as api:
        pass_ = optimizer(api, file, memory=memory)
        try:
            first = await pass_.run()
        finally:
            await pass_.workbench.worker.close()
    answers = [m["content"][0]["content"] for r in api.requests for m in r.body["messages"][-1:]
               if isinstance(m["content"], list) and m["content"][0]["type"] == "tool_result"]
    read = json.loads(answers[1])
    assert read["node"] == 1 and read["codes"] == ["verify-mismatch"] and "x * 3.0" in read["source"]
    assert "there is no candidate #9" in answers[2]
    assert first.improved and "What earlier passes" not in text(api.requests[0].body["messages"][0]["content"])

    again = problem(tmp_path, SLOW)  # the same file, a new pass
    with FakeMessagesApi([tool_use_turn("finish", {"summary": "nothing new"})]) as api:
        pass_ = optimizer(api, again, memory=KernelMemory(tmp_path / "memory", again))
        try:
            await pass_.run()
        finally:
            await pass_.workbench.worker.close()
    prompt = text(api.requests[0].body["messages"][0]["content"])
    earlier = prompt.split("What earlier passes on this file tried (newest first):\n")[1].splitlines()
    assert earlier[0].startswith("[pass t1 ") and "verified" in earlier[0]
    assert earlier[0].endswith("(fastest of that pass) · the pass ended: done")  # its finish summary carried
    assert "rejected: verify-mismatch" in earlier[1]


async def test_a_planning_turn_proposes_strategies_and_each_branch_from_the_original_follows_one(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    plan = tool_use_turn("propose_strategies", {"strategies": [
        {"name": "one big block", "idea": "one program of 4096 elements"},
        {"name": "two blocks", "idea": "two programs of 2048"}]})
    half = FAST.replace("4096", "2048")
    # expansion 1, from the original, follows the first strategy and gets it wrong (no better place to start
    # from): expansion 2 starts from the original again, and follows the other strategy
    script = [tool_use_turn("read_candidate", {}), plan,
              write_and_verify(WRONG), text_turn("next"),
              write_and_verify(half), text_turn("next"),
              tool_use_turn("finish", {"summary": "done"})]
    with FakeMessagesApi(script) as api:
        pass_ = optimizer(api, file)
        pass_.planning = True
        try:
            outcome = await pass_.run()
        finally:
            await pass_.workbench.worker.close()
    assert [s.name for s in pass_.strategies] == ["one big block", "two blocks"]
    planner_tools = [t["name"] for t in api.requests[0].body["tools"]]
    assert planner_tools == ["read_reference", "read_candidate", "static_facts", "propose_strategies"]
    first, second = text(api.requests[2].body["messages"][0]["content"]), text(api.requests[4].body["messages"][0]["content"])
    assert "planned strategy 'one big block': one program of 4096 elements" in first
    assert "planned strategy 'two blocks'" in second
    strategies = {n.source: n.strategy for n in pass_.tree.nodes if n.parent_id is not None}
    assert strategies == {WRONG: "one big block", half: "two blocks"}
    assert "[two blocks]" in pass_.tree.memory() and outcome.improved
    events = read_trajectory(outcome.trajectory_path)
    (planned,) = [e for e in events if e["kind"] == "plan"]
    assert [s["name"] for s in planned["strategies"]] == ["one big block", "two blocks"]


def test_proposed_strategies_are_checked_and_capped(tmp_path: Path):
    with FakeMessagesApi([]) as api:
        pass_ = optimizer(api, problem(tmp_path, SLOW))
    assert pass_.propose({"strategies": []}).is_error and pass_.propose({"strategies": "tile"}).is_error
    assert pass_.propose({"strategies": [{"idea": "no name"}]}).is_error and pass_.strategies == []
    many = [{"name": f"s{n}", "idea": "x"} for n in range(6)] + [{"name": "s0", "idea": "again"}]
    answer = json.loads(pass_.propose({"strategies": many}).content)
    assert answer["strategies"] == ["s0", "s1", "s2", "s3"]  # at most 4
    assert pass_.propose({"strategies": [{"name": "  a   b ", "idea": "i"}, {"name": "a b", "idea": "dup"}]})
    assert [s.name for s in pass_.strategies] == ["a b"]
