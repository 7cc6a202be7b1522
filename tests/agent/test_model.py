"""ModelClient against a local fake of the Messages API, through the real anthropic SDK: streaming, tool use,
usage and cost, retries, time-outs, and the API key kept out of logs."""

from __future__ import annotations

import json
import logging
import socket
import time

import anthropic
import pytest

from kernel_lsp.agent.model import ModelClient, ModelError, Usage, cost_usd
from tests.agent.fake_api import (
    DELTA_CHARS,
    FakeMessagesApi,
    broken_stream,
    delayed,
    error_turn,
    pinging,
    raw_turn,
    stalled,
    text_turn,
    tool_use_turn,
)

KEY = "sk-ant-test-3f9c1e77-never-log-me"
MODEL = "claude-sonnet-4-6"
TOOLS = [{
    "name": "write_candidate",
    "description": "Write the candidate kernel file.",
    "input_schema": {"type": "object", "properties": {"source": {"type": "string"}}, "required": ["source"]},
}]
ASK = [{"role": "user", "content": "Make this kernel faster."}]


def client_for(url: str | None, **overrides) -> ModelClient:
    settings = {
        "api_key": KEY, "base_url": url, "model": MODEL, "max_tokens": 1024, "temperature": None,
        "max_retries": 2, "timeout_s": 10.0, "first_backoff_s": 0.01,
    }
    return ModelClient(**{**settings, **overrides})


async def test_a_streamed_tool_use_turn_is_assembled_from_its_deltas():
    source = "import triton\n\n@triton.jit\ndef add_kernel(x_ptr, y_ptr, n):\n    pass\n"
    with FakeMessagesApi([tool_use_turn("write_candidate", {"source": source}, text="Fusing the loads.")]) as api:
        turn = await client_for(api.url).turn("You optimize kernels.", ASK, TOOLS)

    assert len(json.dumps({"source": source})) > 3 * DELTA_CHARS  # the input really came in several deltas
    assert turn.stop_reason == "tool_use"
    assert turn.blocks[0] == {"type": "text", "text": "Fusing the loads."}
    call = turn.blocks[1]
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "write_candidate", {"source": source})
    assert call["id"].startswith("toolu_")
    sent = api.requests[0]
    assert sent.path == "/v1/messages" and sent.body["stream"] is True
    assert sent.body["system"] == [{"type": "text", "text": "You optimize kernels.",  # a cache breakpoint after it
                                    "cache_control": {"type": "ephemeral"}}] and sent.body["tools"] == TOOLS
    assert sent.body["model"] == MODEL and sent.body["max_tokens"] == 1024
    assert "temperature" not in sent.body
    assert sent.api_key == KEY


async def test_a_text_turn_counts_its_tokens_and_dollars():
    with FakeMessagesApi([text_turn("No faster version found.", input_tokens=1000, output_tokens=2000)]) as api:
        turn = await client_for(api.url, temperature=0.2).turn("", ASK, [])

    assert turn.blocks == [{"type": "text", "text": "No faster version found."}]
    assert turn.stop_reason == "end_turn"
    assert turn.usage == Usage(input_tokens=1000, output_tokens=2000)
    assert turn.cost_usd == pytest.approx((1000 * 3.0 + 2000 * 15.0) / 1e6)
    assert turn.retries == 0
    assert api.requests[0].body["temperature"] == 0.2
    assert "system" not in api.requests[0].body and "tools" not in api.requests[0].body


def test_cost_uses_the_alias_price_for_dated_ids_and_zero_for_unknown_models(caplog):
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert cost_usd("claude-haiku-4-5-20251001", usage) == pytest.approx(6.0)
    with caplog.at_level(logging.WARNING):
        assert cost_usd("claude-unreleased-9", usage) == 0.0
    assert "no price is known for model claude-unreleased-9" in caplog.text


def test_prices_from_the_settings_replace_the_table():
    usage = Usage(input_tokens=2_000_000, output_tokens=1_000_000)
    assert cost_usd("claude-unreleased-9", usage, (2.0, 10.0)) == pytest.approx(14.0)
    assert cost_usd("claude-haiku-4-5", usage, (2.0, 10.0)) == pytest.approx(14.0)


