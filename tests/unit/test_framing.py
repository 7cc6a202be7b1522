"""The LSP framing reader (kernel_lsp/server/framing.py) on well-formed and malformed input, each fed whole, byte
by byte and in chunks of 7 bytes: the same messages come out however the bytes arrive, and every problem is one
Problem naming it."""

from __future__ import annotations

import json

import pytest

from kernel_lsp.server.framing import MAX_LINE, FrameReader, Message, Problem

SPLITS = ["whole", 1, 7]
FIRST = {"jsonrpc": "2.0", "id": 4, "method": "textDocument/hover", "params": {"uri": "file:///tmp/ñ∑.cu"}}
NEXT = {"jsonrpc": "2.0", "id": 5, "method": "shutdown"}


def body(message: dict) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode()


def frame(message: dict, length: int | None = None, name: str = "Content-Length", eol: str = "\r\n") -> bytes:
    data = body(message)
    return f"{name}: {len(data) if length is None else length}{eol}{eol}".encode() + data


def feed(reader: FrameReader, data: bytes, split: str | int) -> list:
    """Every event of feeding `data` whole or in chunks of `split` bytes."""
    size = len(data) if split == "whole" else split
    return [e for at in range(0, len(data), size) for e in reader.feed(data[at:at + size])]


def read(data: bytes, split: str | int, reader: FrameReader | None = None) -> list:
    """Every event of feeding `data` to a reader and closing it."""
    reader = reader or FrameReader()
    return feed(reader, data, split) + reader.close()


def ids(events: list) -> list:
    return [e.value["id"] for e in events if isinstance(e, Message)]


def problems(events: list) -> list[str]:
    return [e.text for e in events if isinstance(e, Problem)]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("first", [
    frame(FIRST), frame(FIRST, name="content-length"), frame(FIRST, name="CONTENT-LENGTH", eol="\n"),
    frame(FIRST).replace(b": ", b":\t ", 1).replace(b"\r\n\r\n", b"  \r\n\r\n", 1),
    b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n" + frame(FIRST),
    frame(FIRST).replace(b"\r\n\r\n", b"\r\nX-Trace: on\r\n\n", 1),
    b"\r\n\r\n" + frame(FIRST) + b"\r\n",
], ids=["exact", "lowercase", "uppercase LF only", "spaces and tabs", "Content-Type first", "other field",
        "blank lines around"])
def test_well_formed_frames_however_written_are_read_without_a_problem(first: bytes, split) -> None:
    events = read(first + frame(NEXT), split)
    assert ids(events) == [4, 5] and problems(events) == []


