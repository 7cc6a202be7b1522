"""A local stand-in for the Anthropic Messages API, for tests that drive the real `anthropic` client.

It answers POST /v1/messages from a script of turns, in order: content blocks (text, tool_use) with usage figures,
streamed as server-sent events when the request says "stream": true and as one JSON message otherwise; or an HTTP
error with the API's JSON error body and an optional retry-after header; each after an optional delay. It records
every request it got (path, headers, body).

    with FakeMessagesApi([tool_use_turn("compile", {"path": "k.py"}), text_turn("done")]) as api:
        client = ModelClient(api_key="test-key", base_url=api.url, ...)
        ...
        assert api.requests[0].body["stream"] is True
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable
from typing import Any, Self

DELTA_CHARS = 7  # text and tool input are streamed in pieces this long, so clients must join several deltas
PING_EVERY_S = 0.2


@dataclass(frozen=True)
class Turn:
    # {"type": "text", "text"} | {"type": "tool_use", "id", "name", "input"} (streamed with "cut_json": N, only the
    # first N characters of its JSON input arrive, as from a turn cut at max_tokens) | {"type": "thinking",
    # "thinking", "signature"} | {"type": "redacted_thinking", "data"}
    blocks: list[dict] = field(default_factory=list)
    stop_reason: str = "end_turn"
    input_tokens: int = 100
    output_tokens: int = 20
    status: int = 200  # not 200: answer with this error status instead of a message
    error_type: str = ""
    error_message: str = ""
    retry_after: float | None = None
    delay_s: float = 0.0  # wait this long before answering (time-out tests)
    stall_s: float = 0.0  # streamed: wait this long after message_start (a stream that stops in the middle)
    pings_s: float = 0.0  # streamed: after message_start, a keep-alive ping every PING_EVERY_S for this long
    raw: tuple[str, str] | None = None  # (content type, body): answer 200 with this instead (a proxy's page)
    raw_events: tuple[str, ...] = ()  # streamed: these server-sent event texts after message_start instead
    cache_write: int = 0  # usage's cache_creation_input_tokens
    cache_read: int = 0  # usage's cache_read_input_tokens


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]  # names in lower case
    body: dict[str, Any]

    @property
    def api_key(self) -> str | None:
        """The key the client sent: in x-api-key, or as the Bearer token this SDK version sends it in."""
        bearer = self.headers.get("authorization", "")
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        return bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None


_tool_ids = itertools.count(1)


def text_turn(text: str, *, input_tokens: int = 100, output_tokens: int = 20) -> Turn:
    return Turn([{"type": "text", "text": text}], "end_turn", input_tokens, output_tokens)


def tool_use_turn(
    name: str, input: dict, *, text: str = "", input_tokens: int = 100, output_tokens: int = 50
) -> Turn:
    """The model calling one tool, after an optional sentence of text."""
    call = {"type": "tool_use", "id": f"toolu_{next(_tool_ids):04d}", "name": name, "input": input}
    blocks = ([{"type": "text", "text": text}] if text else []) + [call]
    return Turn(blocks, "tool_use", input_tokens, output_tokens)


def text(content: str | list[dict]) -> str:
    """A message's text: its content when a string, else its text blocks joined (a prompt-cache breakpoint turns
    the last message's string into one text block)."""
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content if block.get("type") == "text")


def cut_turn(name: str, input: dict, cut_json: int, *, text: str = "") -> Turn:
    """A turn cut at max_tokens in the middle of a tool call's input: only its first `cut_json` characters arrive."""
    call = {"type": "tool_use", "id": f"toolu_{next(_tool_ids):04d}", "name": name, "input": input,
            "cut_json": cut_json}
    return Turn(([{"type": "text", "text": text}] if text else []) + [call], "max_tokens", 100, 8192)


def thinking_turn(thinking: str, then: Turn, signature: str = "sig-abc123") -> Turn:
    """`then` with a thinking block (its signature as the API sends it) before its other blocks."""
    return replace(then, blocks=[{"type": "thinking", "thinking": thinking, "signature": signature}, *then.blocks])


def error_turn(status: int, type: str, message: str, retry_after: float | None = None) -> Turn:
    return Turn(status=status, error_type=type, error_message=message, retry_after=retry_after)


