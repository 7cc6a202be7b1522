"""`kernel-lsp campaign DIR`: an agent pass per problem, the papers' table, per-problem and total budgets, resuming
after a stop and after a kill, an API key the API refuses, and the Ray backend. Three small CPU problems (Triton's
interpreter), a real local worker, and the real anthropic client against the fake Messages API, whose scripted
model answers each conversation from what it holds (passes that run at once interleave their requests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lsp.cli import main
from tests.agent.fake_api import FakeMessagesApi, Turn, delayed, error_turn, tool_use_turn, text
from tests.paths import HERE
from tests.problems import relu_problem, triton_relu
from tests.speedup_marking import ratios, shown_ratios, unmarked_ratios

pytestmark = pytest.mark.timeout(400)
CPU = ["--device", "cpu", "--trials", "2", "--calls", "5", "--baselines", "eager"]
FAST = triton_relu(4096)
CHEAT = FAST.replace("out = torch.empty_like(x)", "out = x  # writes over the caller's input")
HONEST, CHEATS, GIVES_UP = "1_ReLU", "2_ReLU_cheat", "3_ReLU_give_up"
KEYS = [HONEST, CHEATS, GIVES_UP]


@pytest.fixture(autouse=True)
def environment(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(tmp_path / "cache"))


def problems(folder: Path) -> Path:
    """level1/ with three ReLU problems; a comment in each tells the scripted model what to do with it."""
    level = folder / "level1"
    level.mkdir(parents=True)
    for name, plan, size in ((HONEST, "honest", 4096), (CHEATS, "cheat", 2048), (GIVES_UP, "give up", 1024)):
        (level / f"{name}.py").write_text(f"# scripted model: {plan}\n" + relu_problem(f"torch.randn({size})"))
    (level / "notes.py").write_text("X = 1\n")  # no Model: not a problem
    return level


def scripted_model(slow_s: float = 0.0):
    """Per conversation: read the reference; then, by its comment, write the fast kernel, the cheat, or finish at
    once; verify; finish. Stateless, so passes may interleave. `slow_s` delays the cheating problem's turns."""
    def answer(body: dict) -> Turn | None:
        messages = body["messages"]
        turns = sum(m["role"] == "assistant" for m in messages)
        seen = json.dumps(messages)
        plan = next((p for p in ("honest", "cheat", "give up") if f"scripted model: {p}" in seen), None)
        if turns == 0:
            return tool_use_turn("read_reference", {})
        if plan == "give up" or plan is None:
            return tool_use_turn("finish", {"summary": "no idea for this one"})
        delay = slow_s if plan == "cheat" else 0.0
        if turns == 1:
            return delayed(tool_use_turn("write_candidate", {"source": FAST if plan == "honest" else CHEAT}), delay)
        if turns == 2:
            return delayed(tool_use_turn("verify", {}), delay)
        return delayed(tool_use_turn("finish", {"summary": f"{plan}: done"}), delay)
    return answer


def run_campaign(argv: list[str], capsys) -> tuple[int, dict, str]:
    status = main(["campaign", *argv, "--format", "json", *CPU])
    captured = capsys.readouterr()
    return status, (json.loads(captured.out) if captured.out.strip() else {}), captured.err


def rows_by_key(document: dict) -> dict[str, dict]:
    return {row["key"]: row for row in document["problems"]}


