"""A conversation past agentContextTokens is compacted before its next turn (kernel_lsp/agent/compaction.py): the
prompt and the last exchanges kept whole, older tool results and long inputs shortened, every tool call still paired
with its result; and in a scripted pass against the fake API (the real anthropic client, a real local worker), the
prompts after the compaction are smaller than the same pass's without it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kernel_lsp.agent.compaction import COMPACTED_NOTE, ELIDED_MARK, compact, prompt_tokens
from kernel_lsp.agent.model import Usage
from kernel_lsp.agent.trajectory import read_trajectory
from kernel_lsp.config import Settings
from tests.agent.fake_api import FakeMessagesApi
from tests.agent.test_loop import SLOW, optimizer, problem
from tests.agent.test_prompt_cache import script

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def interpreted_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def exchange(number: int, result: str, source: str = "") -> list[dict]:
    call = {"type": "tool_use", "id": f"t{number}", "name": "write_candidate" if source else "profile",
            "input": {"source": source} if source else {}}
    return [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm " * 200, "signature": "s"},
                                              {"type": "text", "text": "Let me look. " * 150}, call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{number}",
                                          "content": f"line one of result {number}\n" + "x" * 5000}]}]


def conversation() -> list[dict]:
    messages = [{"role": "user", "content": "Optimize node 3:\n" + "source line\n" * 300}]
    for number in range(5):
        messages += exchange(number, "r", source="y" * 3000 if number == 1 else "")
    return messages


def pairs(messages: list[dict]) -> list[tuple[str, str]]:
    uses = [b["id"] for m in messages if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for m in messages if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b["type"] == "tool_result"]
    return list(zip(uses, results))


def test_older_results_and_inputs_are_shortened_the_prompt_and_last_exchanges_kept():
    messages = conversation()
    before = copy.deepcopy(messages)
    changed = compact(messages, limit=10_000)
    assert messages[0] == before[0]  # the expansion prompt: the node's source and facts
    assert messages[-4:] == before[-4:]  # the last two exchanges whole, thinking included
    assert pairs(messages) == pairs(before) and all(a == b.replace("t", "t") for a, b in pairs(messages))
    old = messages[1:-4]
    assert not any(b["type"] == "thinking" for m in old for b in m["content"])  # earlier thinking dropped
    results = [b for m in old if m["role"] == "user" for b in m["content"] if b["type"] == "tool_result"]
    assert [r["content"].startswith(ELIDED_MARK) for r in results] == [True] * 3
    assert "line one of result 0" in results[0]["content"] and len(results[0]["content"]) < 400
    [write] = [b for m in old for b in m["content"] if b["type"] == "tool_use" and b["name"] == "write_candidate"]
    assert write["input"] == {"source": f"{ELIDED_MARK}: 3,000 chars]"}
    assert old[-1]["content"][-1] == {"type": "text", "text": COMPACTED_NOTE.format(limit=10_000, recent=2)}
    assert changed["blocks"] == 3 * 3 + 1 and changed["chars_saved"] > 20_000  # thinking, text, result; source
    assert compact(messages, limit=10_000) == {"blocks": 0, "chars_saved": 0}  # again: nothing more to do
    assert sum(len(str(m)) for m in old) < 0.25 * sum(len(str(m)) for m in before[1:-4])


def test_a_short_conversation_is_left_alone():
    messages = conversation()[:5]  # the prompt and two exchanges: all of it is recent
    before = copy.deepcopy(messages)
    assert compact(messages, limit=10) == {"blocks": 0, "chars_saved": 0} and messages == before


def test_the_prompt_size_counts_the_caches_writes_and_reads():
    assert prompt_tokens(Usage(input_tokens=10, output_tokens=5, cache_creation_input_tokens=20,
                               cache_read_input_tokens=300)) == 330


async def test_a_pass_past_the_limit_compacts_and_its_later_prompts_shrink(tmp_path: Path):
    sizes, ends = {}, {}
    for limit in (0, 900):
        folder = tmp_path / str(limit)
        folder.mkdir()
        file = problem(folder, SLOW)
        pass_ = optimizer_with(file, limit, api := FakeMessagesApi(script(), prompt_cache=True))
        with api:
            try:
                outcome = await pass_.run()
            finally:
                await pass_.workbench.worker.close()
        events = read_trajectory(outcome.trajectory_path)
        turns = [e for e in events if e["kind"] == "message" and e["role"] == "assistant"]
        assert len(turns) == 7  # the same scripted conversation either way
        sizes[limit] = [sum(u.values()) - u["output_tokens"] for u in (t["usage"] for t in turns)]
        ends[limit] = (outcome.stop_reason, outcome.best_source, outcome.nodes)
        compactions = [e for e in events if e["kind"] == "compaction"]
        if limit == 0:
            assert compactions == []
            continue
        assert compactions and all(e["prompt_tokens"] > limit for e in compactions), compactions
        later = max((r.body.get("messages") or [] for r in api.requests), key=len)  # the conversation's last
        assert any(ELIDED_MARK in str(b.get("content")) for m in later[1:] if isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result")
        assert pairs(later) and all(use == result for use, result in pairs(later))
        notes = [b for m in later if isinstance(m["content"], list) for b in m["content"]
                 if b.get("type") == "text" and b.get("text", "").startswith("[kernel-lsp: the conversation passed")]
        assert len(notes) == 1  # one note, after the last shortened message
    assert sizes[900][-1] < sizes[0][-1], sizes  # the last prompt is smaller once compacted
    assert ends[900] == ends[0]  # and the pass went the same way


def optimizer_with(file: Path, limit: int, api: FakeMessagesApi):
    pass_ = optimizer(api, file)
    pass_.workbench.settings = Settings.of(agent_context_tokens=limit)
    return pass_