def raw_turn(content_type: str, body: str) -> Turn:
    """HTTP 200 with a body that is no Messages API answer (an HTML page from a proxy, plain text, broken JSON)."""
    return Turn(raw=(content_type, body))


def broken_stream(*events: str) -> Turn:
    """A stream that starts as a message and goes on with these raw server-sent event texts."""
    return Turn([{"type": "text", "text": "x"}], raw_events=events)


def pinging(turn: Turn, pings_s: float) -> Turn:
    """A stream that sends only keep-alive pings for pings_s after message_start (a server that never answers)."""
    return replace(turn, pings_s=pings_s)


def delayed(turn: Turn, delay_s: float) -> Turn:
    return replace(turn, delay_s=delay_s)


def stalled(turn: Turn, stall_s: float) -> Turn:
    return replace(turn, stall_s=stall_s)


class FakeMessagesApi:
    """Serves the scripted turns on 127.0.0.1 at a free port while in its `with` block."""

    def __init__(self, turns: list[Turn], model: str = "claude-fake",
                 responder: Callable[[dict], Turn | None] | None = None, prompt_cache: bool = False) -> None:
        """`responder`, when given, answers each request from its body (a model whose next move depends on the
        conversation: passes that run at once interleave their requests); the script is used where it gives None.
        `prompt_cache`: each answer's input usage is counted from the request as the API counts it (PromptCache)
        instead of the turn's figure."""
        self.turns = list(turns)
        self.cache = PromptCache() if prompt_cache else None
        self.responder = responder
        self.model = model
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # ends pending delays at exit, so a timed-out test does not wait them out
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        # a short poll interval: shutdown() waits up to one interval, and every test pays it
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def turns_left(self) -> int:
        return len(self.turns)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _next_turn(self) -> Turn | None:
        with self._lock:
            return self.turns.pop(0) if self.turns else None


def _handler_class(api: FakeMessagesApi) -> type[BaseHTTPRequestHandler]:
    class MessagesHandler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            api._record(RecordedRequest(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if self.path.split("?")[0] == "/v1/messages":
                turn = (api.responder(body) if api.responder else None) or api._next_turn() or error_turn(500, "api_error", "the fake Messages API has no turn left")
            else:
                turn = error_turn(404, "not_found_error", f"the fake Messages API does not serve {self.path}")
            if api.cache is not None and turn.status == 200:
                fresh, written, read = api.cache.usage(body)
                turn = replace(turn, input_tokens=fresh, cache_write=written, cache_read=read)
            api._stopping.wait(turn.delay_s)
            try:
                self._answer(turn, body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a time-out test): nobody is left to answer

        def _answer(self, turn: Turn, body: dict) -> None:
            if turn.raw is not None:
                self._send_raw(*turn.raw)
            elif turn.status != 200:
                self._send_error(turn)
            elif body.get("stream"):
                self._send_events(turn, body.get("model", api.model))
            else:
                self._send_json(200, message_json(turn, body.get("model", api.model)))

        def _send_error(self, turn: Turn) -> None:
            headers = {} if turn.retry_after is None else {"retry-after": f"{turn.retry_after:g}"}
            error = {"type": "error", "error": {"type": turn.error_type, "message": turn.error_message}}
            self._send_json(turn.status, error, headers)

        def _send_json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("request-id", "req_fake")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _send_raw(self, content_type: str, text: str) -> None:
            data = text.encode()
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send_events(self, turn: Turn, model: str) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")  # HTTP/1.0: the stream ends when the connection closes
            self.end_headers()
            for event in stream_events(turn, model):
                self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                if event["type"] != "message_start":
                    continue
                api._stopping.wait(turn.stall_s)
                ends = time.monotonic() + turn.pings_s
                while time.monotonic() < ends and not api._stopping.is_set():
                    self.wfile.write(b'event: ping\ndata: {"type": "ping"}\n\n')
                    self.wfile.flush()
                    api._stopping.wait(PING_EVERY_S)
                if turn.raw_events:
                    for text in turn.raw_events:
                        self.wfile.write(text.encode())
                        self.wfile.flush()
                    return

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean; the requests are recorded instead

    return MessagesHandler


CHARS_PER_TOKEN = 4
LOOKBACK_BLOCKS = 20


class PromptCache:
    """The prompt cache as the Messages API documents it: the prompt is tools, then system, then messages, one
    prefix; a block with cache_control marks a breakpoint. A request reads the longest prefix ending at one of its
    breakpoints that an earlier request wrote, writes the prefix up to its last breakpoint beyond that, and pays the
    input price for the rest. Tokens are counted as characters / CHARS_PER_TOKEN of each block's JSON (without its
    cache_control), so any change before a breakpoint (a tool list that changed, a rewritten system prompt) misses."""

    def __init__(self) -> None:
        self.written: set[str] = set()

    def usage(self, body: dict) -> tuple[int, int, int]:
        """(input tokens, cache write tokens, cache read tokens) of one request."""
        blocks: list[tuple[str, bool]] = [(_unmarked(tool), "cache_control" in tool) for tool in body.get("tools", [])]
        system = body.get("system") or []
        blocks += [(json.dumps(system), False)] if isinstance(system, str) else \
            [(_unmarked(block), "cache_control" in block) for block in system]
        for message in body.get("messages", []):
            content = message["content"]
            if isinstance(content, str):
                blocks.append((message["role"] + content, False))
            else:
                blocks += [(message["role"] + _unmarked(block), "cache_control" in block) for block in content]
        prefix, tokens, ends = "", 0, []  # per block: (tokens up to and including it, the prefix's key, marked)
        for text, marked in blocks:
            prefix += text
            tokens += max(1, len(text) // CHARS_PER_TOKEN)
            ends.append((tokens, str(hash(prefix)), marked))
        marks = [index for index, (_, _, marked) in enumerate(ends) if marked]
        # a breakpoint also finds what was written at any of the LOOKBACK_BLOCKS block ends before it
        looked = {i for mark in marks for i in range(max(0, mark - LOOKBACK_BLOCKS), mark + 1)}
        read = max((ends[i][0] for i in looked if ends[i][1] in self.written), default=0)
        last = ends[marks[-1]][0] if marks else 0
        self.written.update(ends[i][1] for i in marks)
        written = max(0, last - read)
        return tokens - read - written, written, read


def _unmarked(block: dict) -> str:
    return json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True)


def message_json(turn: Turn, model: str) -> dict:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": turn.blocks,
        "stop_reason": turn.stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": turn.input_tokens, "output_tokens": turn.output_tokens,
                  "cache_creation_input_tokens": turn.cache_write, "cache_read_input_tokens": turn.cache_read},
    }