def test_a_campaign_runs_every_problem_and_writes_the_papers_table(tmp_path: Path, capsys, monkeypatch):
    folder = problems(tmp_path / "kb")
    with FakeMessagesApi([], responder=scripted_model()) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status, document, err = run_campaign([str(folder), "--out", str(tmp_path / "out"), "--parallel", "1"], capsys)
    assert status == 0, err
    # the passes ran on the CPU: the campaign's line counts what verified, with no interpreter speedup
    assert f"[{KEYS[0]}] done: " in err and "best: verified (CPU: timings not comparable; 1 candidate verified)" in err
    assert "× eager;" not in err
    rows = rows_by_key(document)
    assert list(rows) == KEYS  # KernelBench's order; notes.py is no problem
    assert [rows[k]["verdict"] for k in KEYS] == ["verified", "rejected", "rejected"]
    assert all(rows[k]["status"] == "done" for k in KEYS)
    honest = rows[KEYS[0]]
    assert Path(honest["best_file"]).read_text() == FAST and honest["ms"] > 0 and honest["speedup"]["eager"] > 0
    assert rows[KEYS[1]]["best_file"] is None  # the cheat was rejected: no best
    # fast_p over all three problems: one is correct
    assert document["metrics"]["fast_p"]["eager"]["0"] == pytest.approx(1 / 3)
    assert document["metrics"]["counts"] == {"verified": 1, "rejected": 2, "unavailable": 0}
    # the interpreter's ratio is kept, marked, and enters no figure beyond fast_0
    assert honest["speedup_comparable"] is False and honest["not_comparable_reason"]
    assert document["metrics"]["geomean_speedup"]["eager"]["value"] is None
    assert document["metrics"]["fast_p"]["eager"]["1"] == 0.0
    assert (document["metrics"]["speedup_comparable"], document["metrics"]["not_comparable"]) == (False, 1)
    # the cost is every model call the API answered, each problem's its own
    assert document["totals"]["model_calls"] == len(api.requests) == 4 + 4 + 2
    assert [rows[k]["cost"]["model_calls"] for k in KEYS] == [4, 4, 2]
    assert document["totals"]["input_tokens"] == sum(r["cost"]["input_tokens"] for r in rows.values()) > 0
    for row in rows.values():  # one trajectory per pass, under OUT, ended
        (trajectory,) = row["trajectories"]
        assert Path(trajectory).parent == tmp_path / "out" / "trajectories"
        assert json.loads(Path(trajectory).read_text().splitlines()[-1])["kind"] == "end"
    state = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert state["report"]["metrics"] == document["metrics"]
    # per problem, why its kernels were rejected (not why the pass stopped)
    assert rows[KEYS[1]]["reason"].startswith("rejected: integrity-input-mutated"), rows[KEYS[1]]
    assert rows[KEYS[2]]["reason"].startswith("no candidate was evaluated (the pass: "), rows[KEYS[2]]
    # the papers' table: one level here; every speedup was timed on the CPU, so only fast_0 and the cost count
    [level] = document["levels"]
    assert state["report"]["levels"] == document["levels"]
    assert (level["level"], level["problems"], level["correct"], level["cpu_timed"]) == ("1", 3, 1, 1)
    assert level["fast"]["eager"] == {"0": pytest.approx(1 / 3), "1": 0.0, "1.5": 0.0, "2": 0.0}
    assert level["geomean_correct"]["eager"] is None and level["geomean_all"]["eager"] == 1.0
    assert level["dollars_per_solved"] == pytest.approx(document["totals"]["dollars"])
    markdown = Path(document["table"]).read_text()
    assert "| 1 | 3 | 33% | 0% | 0% | 0% | 1.00x | - | - |" in markdown and "timed on the CPU" in markdown
    plot = Path(document["plot"]).read_text()
    assert plot.startswith("<svg") and "1 correct problem(s) timed on the CPU: speedups not comparable" in plot
    assert not list(folder.glob("*.kernel-lsp-best.py"))  # the problem folder is left as it was
    # every JSON, table and plot the campaign wrote: its ratios marked, none shown as a figure
    assert unmarked_ratios(document) == [] and unmarked_ratios(state) == [] and ratios(state)
    assert state["problems"][KEYS[0]]["best"]["speedup_comparable"] is False
    for page in (markdown, plot):
        assert shown_ratios(page, state) == []

    # the text table: a row per problem, fast_p and the cost
    with FakeMessagesApi([]) as api:  # every problem is done: nothing is asked again
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        assert main(["campaign", str(folder), "--out", str(tmp_path / "out"), *CPU]) == 0
    captured = capsys.readouterr()
    assert api.requests == []
    assert "resuming: 3 of 3 problems were done before" in captured.err
    lines = captured.out.splitlines()
    assert lines[0].split()[:5] == ["level", "id", "name", "status", "verdict"]
    assert any(line.split()[:5] == ["1", "1", "ReLU", "done", "verified"] for line in lines)
    assert "3 problems: 1 verified, 2 rejected, 0 unavailable" in captured.out
    assert "timed on the CPU" in captured.out and "cost: 10 model calls" in captured.out
    assert "per level, against eager PyTorch:" in captured.out and "cost per level:" in captured.out
    assert "geomean speedup vs eager" not in captured.out  # the CPU's ratios are not shown as speedups
    assert shown_ratios(captured.out, state) == [] and "1 correct problem timed on the CPU" in captured.out


