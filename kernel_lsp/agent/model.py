"""The agent's model client: one Messages API turn through the `anthropic` SDK, streamed, with tool use,
retries with backoff on rate limits, overloads and server errors, a time-out, and tokens and dollars counted.

The API key comes from the caller (the editor's setting) or ANTHROPIC_API_KEY and is never logged; the base URL
from the caller or ANTHROPIC_BASE_URL. Every failure is a ModelError whose message says what to fix.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import re
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2  # the SDK's HTTP library: a time-out or dropped connection in mid-stream arrives as its error, unwrapped

from kernel_lsp.agent.credentials import API_KEY_ENV, BASE_URL_ENV
from kernel_lsp.agent.credentials import api_key as environment_api_key
from kernel_lsp.findings import register_secret

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
MAX_RETRY_AFTER_S = 60.0  # a longer wait asked by the API is cut to this, so a pass never hangs on one header

# USD per million tokens (input, output), from https://platform.claude.com/docs/en/about-claude/pricing
# (standard tier, no prompt caching). Ids with a date suffix ("claude-sonnet-4-5-20250929") take their alias's price.
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4-6": (3.0, 15.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
}
_DATE_SUFFIX = re.compile(r"-\d{8}$")

RETRIED_KINDS = frozenset({"rate-limit", "overloaded", "server", "connection", "malformed"})
API_FAILURES = (anthropic.APIError, httpx2.TransportError)
# what the SDK raises on an answer that is no Messages API answer: a proxy's HTML page (an assertion on the
# content type), broken JSON in an event, an event for a block that never started
MALFORMED = (ValueError, KeyError, IndexError, TypeError, AttributeError, AssertionError)
DEFAULT_MAX_TURN_S = 900.0  # the longest one turn may take, retries included, whatever the server sends meanwhile


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0  # billed at the input price: what came after the last cache breakpoint the API matched
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0  # written to the prompt cache: CACHE_WRITE_FACTOR times the input price
    cache_read_input_tokens: int = 0  # read from it: CACHE_READ_FACTOR times the input price

    @property
    def billed_input_tokens(self) -> int:
        """Every input token of the turn, cached or not (what the request's prompt held)."""
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


CACHE_WRITE_FACTOR = 1.25  # the Messages API's price of a 5-minute cache write, per input token
CACHE_READ_FACTOR = 0.1  # and of a cache read
CACHE_CONTROL = {"type": "ephemeral"}


@dataclass(frozen=True)
class ModelTurn:
    blocks: list[dict]  # {"type": "text", "text"} | {"type": "tool_use", "id", "name", "input"}
    stop_reason: str  # "end_turn" | "tool_use" | "max_tokens" | ...
    usage: Usage
    cost_usd: float
    retries: int = 0  # retried attempts this turn took (rate limits, overloads, server errors)


MIN_THINKING_BUDGET = 1024  # the Messages API's least budget_tokens


class ModelError(Exception):
    """A model call that failed for good; kind is one of
    missing-key | auth | rate-limit | overloaded | timeout | connection | bad-request | server | malformed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def price_per_mtok(model: str) -> tuple[float, float] | None:
    return PRICES_PER_MTOK.get(_DATE_SUFFIX.sub("", model))


def cost_usd(model: str, usage: Usage, prices: tuple[float, float] | None = None) -> float:
    """Dollars for one turn's tokens at `prices` (USD per million input and output tokens), else at the price
    table's; a model missing from PRICES_PER_MTOK without prices costs 0, with a warning saying so (a pass with a
    dollar budget does not start then: agent/setup.py)."""
    price = prices or price_per_mtok(model)
    if price is None:
        _warn_unpriced(model)
        return 0.0
    input_price, output_price = price
    inputs = priced_input_tokens(usage.input_tokens, usage.cache_creation_input_tokens, usage.cache_read_input_tokens)
    return (inputs * input_price + usage.output_tokens * output_price) / 1_000_000


def priced_input_tokens(fresh: int, cache_written: int, cache_read: int) -> float:
    """Input tokens as the input price bills them: cache writes at CACHE_WRITE_FACTOR, reads at CACHE_READ_FACTOR."""
    return fresh + CACHE_WRITE_FACTOR * cache_written + CACHE_READ_FACTOR * cache_read


@functools.cache
def _warn_unpriced(model: str) -> None:
    log.warning("no price is known for model %s: its turns count as $0, so a dollar budget does not bind", model)


class ModelClient:
    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        model: str,
        max_tokens: int,
        temperature: float | None,
        max_retries: int = 4,
        timeout_s: float = 120.0,
        first_backoff_s: float = 1.0,
        max_turn_s: float = DEFAULT_MAX_TURN_S,
        prices: tuple[float, float] | None = None,
        thinking_budget: int = 0,
        prompt_caching: bool = True,
    ) -> None:
        self._api_key = api_key or environment_api_key() or None  # private: never logged, never in a repr
        register_secret(self._api_key)  # scrubbed from every finding and tool result, whatever its shape
        self.base_url = base_url or os.environ.get(BASE_URL_ENV) or None  # None: the SDK's default endpoint
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature  # None: the model's default (newer models refuse the parameter)
        self.max_retries = max_retries
        self.timeout_s = timeout_s  # the longest silence: before the answer starts, or between two of its pieces
        self.first_backoff_s = first_backoff_s
        self.max_turn_s = max_turn_s  # a turn as a whole, retries included: keep-alive pings do not extend it
        self.prices = prices  # USD per million input and output tokens; None: the price table's
        # extended thinking: this many thinking tokens a turn, on top of max_tokens for the answer; 0: off
        self.thinking_budget = max(MIN_THINKING_BUDGET, thinking_budget) if thinking_budget else 0
        self.prompt_caching = prompt_caching  # cache breakpoints on the stable prefix and the conversation so far

    def __repr__(self) -> str:
        return f"ModelClient(model={self.model!r}, base_url={self.base_url!r})"

    async def turn(self, system: str, messages: list[dict], tools: list[dict],
                   time_left_s: float | None = None) -> ModelTurn:
        """One assistant turn: retried on rate limits, overloads, server and connection errors and malformed
        answers; else ModelError. The whole turn, retries included, ends within max_turn_s and within
        `time_left_s` (the pass's wall budget left): a server that trickles bytes or sends only keep-alive pings
        is cut off there."""
        if not self._api_key:
            raise ModelError(
                "missing-key",
                f"no Anthropic API key: set {API_KEY_ENV} (or the setting anthropicApiKey) to let the agent call Claude",
            )
        limit_s = self.max_turn_s if time_left_s is None else max(0.0, min(self.max_turn_s, time_left_s))
        try:
            return await asyncio.wait_for(self._turn(system, messages, tools), limit_s)
        except TimeoutError:
            which = ("the pass's wall-time budget" if time_left_s is not None and time_left_s < self.max_turn_s
                     else "the longest a turn may take")
            raise ModelError("timeout", f"the model call was stopped after {limit_s:.0f} s ({which}): the model "
                                        "API kept the connection open without finishing its answer") from None

    async def _turn(self, system: str, messages: list[dict], tools: list[dict]) -> ModelTurn:
        retries = 0
        while True:
            try:
                message = await self._streamed_message(system, messages, tools)
                if not getattr(message, "stop_reason", None):
                    raise ValueError("the answer ended before its stop reason: the stream was cut short, or its "
                                     "events came in an order the Messages API never sends")
            except (*API_FAILURES, *MALFORMED) as error:
                failure = self._model_error(error)
                delay_s = self._retry_delay_s(error, failure, retries)
                if delay_s is None:
                    raise failure from error
                retries += 1
                log.warning(
                    "model API: %s; retry %d of %d in %.1f s", failure.message, retries, self.max_retries, delay_s
                )
                await asyncio.sleep(delay_s)
                continue
            return self._model_turn(message, retries)

    async def _streamed_message(self, system: str, messages: list[dict], tools: list[dict]) -> Any:
        # A client per turn: no connection outlives the event loop that made it, and nothing needs closing.
        # max_retries=0: our loop retries instead, counting and logging each retry, and retrying streamed errors too.
        sdk = anthropic.AsyncAnthropic(
            api_key=self._api_key, base_url=self.base_url, max_retries=0, timeout=self.timeout_s
        )
        async with sdk, sdk.messages.stream(**self._request(system, messages, tools)) as stream:
            return await stream.get_final_message()

    @property
    def turn_max_tokens(self) -> int:
        """max_tokens as sent: the answer's room, plus the thinking budget when thinking is on."""
        return self.max_tokens + self.thinking_budget

    def _request(self, system: str, messages: list[dict], tools: list[dict]) -> dict[str, Any]:
        if self.prompt_caching:
            system, tools, messages = cache_breakpoints(system, tools, messages)
        request: dict[str, Any] = {"model": self.model, "max_tokens": self.turn_max_tokens, "messages": messages}
        if system:
            request["system"] = system
        if tools:
            request["tools"] = tools
        if self.thinking_budget:
            # the API takes no temperature with thinking; thinking blocks go back in later turns as they came
            request["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        elif self.temperature is not None:
            request["extra_body"] = {"temperature": self.temperature}  # not a named argument of this SDK any more
        return request

    def _model_turn(self, message: Any, retries: int) -> ModelTurn:
        said = message.usage
        usage = Usage(said.input_tokens or 0, said.output_tokens or 0,
                      getattr(said, "cache_creation_input_tokens", None) or 0,
                      getattr(said, "cache_read_input_tokens", None) or 0)
        turn_cost = cost_usd(self.model, usage, self.prices)
        log.info(
            "model turn: %d input (+%d cache written, %d read) + %d output tokens, $%.4f, stop %s",
            usage.input_tokens, usage.cache_creation_input_tokens, usage.cache_read_input_tokens,
            usage.output_tokens, turn_cost, message.stop_reason,
        )
        return ModelTurn(
            blocks=[block for block in map(block_dict, message.content) if block is not None],
            stop_reason=message.stop_reason or "",
            usage=usage,
            cost_usd=turn_cost,
            retries=retries,
        )

    def _retry_delay_s(self, error: Exception, failure: ModelError, retries: int) -> float | None:
        if failure.kind not in RETRIED_KINDS or retries >= self.max_retries:
            return None
        asked = retry_after_s(error)
        if asked is not None:
            return min(asked, MAX_RETRY_AFTER_S)
        backoff = min(self.first_backoff_s * 2**retries, MAX_BACKOFF_S)
        return backoff * random.uniform(0.75, 1.0)  # jitter: clients that failed together do not retry together

    def _model_error(self, error: Exception) -> ModelError:
        if isinstance(error, (anthropic.APITimeoutError, httpx2.TimeoutException)):
            return ModelError(
                "timeout",
                f"the model API sent nothing for {self.timeout_s:g} s; try again, or raise the time-out",
            )
        if isinstance(error, (anthropic.APIConnectionError, httpx2.TransportError)):
            return ModelError(
                "connection",
                f"cannot reach the model API at {self.base_url or 'api.anthropic.com'}: {error.__cause__ or error}; "
                f"check the network and {BASE_URL_ENV}",
            )
        if isinstance(error, anthropic.APIStatusError):
            return self._status_error(error)
        if isinstance(error, MALFORMED):
            detail = str(error) or "it does not read as the Messages API's event stream"
            return ModelError("malformed", f"the answer from {self.base_url or 'api.anthropic.com'} is no Messages API "
                                           f"answer ({type(error).__name__}: {detail}); a proxy or gateway may have "
                                           f"answered instead: check {BASE_URL_ENV}")
        return ModelError("server", f"the model API answered something unexpected: {error}")

    def _status_error(self, error: anthropic.APIStatusError) -> ModelError:
        status, error_type = error.status_code, error.type or "error"
        said = f"{status} {error_type}: {error.api_message or 'no message'}"
        if status in (401, 403):
            return ModelError("auth", f"the model API refused the API key ({said}); check {API_KEY_ENV} or the setting anthropicApiKey")
        if status == 429:
            return ModelError("rate-limit", f"rate limited by the model API ({said})")
        if status == 529 or error_type == "overloaded_error":  # a streamed error event arrives with status 200
            return ModelError("overloaded", f"the model API is overloaded ({said})")
        if status >= 500 or error_type == "api_error":
            return ModelError("server", f"the model API failed ({said})")
        return ModelError("bad-request", f"the model API rejected the request for {self.model} ({said})")


def cache_breakpoints(system: str, tools: list[dict], messages: list[dict]) -> tuple[Any, list[dict], list[dict]]:
    """The request's prompt with cache breakpoints (copies; the conversation kept by the caller is not changed):
    one after the tools and the system prompt, which stay the same for a whole pass (the API caches tools, then
    system, then messages, as one prefix), and one on the last block of the last message, so the next turn reads
    the conversation so far from the cache and pays only for what was added. Two of the API's four."""
    if system:
        system_blocks: Any = [{"type": "text", "text": system, "cache_control": CACHE_CONTROL}]
    else:
        system_blocks = system
        tools = [*tools[:-1], {**tools[-1], "cache_control": CACHE_CONTROL}] if tools else tools
    if messages:
        last = messages[-1]
        content = last["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        if blocks and blocks[-1].get("type") not in ("thinking", "redacted_thinking"):
            blocks[-1] = {**blocks[-1], "cache_control": CACHE_CONTROL}
            messages = [*messages[:-1], {**last, "content": blocks}]
    return system_blocks, tools, messages


def block_dict(block: Any) -> dict | None:
    """The plain dict of a text, tool_use or thinking content block (thinking blocks, signature included, must go
    back unchanged in the next request of a tool-using conversation); other kinds (server tools) are not the
    agent's."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if block.type == "thinking":
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if block.type == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block.data}
    return None


def retry_after_s(error: Exception) -> float | None:
    """The wait the API asked for in retry-after-ms or retry-after (seconds); None when it asked for none."""
    response = getattr(error, "response", None)
    if response is None:
        return None
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return max(0.0, float(response.headers[header]) * scale)
        except (KeyError, ValueError):
            continue
    return None
