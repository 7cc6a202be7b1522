"""Stop reasons and extended thinking as the Messages API documents them (issue 40), against the fake API with the
real anthropic client and a real local worker: a turn cut at max_tokens runs none of its tool calls and the model
is told why; a paused turn is sent back to be continued; a refusal ends the conversation; thinking blocks go back
with their signatures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_lsp.agent.model import ModelClient
from kernel_lsp.agent.trajectory import read_trajectory
from tests.agent.fake_api import FakeMessagesApi, Turn, cut_turn, text, text_turn, thinking_turn, tool_use_turn
from tests.agent.test_loop import FAST, SLOW, problem, run_pass

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def interpreted_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def last_user_message(body: dict) -> dict:
    return [m for m in body["messages"] if m["role"] == "user"][-1]


async def test_a_tool_call_cut_at_max_tokens_is_never_run_and_the_model_is_told_why(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    cut = cut_turn("write_candidate", {"source": FAST}, cut_json=200, text="Here is the whole file:")
    with FakeMessagesApi([cut, tool_use_turn("read_candidate", {}), text_turn("done")]) as api:
        pass_, outcome = await run_pass(api, file)
    assert file.read_text() == SLOW and not outcome.improved  # the cut source was written nowhere
    events = read_trajectory(outcome.trajectory_path)
    assert [e["name"] for e in events if e["kind"] == "tool_call"] == ["read_candidate"]  # never the cut call
    answer = last_user_message(api.requests[1].body)["content"]
    [result] = answer
    assert result["tool_use_id"] == cut.blocks[-1]["id"] and result["is_error"] is True
    said = json.loads(result["content"])["error"]
    assert said.startswith("not run: Your answer was cut") and "2048 output tokens" in said and "`edits`" in said
    assert api.requests[1].body["messages"][-2]["role"] == "assistant"  # the cut turn stays in the conversation
    assert [e for e in events if e["kind"] == "message" and e.get("cut")]  # and the trajectory says so


async def test_a_text_answer_cut_at_max_tokens_gets_a_note_and_three_cut_turns_end_the_conversation(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    long_text = Turn([{"type": "text", "text": "Let me explain at length"}], "max_tokens", 100, 2048)
    events: list = []
    with FakeMessagesApi([long_text] * 3 + [text_turn("a new conversation")]) as api:
        pass_, outcome = await run_pass(api, file, events=events)
    first, second, third, fourth = (r.body["messages"] for r in api.requests[:4])
    assert "Your answer was cut" in text(last_user_message(api.requests[1].body)["content"])
    assert len(first) == 1 and len(second) == 3 and len(third) == 5  # each cut answer, then the note
    assert len(fourth) == 1  # after three cut answers in a row, a new conversation
    assert any("incomplete answers in a row" in event.message for event in events)


async def test_a_paused_turn_is_sent_back_as_it_is_and_a_refusal_ends_the_conversation(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    paused = Turn([{"type": "text", "text": "Looking at the reference first"}], "pause_turn")
    refused = Turn([], "refusal")
    with FakeMessagesApi([paused, refused, text_turn("nothing")] * 3) as api:
        pass_, outcome = await run_pass(api, file)
    second = api.requests[1].body["messages"]
    assert second[-1]["role"] == "assistant" and text(second[-1]["content"]) == "Looking at the reference first"
    assert len(second) == 2  # no user message was added: the model goes on where it paused
    events = read_trajectory(outcome.trajectory_path)
    assert [e for e in events if e["kind"] == "message" and e.get("stop_reason") == "refusal"]
    third = api.requests[2].body["messages"]
    assert len(third) == 1  # after the refusal a new conversation began; the refused one was not continued


async def test_thinking_is_asked_for_and_its_blocks_go_back_with_their_signatures(tmp_path: Path):
    file = problem(tmp_path, SLOW)
    thought = thinking_turn("The block is too small; 4096 fits.", tool_use_turn("read_candidate", {}),
                            signature="sig-Zm9v")
    with FakeMessagesApi([thought, text_turn("done")]) as api:
        pass_, outcome = await run_pass(api, file, thinking_budget=2048)
    first = api.requests[0].body
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["max_tokens"] == 2048 + 2048 and "temperature" not in first
    sent_back = api.requests[1].body["messages"][-2]["content"]
    assert sent_back[0] == {"type": "thinking", "thinking": "The block is too small; 4096 fits.",
                            "signature": "sig-Zm9v"}
    assert sent_back[1]["type"] == "tool_use"


def test_a_thinking_budget_is_at_least_the_apis_least_and_temperature_is_not_sent_with_it():
    client = ModelClient("k", "http://127.0.0.1:9", "claude-sonnet-4-5", 4096, 0.5, thinking_budget=100)
    request = client._request("system", [{"role": "user", "content": "hi"}], [])
    assert request["thinking"]["budget_tokens"] == 1024 and request["max_tokens"] == 4096 + 1024
    assert "extra_body" not in request
    plain = ModelClient("k", "http://127.0.0.1:9", "claude-sonnet-4-5", 4096, 0.5)._request("s", [], [])
    assert "thinking" not in plain and plain["max_tokens"] == 4096 and plain["extra_body"] == {"temperature": 0.5}