MALFORMED = [  # (what the first frame gets wrong, its bytes, what the problem says)
    ("Content-Length in characters", frame(FIRST, len(body(FIRST).decode())),
     f"Content-Length {len(body(FIRST).decode())} was 3 bytes short of its message (the client counted characters, "
     f"not UTF-8 bytes)"),  # ñ and ∑: one character each, 2 and 3 bytes
    ("Content-Length too short", frame(FIRST, len(body(FIRST)) - 20), "was 20 bytes short of its message"),
    ("Content-Length too long", frame(FIRST, len(body(FIRST)) + 20), "overran its message by 20 bytes"),
    ("Content-Length far too long", frame(FIRST, 10**6), f"overran its message by {10**6 - len(body(FIRST))} bytes"),
    ("Content-Length not a number", b"Content-Length: 8O\r\n\r\n" + body(FIRST), "Content-Length '8O' is not a number"),
    ("no Content-Length", b"Content-Type: application/json\r\n\r\n" + body(FIRST), "a header without Content-Length"),
    ("no header", body(FIRST), "a message without a header"),
    ("no blank line", frame(FIRST).replace(b"\r\n\r\n", b"\r\n", 1), "a header with no blank line after it"),
]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("name, first, says", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_frame_is_still_read_and_so_is_the_next(name: str, first: bytes, says: str, split) -> None:
    """Each frame whose header does not fit its body is read by the body's extent, with one Problem saying what
    was wrong, and the frame after it is read as usual."""
    events = read(first + frame(NEXT), split)
    assert ids(events) == [4, 5], events
    assert any(says in text for text in problems(events)), problems(events)
    assert all(e.parse_error for e in events if isinstance(e, Problem) and says not in e.text)  # a -32700 at most


@pytest.mark.parametrize("split", SPLITS)
def test_a_message_whose_length_overshoots_is_read_before_more_input_comes(split) -> None:
    """A request with a Content-Length too long is answered without waiting for bytes that may never come (the
    client waits for its answer); the overrun is reported once the next header shows it."""
    reader = FrameReader()
    assert ids(feed(reader, frame(FIRST, len(body(FIRST)) + 30), split)) == [4]
    events = reader.feed(frame(NEXT))
    assert ids(events) == [5] and problems(events) == [
        f"Content-Length {len(body(FIRST)) + 30} overran its message by 30 bytes; the message was read to its end"]


@pytest.mark.parametrize("split", SPLITS)
def test_a_body_that_is_not_json_is_one_parse_error_and_the_next_frame_is_read(split) -> None:
    events = read(b"Content-Length: 5\r\n\r\n{abc}" + frame(NEXT), split)
    assert ids(events) == [5]
    assert [(e.text.split(":")[0], e.parse_error) for e in events if isinstance(e, Problem)] == [
        ("a body that is not JSON", True)]


def test_a_body_that_is_not_json_is_answered_before_anything_follows_it() -> None:
    """A client that sent a broken request and waits gets its -32700 now, not when it sends something else."""
    reader = FrameReader()
    events = reader.feed(b'Content-Length: 19\r\n\r\n{"jsonrpc": "2.0", ')
    assert [e.parse_error for e in events] == [True]
    assert ids(reader.feed(frame(NEXT))) == [5]


@pytest.mark.parametrize("split", SPLITS)
def test_bytes_that_are_no_message_are_skipped_up_to_the_next_header(split) -> None:
    junk = b"print from a plugin\n" + b"x" * 3 * MAX_LINE + b"\r\n"  # longer than a header line may be
    events = read(junk + frame(NEXT), split)
    assert ids(events) == [5]
    assert problems(events) == [f"skipped {len(junk)} bytes that are not a message: {junk[:60]!r}... "
                                f"({len(junk)} bytes)"]


@pytest.mark.parametrize("split", SPLITS)
def test_a_json_body_holding_header_text_and_line_breaks_is_read_as_it_is(split) -> None:
    """What looks like a header inside a valid body (in a string, so with escaped line ends; or a pretty-printed
    body's own line breaks) never cuts it short: only a real line end can end a header, and a JSON string has none."""
    text = "Content-Length: 5\r\n\r\n{}\nContent-Type: x\n"
    message = {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"text": text}}
    pretty = json.dumps({**message, "id": 6}, indent=2).replace("\n", "\r\n").encode()
    events = read(frame(message) + f"Content-Length: {len(pretty)}\r\n\r\n".encode() + pretty + frame(NEXT), split)
    assert [e.value.get("params", {}).get("text") for e in events] == [text, text, None]


def test_a_large_body_in_pipe_sized_chunks_is_one_message() -> None:
    """A 5 MB didOpen arrives in 64 KiB reads, many of which end in a `}` of the text (so the reader tries them
    early): one message, nothing else."""
    text = "__global__ void k(float* p) { if (p) { p[0] = 1.0f; } }\n" * 90_000
    message = {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"text": text}}}
    events = read(frame(message) + frame(NEXT), 65536)
    assert [e.value["params"]["textDocument"]["text"] == text for e in events[:1]] == [True]
    assert ids(events[1:]) == [5] and len(events) == 2


def test_a_content_length_above_the_limit_is_not_believed() -> None:
    events = read(frame(FIRST, 10**9) + frame(NEXT), "whole", FrameReader(max_body=10**6))
    assert ids(events) == [4, 5]
    assert problems(events) == ["Content-Length 1000000000 is more than a message may have (1000000 bytes); the "
                                "message was read up to the next header"]


@pytest.mark.parametrize("cut_off, says", [
    (frame(FIRST)[:-10], f"the input ended inside a body of Content-Length {len(body(FIRST))} "
                          f"({len(body(FIRST)) - 10} bytes: "),
    (b"Content-Len", "the input ended inside a header (11 bytes: b'Content-Len')"),
    (b"not a message\n", "the input ended after 14 bytes that are not a message: b'not a message\\n'"),
])
def test_input_ending_inside_a_message_is_one_problem(cut_off: bytes, says: str) -> None:
    reader = FrameReader()
    assert [e for e in reader.feed(frame(NEXT) + cut_off) if isinstance(e, Problem)] == []
    assert [p.text[:len(says)] for p in reader.close()] == [says]


def test_input_ending_between_messages_is_no_problem() -> None:
    reader = FrameReader()
    assert ids(reader.feed(frame(NEXT) + b"\r\n")) == [5] and reader.close() == []