def test_a_total_budget_stops_the_campaign_and_a_resume_finishes_it(tmp_path: Path, capsys, monkeypatch):
    folder = problems(tmp_path / "kb")
    out = tmp_path / "out"
    with FakeMessagesApi([], responder=scripted_model()) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status, document, err = run_campaign([str(folder), "--out", str(out), "--parallel", "1",
                                              "--total-model-calls", "6"], capsys)
        first = len(api.requests)
    assert status == 1, err
    rows = rows_by_key(document)
    assert [rows[k]["status"] for k in KEYS] == ["done", "stopped", "pending"]
    assert "the campaign's total budget of 6 model calls is spent" in rows[KEYS[1]]["reason"]
    assert "the campaign's total budget of 6 model calls is spent" in rows[KEYS[2]]["reason"]
    assert document["totals"]["model_calls"] == first == 6
    assert "2 problem(s) left for a resume" in err

    with FakeMessagesApi([], responder=scripted_model()) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status, document, err = run_campaign([str(folder), "--out", str(out), "--parallel", "1"], capsys)
    assert status == 0, err
    rows = rows_by_key(document)
    assert [rows[k]["status"] for k in KEYS] == ["done", "done", "done"]
    assert [rows[k]["passes"] for k in KEYS] == [1, 2, 1]  # the done problem was not run again
    assert len(api.requests) == 4 + 2  # the stopped problem's new pass and the third's
    assert document["totals"]["model_calls"] == 6 + 6  # both runs' spend


def _stopped_mid_pass(folder: Path, out: Path, stop) -> tuple[str, int]:
    """A campaign in its own process, stopped by `stop(process)` while the cheat's pass runs: what stop returned
    (the campaign's stderr, where it read it) and the model calls made."""
    with FakeMessagesApi([], responder=scripted_model(slow_s=1.5)) as api:
        process = _campaign_in_a_process(folder, out, api)
        try:
            _wait_for_the_cheat_mid_pass(out, process)
            said = stop(process)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        return said, len(api.requests)


def test_a_killed_campaign_resumes_and_keeps_the_killed_pass_spend(tmp_path: Path, capsys, monkeypatch):
    folder = problems(tmp_path / "kb")
    out = tmp_path / "out"
    def kill(process: subprocess.Popen) -> str:
        os.killpg(process.pid, signal.SIGKILL)  # the campaign and its worker, mid-pass
        process.wait(30)
        return ""

    _, killed_requests = _stopped_mid_pass(folder, out, kill)

    with FakeMessagesApi([], responder=scripted_model()) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status, document, err = run_campaign([str(folder), "--out", str(out), "--parallel", "1"], capsys)
    assert status == 0, err
    assert "resuming: 1 of 3 problems were done before; 1 killed pass(es) read back" in err
    rows = rows_by_key(document)
    assert [rows[k]["passes"] for k in KEYS] == [1, 2, 1]
    assert [rows[k]["verdict"] for k in KEYS] == ["verified", "rejected", "rejected"]
    state = json.loads((out / "campaign.json").read_text())
    killed = state["problems"][KEYS[1]]["passes"][0]
    assert killed["stop_reason"].startswith("killed")
    assert killed["spend"]["model_calls"] >= 2  # read back from its trajectory
    # every call is counted once: the killed run's (up to its last recorded spend) and this run's
    assert killed_requests - 1 <= document["totals"]["model_calls"] - len(api.requests) <= killed_requests


def test_ctrl_c_stops_the_campaign_cleanly_and_a_resume_finishes_it(tmp_path: Path, capsys, monkeypatch):
    folder = problems(tmp_path / "kb")
    out = tmp_path / "out"
    def ctrl_c(process: subprocess.Popen) -> str:
        process.send_signal(signal.SIGINT)
        err = process.communicate(timeout=60)[1].decode()
        assert process.returncode == 130, err
        return err

    err, _ = _stopped_mid_pass(folder, out, ctrl_c)
    assert "interrupted; run the same command again to resume" in err and "Traceback" not in err
    cheat = _state(out)["problems"][KEYS[1]]
    assert json.loads(Path(cheat["passes"][-1]["trajectory"]).read_text().splitlines()[-1])["kind"] == "end"

    with FakeMessagesApi([], responder=scripted_model()) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status, document, err = run_campaign([str(folder), "--out", str(out), "--parallel", "1"], capsys)
    assert status == 0, err
    assert [r["status"] for r in document["problems"]] == ["done", "done", "done"]
    assert [r["passes"] for r in document["problems"]] == [1, 2, 1]
    interrupted = _state(out)["problems"][KEYS[1]]["passes"][0]
    assert interrupted["stop_reason"] == "interrupted: cancelled" and interrupted["spend"]["model_calls"] >= 2


def test_fresh_starts_over_without_the_memory_of_the_old_passes(tmp_path: Path, capsys, monkeypatch):
    folder = problems(tmp_path / "kb")
    out = tmp_path / "out"
    with FakeMessagesApi([], responder=scripted_model()) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        assert run_campaign([str(folder), "--out", str(out), "--only", HONEST], capsys)[0] == 0
        assert list((out / "trajectories" / "memory").iterdir())  # the pass's memory, for the next pass
        status, document, err = run_campaign([str(folder), "--out", str(out), "--only", HONEST, "--fresh"], capsys)
    assert status == 0 and "resuming" not in err
    assert document["problems"][0]["passes"] == 1 and len(api.requests) == 8  # run again, from nothing
    prompt = text(api.requests[4].body["messages"][0]["content"])
    assert "earlier passes" not in prompt, prompt  # the old pass's memory was not offered
    assert len(list((out / "trajectories").glob("*.jsonl"))) == 2  # the old trajectory is kept