async def test_rate_limit_is_retried_after_the_wait_the_api_asked_for():
    turns = [error_turn(429, "rate_limit_error", "Number of requests has exceeded your rate limit", retry_after=0.3),
             text_turn("ok")]
    with FakeMessagesApi(turns) as api:
        started = time.monotonic()
        turn = await client_for(api.url, first_backoff_s=5.0).turn("", ASK, [])  # backoff alone would wait >= 3.75 s
        waited = time.monotonic() - started

    assert turn.retries == 1 and len(api.requests) == 2
    assert 0.3 <= waited < 2.0


async def test_overloaded_is_retried_with_backoff():
    with FakeMessagesApi([error_turn(529, "overloaded_error", "Overloaded"), text_turn("ok")]) as api:
        turn = await client_for(api.url).turn("", ASK, [])

    assert turn.blocks == [{"type": "text", "text": "ok"}]
    assert turn.retries == 1 and len(api.requests) == 2


async def test_overloaded_past_max_retries_gives_up():
    overloaded = error_turn(529, "overloaded_error", "Overloaded")
    with FakeMessagesApi([overloaded] * 3) as api, pytest.raises(ModelError) as raised:
        await client_for(api.url, max_retries=2).turn("", ASK, [])

    assert raised.value.kind == "overloaded" and len(api.requests) == 3


async def test_a_refused_key_is_not_retried_and_names_the_variable():
    refused = error_turn(401, "authentication_error", "invalid x-api-key")
    with FakeMessagesApi([refused, text_turn("ok")]) as api, pytest.raises(ModelError) as raised:
        await client_for(api.url).turn("", ASK, [])

    assert raised.value.kind == "auth"
    assert "ANTHROPIC_API_KEY" in raised.value.message and "401" in raised.value.message
    assert len(api.requests) == 1


async def test_a_bad_request_is_not_retried():
    rejected = error_turn(400, "invalid_request_error", "max_tokens: too large")
    with FakeMessagesApi([rejected]) as api, pytest.raises(ModelError) as raised:
        await client_for(api.url).turn("", ASK, [])

    assert raised.value.kind == "bad-request" and "max_tokens: too large" in raised.value.message
    assert len(api.requests) == 1