def stream_events(turn: Turn, model: str) -> list[dict]:
    """The server-sent events of one streamed message, as the Messages API orders them."""
    start = message_json(replace(turn, blocks=[]), model)
    start.update(stop_reason=None, usage={"input_tokens": turn.input_tokens, "output_tokens": 1,
                                          "cache_creation_input_tokens": turn.cache_write,
                                          "cache_read_input_tokens": turn.cache_read})
    events: list[dict] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    for index, block in enumerate(turn.blocks):
        events.extend(block_events(index, block))
    events.append({
        "type": "message_delta",
        "delta": {"stop_reason": turn.stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": turn.output_tokens},
    })
    events.append({"type": "message_stop"})
    return events


def block_events(index: int, block: dict) -> list[dict]:
    extra: list[dict] = []
    if block["type"] == "text":
        opening, delta_type, delta_key, whole = {"type": "text", "text": ""}, "text_delta", "text", block["text"]
    elif block["type"] == "thinking":
        opening = {"type": "thinking", "thinking": "", "signature": ""}
        delta_type, delta_key, whole = "thinking_delta", "thinking", block["thinking"]
        extra = [{"type": "content_block_delta", "index": index,
                  "delta": {"type": "signature_delta", "signature": block["signature"]}}]
    elif block["type"] == "redacted_thinking":
        opening, delta_type, delta_key, whole = dict(block), "", "", ""
    else:
        opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        delta_type, delta_key, whole = "input_json_delta", "partial_json", json.dumps(block["input"])
        whole = whole[: block.get("cut_json", len(whole))]
    deltas = [
        {"type": "content_block_delta", "index": index, "delta": {"type": delta_type, delta_key: piece}}
        for piece in pieces(whole)
    ] + extra
    return [
        {"type": "content_block_start", "index": index, "content_block": opening},
        *deltas,
        {"type": "content_block_stop", "index": index},
    ]


def pieces(text: str) -> list[str]:
    return [text[i : i + DELTA_CHARS] for i in range(0, len(text), DELTA_CHARS)]