def test_a_refused_api_key_ends_the_campaign_at_once(tmp_path: Path, capsys, monkeypatch):
    folder = problems(tmp_path / "kb")
    with FakeMessagesApi([error_turn(401, "authentication_error", "invalid x-api-key")] * 3) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status, document, err = run_campaign([str(folder), "--out", str(tmp_path / "out"), "--parallel", "1"],
                                             capsys)
    assert status == 2
    assert "stopped: the model API refused the API key" in err
    assert len(api.requests) == 1  # the other problems were never started
    assert [r["status"] for r in document["problems"]] == ["stopped", "pending", "pending"]
    assert "test-key" not in err


@pytest.mark.parametrize("argv, message", [
    (["--total-dollars", "-1"], "--total-dollars takes 0 (unlimited) or more"),
    (["--parallel", "0"], "--parallel must be at least 1"),
    (["--only", "nothing-like-it"], "no problems in"),
])
def test_bad_options_are_usage_errors(tmp_path: Path, capsys, argv, message):
    folder = problems(tmp_path / "kb")
    assert main(["campaign", str(folder), "--out", str(tmp_path / "out"), *argv, *CPU]) == 2
    assert message in capsys.readouterr().err


def test_an_out_folder_of_another_campaign_is_refused(tmp_path: Path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "campaign.json").write_text(json.dumps({"format": 1, "folder": "/elsewhere", "problems": {}}))
    assert main(["campaign", str(problems(tmp_path / "kb")), "--out", str(out), *CPU]) == 2
    assert "holds a campaign over /elsewhere" in capsys.readouterr().err


@pytest.mark.slow
def test_a_campaign_on_the_ray_backend_runs_passes_at_once(tmp_path: Path, capsys, monkeypatch):
    pytest.importorskip("ray", reason="the Ray backend's tests need ray: pip install 'kernel-lsp[ray]'")
    folder = problems(tmp_path / "kb")
    with FakeMessagesApi([], responder=scripted_model(slow_s=0.5)) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status, document, err = run_campaign([str(folder), "--out", str(tmp_path / "out"), "--backend", "ray",
                                              "--actors", "2"], capsys)
    assert status == 0, err
    assert "3 problem(s) to run, 2 at once" in err
    rows = rows_by_key(document)
    assert [rows[k]["verdict"] for k in KEYS] == ["verified", "rejected", "rejected"]
    assert document["totals"]["model_calls"] == len(api.requests) == 10
    # two passes ran at once: the cheating problem's requests come between the honest one's first and last
    plans = [_plan_of(request.body) for request in api.requests]
    honest = [i for i, plan in enumerate(plans) if plan == "honest"]
    assert any(honest[0] < i < honest[-1] for i, plan in enumerate(plans) if plan == "cheat"), plans


def _campaign_in_a_process(folder: Path, out: Path, api: FakeMessagesApi) -> subprocess.Popen:
    """`kernel-lsp campaign` in a process of its own (its own session: a kill reaches its worker too)."""
    environment = {**os.environ, "ANTHROPIC_BASE_URL": api.url, "PYTHONPATH": str(HERE.parent)}
    return subprocess.Popen([sys.executable, "-m", "kernel_lsp", "campaign", str(folder), "--out", str(out),
                             "--parallel", "1", *CPU], env=environment, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def _wait_for_the_cheat_mid_pass(out: Path, process: subprocess.Popen) -> None:
    """Until the cheating problem's pass has recorded two model calls (the first problem is done by then)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        cheat = (_state(out) or {}).get("problems", {}).get(KEYS[1], {})
        if cheat.get("status") == "running" and _spend_events(cheat) >= 2:
            return
        time.sleep(0.2)
    assert process.poll() is None, process.stderr.read().decode()
    raise AssertionError("the cheating problem's pass did not start in time")


def _state(out: Path) -> dict | None:
    try:
        return json.loads((out / "campaign.json").read_text())
    except (OSError, ValueError):
        return None


def _spend_events(entry: dict) -> int:
    if not entry.get("passes"):
        return 0
    try:
        text = Path(entry["passes"][-1]["trajectory"]).read_text()
    except OSError:
        return 0
    return text.count('"kind": "spend"')


def _plan_of(body: dict) -> str | None:
    seen = json.dumps(body["messages"])
    return next((p for p in ("honest", "cheat", "give up") if f"scripted model: {p}" in seen), None)