async def test_a_missing_key_fails_before_any_request(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with FakeMessagesApi([text_turn("ok")]) as api, pytest.raises(ModelError) as raised:
        await client_for(api.url, api_key=None).turn("", ASK, [])

    assert raised.value.kind == "missing-key" and "ANTHROPIC_API_KEY" in raised.value.message
    assert api.requests == []


async def test_the_key_and_base_url_come_from_the_environment_when_not_given(monkeypatch):
    with FakeMessagesApi([text_turn("ok")]) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        await client_for(None, api_key=None).turn("", ASK, [])

    assert api.requests[0].api_key == "sk-ant-from-env"


async def test_an_answer_slower_than_the_timeout_is_a_timeout_error():
    with FakeMessagesApi([delayed(text_turn("late"), 5.0), text_turn("ok")]) as api:
        started = time.monotonic()
        with pytest.raises(ModelError) as raised:
            await client_for(api.url, timeout_s=0.3).turn("", ASK, [])

    assert raised.value.kind == "timeout" and "0.3 s" in raised.value.message
    assert time.monotonic() - started < 2.0 and len(api.requests) == 1


async def test_a_stream_that_stops_in_the_middle_is_a_timeout_error():
    unfinished = stalled(text_turn("never finished"), 5.0)
    with FakeMessagesApi([unfinished]) as api, pytest.raises(ModelError) as raised:
        await client_for(api.url, timeout_s=0.3).turn("", ASK, [])

    assert raised.value.kind == "timeout"


async def test_an_unreachable_api_is_a_connection_error_after_retries():
    with socket.socket() as placeholder:  # a port nobody listens on once closed
        placeholder.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{placeholder.getsockname()[1]}"
    with pytest.raises(ModelError) as raised:
        await client_for(url, max_retries=1).turn("", ASK, [])

    assert raised.value.kind == "connection" and "ANTHROPIC_BASE_URL" in raised.value.message


async def test_the_key_never_appears_in_logs_or_errors(caplog):
    turns = [error_turn(429, "rate_limit_error", "slow down", retry_after=0.01), text_turn("ok"),
             error_turn(401, "authentication_error", "invalid x-api-key")]
    with caplog.at_level(logging.DEBUG), FakeMessagesApi(turns) as api:
        client = client_for(api.url)
        await client.turn("", ASK, [])
        with pytest.raises(ModelError) as raised:
            await client.turn("", ASK, [])

    assert all(request.api_key == KEY for request in api.requests)
    assert "retry 1 of 2" in caplog.text  # the retry was logged...
    assert KEY not in caplog.text  # ...and nothing logged holds the key
    assert KEY not in str(raised.value) and KEY not in repr(client)


async def test_the_fake_also_answers_without_streaming():
    with FakeMessagesApi([tool_use_turn("finish", {"reason": "done"})]) as api:
        async with anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as sdk:
            message = await sdk.messages.create(model=MODEL, max_tokens=64, messages=ASK, tools=TOOLS)

    assert message.stop_reason == "tool_use" and message.content[0].input == {"reason": "done"}
    assert "stream" not in api.requests[0].body


MALFORMED_ANSWERS = {
    "an HTML page from a proxy": raw_turn("text/html", "<html><body><h1>502 Bad Gateway</h1></body></html>"),
    "JSON that is no message": raw_turn("application/json", '{"status": "ok"}'),
    "plain text": raw_turn("text/plain", "upstream connect error or disconnect/reset before headers"),
    "an event stream of HTML": raw_turn("text/event-stream", "<html>maintenance</html>"),
    "broken JSON in an event": broken_stream(
        'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": {"ty\n\n'),
    "a delta for a block that never started": broken_stream(
        'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 4, '
        '"delta": {"type": "text_delta", "text": "a"}}\n\n'),
    "an unknown event, then the end without a stop reason": broken_stream(
        'event: surprise\ndata: {"type": "surprise"}\n\n', 'event: message_stop\ndata: {"type": "message_stop"}\n\n'),
}


@pytest.mark.parametrize("answer", sorted(MALFORMED_ANSWERS))
async def test_a_malformed_answer_is_a_model_error_that_says_so(answer: str):
    with FakeMessagesApi([MALFORMED_ANSWERS[answer]]) as api:
        with pytest.raises(ModelError) as raised:
            await client_for(api.url, max_retries=0).turn("", ASK, TOOLS)
    assert raised.value.kind == "malformed"
    assert "is no Messages API answer" in raised.value.message and "ANTHROPIC_BASE_URL" in raised.value.message


async def test_a_malformed_answer_is_retried_like_a_server_error():
    with FakeMessagesApi([raw_turn("text/html", "<html>502</html>"), text_turn("fine now")]) as api:
        turn = await client_for(api.url, max_retries=1).turn("", ASK, TOOLS)
    assert turn.blocks == [{"type": "text", "text": "fine now"}] and turn.retries == 1


async def test_a_server_that_only_pings_is_cut_off_at_the_wall_time_left():
    with FakeMessagesApi([pinging(text_turn("never"), 30.0)]) as api:
        started = time.monotonic()
        with pytest.raises(ModelError) as raised:
            await client_for(api.url, timeout_s=10.0).turn("", ASK, TOOLS, time_left_s=1.0)
        took = time.monotonic() - started
    assert raised.value.kind == "timeout" and "wall-time budget" in raised.value.message
    assert took < 5.0  # the pings keep the connection alive: only the wall time left ends the call


async def test_a_turn_is_capped_even_without_a_wall_budget():
    with FakeMessagesApi([pinging(text_turn("never"), 30.0)]) as api:
        with pytest.raises(ModelError) as raised:
            await client_for(api.url, max_turn_s=1.0).turn("", ASK, TOOLS)
    assert raised.value.kind == "timeout" and "the longest a turn may take" in raised.value.message
