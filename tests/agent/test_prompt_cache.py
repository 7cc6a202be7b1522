"""Prompt caching (issue 40): cache breakpoints on the stable prefix and on the conversation so far, one tool list
for the whole pass, and cache tokens counted and priced, against the fake API's prompt cache (which counts a
request's input as the Messages API documents it) with the real anthropic client and a real local worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_lsp.agent.model import CACHE_READ_FACTOR, CACHE_WRITE_FACTOR, Usage, cache_breakpoints, cost_usd
from kernel_lsp.agent.trajectory import read_trajectory
from tests.agent.fake_api import FakeMessagesApi, PromptCache, text_turn, tool_use_turn
from tests.agent.test_loop import BROKEN, SLOW, edit, problem, run_pass

pytestmark = pytest.mark.timeout(300)

TOOLS = [{"name": "read", "input_schema": {}}, {"name": "write", "input_schema": {}}]


@pytest.fixture(autouse=True)
def interpreted_triton(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def script() -> list:
    return [tool_use_turn("read_reference", {}), tool_use_turn("read_candidate", {}),
            tool_use_turn("write_candidate", {"source": BROKEN}), tool_use_turn("compile", {}),
            tool_use_turn("write_candidate", edit(10, "    mask = offsets < n")), tool_use_turn("compile", {}),
            text_turn("done")]


def test_breakpoints_go_on_the_system_prompt_and_the_last_block_and_change_nothing_they_were_given():
    messages = [{"role": "user", "content": "optimize"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]
    kept = [dict(m) for m in messages]
    system, tools, sent = cache_breakpoints("You optimize kernels.", TOOLS, messages)
    assert system == [{"type": "text", "text": "You optimize kernels.", "cache_control": {"type": "ephemeral"}}]
    assert tools == TOOLS and sent[:2] == messages[:2]  # the tools come before the system: its breakpoint covers them
    assert sent[2]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert messages == kept  # the conversation the agent keeps carries no breakpoint
    _, tools, sent = cache_breakpoints("", TOOLS, [{"role": "user", "content": "hi"}])
    assert tools[-1]["cache_control"] == {"type": "ephemeral"} and "cache_control" not in TOOLS[-1]
    assert sent == [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]


def test_the_fake_cache_reads_what_an_earlier_request_wrote_and_misses_after_a_change():
    cache = PromptCache()
    first = {"system": [{"type": "text", "text": "s" * 400, "cache_control": {}}], "tools": TOOLS,
             "messages": [{"role": "user", "content": [{"type": "text", "text": "q" * 400, "cache_control": {}}]}]}
    fresh, written, read = cache.usage(first)
    assert read == 0 and written > 0 and fresh == 0
    longer = {**first, "messages": [{"role": "user", "content": [{"type": "text", "text": "q" * 400}]},
                                    {"role": "assistant", "content": [{"type": "text", "text": "a" * 40}]},
                                    {"role": "user", "content": [{"type": "text", "text": "r" * 40,
                                                                  "cache_control": {}}]}]}
    assert cache.usage(longer)[2] == written  # the earlier prefix, found by looking back from the new breakpoint
    changed = {**longer, "tools": TOOLS[:1]}
    assert cache.usage(changed)[2] == 0  # another tool list: nothing of the prefix matches


def test_cache_tokens_are_priced_as_the_api_bills_them():
    usage = Usage(input_tokens=1000, output_tokens=100, cache_creation_input_tokens=2000, cache_read_input_tokens=10_000)
    expected = (1000 + CACHE_WRITE_FACTOR * 2000 + CACHE_READ_FACTOR * 10_000) * 3 / 1e6 + 100 * 15 / 1e6
    assert cost_usd("claude-sonnet-4-5", usage, (3.0, 15.0)) == pytest.approx(expected)
    assert usage.billed_input_tokens == 13_000


async def test_a_pass_reads_its_conversation_from_the_cache_and_counts_and_prices_it(tmp_path: Path):
    """The same scripted pass with caching off and on: the same turns and tool lists, far fewer tokens billed at the
    full input price, and the spend (dollars, tokens) adds up from what each turn's usage said."""
    spent = {}
    for caching in (False, True):
        folder = tmp_path / str(caching)
        folder.mkdir()
        file = problem(folder, SLOW)
        with FakeMessagesApi(script(), prompt_cache=True) as api:
            pass_, outcome = await run_pass(api, file, prompt_caching=caching)
        turns = [e for e in read_trajectory(outcome.trajectory_path) if e["kind"] == "message"
                 and e["role"] == "assistant"]
        assert len(turns) == 7 and all(t["request"]["tools"] == turns[0]["request"]["tools"] for t in turns)
        usage = [t["usage"] for t in turns]
        assert pass_.spend.cache_read_tokens == sum(u["cache_read_input_tokens"] for u in usage)
        assert pass_.spend.input_tokens == sum(u["input_tokens"] for u in usage)
        assert pass_.spend.dollars == pytest.approx(sum(t["cost_usd"] for t in turns))
        spent[caching] = (pass_.spend.input_tokens, pass_.spend.cache_read_tokens, pass_.spend.dollars)
        if caching:
            assert all(u["cache_read_input_tokens"] > 0 for u in usage[1:])  # every later turn reads the prefix
            assert "cache_control" in api.requests[0].body["system"][0]
        else:
            assert all(u["cache_read_input_tokens"] == u["cache_creation_input_tokens"] == 0 for u in usage)
    (plain_input, _, plain_dollars), (cached_input, cached_read, cached_dollars) = spent[False], spent[True]
    assert cached_input < 0.4 * plain_input and cached_read > plain_input / 2
    assert cached_dollars < plain_dollars
