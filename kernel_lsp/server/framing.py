"""The LSP base protocol's framing: bytes in, JSON messages out, whatever the client got wrong.

pygls's reader keeps reading header lines until one is exactly `Content-Length: N\\r\\n` and the next is blank;
any other header (a lowercase name, LF-only line ends, a length that is not a number, no header at all) makes it
read the next body as a header line and glue it to the next header, so no later header ever matches and the
server is deaf for good, while alive. A length longer than its body makes it wait for bytes that only the next
messages bring (then swallows them); a shorter one leaves the body's tail in front of the next header, with the
same result. FrameReader is liberal in what it accepts and resynchronises on what it cannot:

- Header names are case-insensitive, lines may end in CRLF or LF, spaces around the value are ignored, and
  whitespace between messages is skipped. A header block starts with Content-Length or Content-Type; other
  fields inside it are ignored (Content-Type too: bodies are UTF-8, or UTF-16/32 with a BOM, as `json` reads
  them). A `{` where a header line should be ends a block that lacks its blank line.
- A body must be one JSON value; a body that is not JSON and is followed by the next header is answered -32700
  (`Problem.parse_error`), as is one with nothing after it yet (it is kept, in case the rest of it is still on its
  way: the client that counted characters).
- The next message's header inside a body cannot be JSON: a Content-Length or Content-Type line (`HEADER_LINE`:
  no `"`, a real line end) can only be inside a JSON string, which may hold neither. So the reader looks for one
  in every body, and where a body does not fit its Content-Length it reads the message by its own extent instead:
  - longer than its body (the next header starts inside it): the body ends where that header starts;
  - shorter than its body (what follows is not a header: the client counted characters, not UTF-8 bytes): the
    body runs to the next header, or to the end of the bytes so far as soon as they parse as one JSON value;
  - no Content-Length, one that is not a number, or one above `MAX_BODY`, or no header at all (a `{` where a
    header should be): read the same way.
  A body that has fully arrived is handled before its Content-Length is reached: when the input has paused (the
  client waits for an answer) and the bytes so far can end a JSON value (`_ends_a_value`) and parse. So a
  request whose length overshoots is answered without waiting for more input, and a large body arriving in
  pieces is not parsed in vain each time (above EAGER_PARSE, only once it doubled: one more parse at most).
- Bytes that are neither a header nor a body (a stray line, a header block with a line that is no field) are
  skipped up to the next header line and logged with their size and first bytes.

Every problem is one `Problem` event (the server logs it as a warning, and answers -32700 for a body that is not
JSON); a message that was read despite its framing comes as a `Problem` saying so, then its `Message`. No input
leaves the reader waiting for bytes it does not need. The reader does no I/O: `feed` it what arrives (and
whether the input paused) and `close` it at the end of the input, which reports a message cut off there;
`wanted` and `unread` let a caller that fills memory of its own read the rest of a large body in place."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_BODY = 256 * 1024 * 1024  # a Content-Length above this is not believed (nor is a body without one that big)
EAGER_PARSE = 1024 * 1024  # a body up to this size is parsed early on every pause, a larger one when it doubled
MAX_LINE = 512  # a header line, or a header block without its blank line, is never longer than this

HEADER_LINE = re.compile(rb'content-(?:length|type)[ \t]*:[^"\r\n]*\r?\n', re.IGNORECASE)
HEADER_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?\n")
HEADER_PREFIX = re.compile(  # the start of a header line that has not fully arrived
    b"|".join([re.escape(name[:i]) for name in (b"content-length", b"content-type") for i in range(len(name))]
              + [rb'content-(?:length|type)[ \t]*(?::[^"\r\n]*\r?)?']), re.IGNORECASE)
SPACE = b" \t\r\n"
PREVIEW = 60  # bytes of what was skipped that a log line shows


@dataclass(frozen=True)
class Message:
    """One JSON value read from a body (any value: whether it is a JSON-RPC message is the protocol's call)."""

    value: Any


@dataclass(frozen=True)
class Problem:
    """What was wrong with the input, as one log line; `parse_error`: a body that is not JSON (answer -32700)."""

    text: str
    parse_error: bool = False


Event = Message | Problem

HEADERS, BODY, UNFRAMED, SKIPPING = "headers", "body", "unframed", "skipping"


class FrameReader:
    """Splits a byte stream into messages (see the module's docstring for what it accepts and how it recovers)."""

    def __init__(self, max_body: int = MAX_BODY) -> None:
        self._max_body = max_body
        self._buffer = bytearray()
        self._state = HEADERS
        self._events: list[Event] = []
        self._length: int | None = None  # the Content-Length of the body being read, when it had a usable one
        self._problem = ""  # UNFRAMED: why the body is read by its extent
        self._reported = False  # UNFRAMED: the body was already answered -32700 (nothing followed it yet)
        self._paused = True  # the input has nothing more for now (see feed)
        self._tried = 0  # the size of the body when it was last parsed early (see _whole_so_far)
        self._overrun: tuple[int, int] | None = None  # (Content-Length, bytes of it left) after an early message
        self._skipped = bytearray()  # SKIPPING: the first bytes skipped, for the log line ...
        self._skipped_size = 0  # ... and how many
        self._scanned = 0  # the buffer up to here has been searched for header lines ...
        self._line_start = 0  # ... and the line being searched starts here

    def feed(self, data: bytes | bytearray, paused: bool = True) -> list[Event]:
        """The messages and problems that the bytes so far complete. `paused`: nothing more is waiting to be read
        (False when the caller knows more is: a body that is not complete yet is then not parsed early)."""
        if self._buffer or not isinstance(data, bytearray):
            self._buffer += data
        else:  # the caller's buffer becomes ours, uncopied
            self._buffer = data
        self._paused = paused
        while self._advance():
            pass
        events, self._events = self._events, []
        return events

    def unread(self) -> bytearray:
        """The bytes not yet read into a message, handed over: the next `feed` must start with them. A caller that
        reads into memory of its own (DescriptorChunks) lays the rest of a large body behind its start this way,
        and `feed` takes that memory as it is, uncopied."""
        unread, self._buffer = self._buffer, bytearray()
        return unread

    @property
    def wanted(self) -> int:
        """How many more bytes the body being read needs, by its Content-Length (0 between messages)."""
        return max(0, self._length - len(self._buffer)) if self._state == BODY and self._length is not None else 0

    def close(self) -> list[Event]:
        """At the end of the input: a Problem for a message cut off there (or bytes that were not one), else []."""
        rest = bytes(self._buffer).strip(SPACE)
        if self._state == SKIPPING:
            self._drop_skipped(len(self._buffer))
            return [Problem(f"the input ended after {self._skipped_size} bytes that are not a message: "
                            f"{_preview(self._skipped, self._skipped_size)}")]
        if self._state == HEADERS and not rest:
            return []
        what = {HEADERS: "a header", BODY: f"a body of Content-Length {self._length}",
                UNFRAMED: "a body"}[self._state]
        return [Problem(f"the input ended inside {what} ({len(self._buffer)} bytes: {_preview(rest, len(rest))})")]

    def _advance(self) -> bool:
        """One step in the current state; False when it needs more bytes."""
        return {HEADERS: self._headers, BODY: self._body, UNFRAMED: self._unframed,
                SKIPPING: self._skipping}[self._state]()

    def _headers(self) -> bool:
        buffer = self._buffer
        start = _skip_space(buffer, 0)
        if self._overrun:  # a message read before its Content-Length was reached: only whitespace may follow
            length, left = self._overrun
            self._overrun = (length, left - start) if start == len(buffer) else None
            if start < len(buffer) and start < left:
                self._events.append(Problem(f"Content-Length {length} overran its message by {left - start} "
                                            f"bytes; the message was read to its end"))
        del buffer[:start]
        if not buffer:
            return False
        if buffer[0] in b"{[":
            self._read_unframed(None, "a message without a header")
            return True
        block = self._header_block()
        if block is None:
            return False
        if block is False:
            self._skip()
            return True
        fields, end, odd = block
        del buffer[:end]
        length = fields.get(b"content-length")
        if length is None:
            problem = "a header without Content-Length"
        elif not length.isdigit():
            problem = f"Content-Length {length.decode('latin-1')!r} is not a number"
        elif int(length) > self._max_body:
            problem = f"Content-Length {int(length)} is more than a message may have ({self._max_body} bytes)"
        else:
            if odd:
                self._events.append(Problem(f"a header with {odd}; the body was read from its first byte"))
            self._state, self._length = BODY, int(length)
            self._rescan()
            return True
        self._read_unframed(None, f"{problem}{f' (and {odd})' if odd else ''}")
        return True

    def _header_block(self) -> tuple[dict[bytes, bytes], int, str] | bool | None:
        """(fields, where the body starts, what was odd) of the header block at the buffer's start; None while it
        has not fully arrived; False when the buffer does not start with one."""
        buffer = self._buffer
        if not HEADER_LINE.match(buffer):
            head = bytes(buffer[:MAX_LINE])
            return None if len(head) < MAX_LINE and HEADER_PREFIX.fullmatch(head) else False
        fields: dict[bytes, bytes] = {}
        at = 0
        while True:
            if at < len(buffer) and buffer[at] in b"{[":
                return fields, at, "no blank line after it"
            end = buffer.find(b"\n", at, MAX_LINE)
            if end < 0:
                return None if len(buffer) < MAX_LINE else False
            if not buffer[at:end].strip(SPACE):
                return fields, end + 1, ""
            field = HEADER_FIELD.fullmatch(buffer, at, end + 1)
            if field is None:
                return False
            fields[field[1].lower()] = field[2]
            at = end + 1

    def _body(self) -> bool:
        buffer, length = self._buffer, self._length
        assert length is not None
        inside = self._header_line(before=length)
        if inside >= 0:
            self._read_unframed(length, "")
            return True
        if len(buffer) >= length:
            parsed, value = _json(buffer if len(buffer) == length else buffer[:length])
            if parsed:
                self._message(length, value)
                return True
            after = _skip_space(buffer, length)
            header_next = self._header_at(after)
            if header_next is None:  # nothing after it yet: answer now, and still read it if the rest comes
                self._events.append(Problem(f"a body that is not JSON: {value}", parse_error=True))
            elif header_next:
                self._events.append(Problem(f"a body that is not JSON: {value}", parse_error=True))
                del buffer[:length]
                self._state = HEADERS
                return True
            self._read_unframed(length, "", reported=header_next is None)
            return True
        if self._whole_so_far():
            parsed, value = _json(buffer)
            if parsed:
                self._overrun = (length, length - len(buffer))
                self._message(len(buffer), value)
                return True
        return False

    def _read_unframed(self, length: int | None, problem: str, reported: bool = False) -> None:
        """From here the body at the buffer's start is read by its extent (see the module's docstring)."""
        self._state, self._length, self._problem, self._reported = UNFRAMED, length, problem, reported
        self._rescan()

    def _unframed(self) -> bool:
        buffer = self._buffer
        end = self._header_line(before=len(buffer))
        if end >= 0:
            parsed, value = _json(buffer[:end])
            self._settle(end, parsed, value, "up to the next header")
            return True
        if self._whole_so_far():
            parsed, value = _json(buffer)
            if parsed:
                self._settle(len(buffer), parsed, value, "to its end")
                return True
        if len(buffer) > self._max_body:
            self._events.append(Problem(f"{self._why(len(buffer))}, and no header after {len(buffer)} bytes; "
                                        f"skipping to the next header"))
            self._skip()
            return True
        return False

    def _settle(self, end: int, parsed: bool, value: Any, how: str) -> None:
        """The body read by its extent ends at `end`: its message, or -32700 unless that was answered already."""
        why = self._why(end)
        if parsed:
            self._events.append(Problem(f"{why}; the message was read {how}"))
            self._message(end, value)
            return
        if not self._reported:
            self._events.append(Problem(f"{why}; it is not JSON either: {value}", parse_error=True))
        del self._buffer[:end]
        self._state = HEADERS

    def _why(self, size: int) -> str:
        """What was wrong with the framing of a body of `size` bytes read by its extent."""
        length = self._length
        if length is None:
            return self._problem
        if size < length:
            return f"Content-Length {length} overran its message by {length - size} bytes (the next header " \
                   f"started inside it)"
        if size > length:
            return f"Content-Length {length} was {size - length} bytes short of its message" \
                   f"{_counted_how(self._buffer[:size], length)}"
        return f"a body of Content-Length {length} that is not JSON"

    def _message(self, end: int, value: Any) -> None:
        self._events.append(Message(value))
        del self._buffer[:end]
        self._state = HEADERS

    def _skip(self) -> None:
        """Skip the bytes at the buffer's start up to the next header line (at least one byte: they are not one)."""
        self._state, self._skipped, self._skipped_size = SKIPPING, bytearray(), 0
        self._rescan()
        self._drop_skipped(1)

    def _skipping(self) -> bool:
        start = self._header_line(before=len(self._buffer))
        if start >= 0:
            self._drop_skipped(start)
            self._events.append(Problem(f"skipped {self._skipped_size} bytes that are not a message: "
                                        f"{_preview(self._skipped, self._skipped_size)}"))
            self._state = HEADERS
            return True
        self._drop_skipped(max(self._line_start, len(self._buffer) - MAX_LINE))  # keep a header line's start
        return False

    def _drop_skipped(self, size: int) -> None:
        self._skipped += self._buffer[:max(0, min(size, PREVIEW - len(self._skipped)))]
        self._skipped_size += size
        del self._buffer[:size]
        self._line_start = max(0, self._line_start - size)
        self._scanned = max(0, self._scanned - size)

    def _rescan(self) -> None:
        self._scanned = self._line_start = self._tried = 0

    def _whole_so_far(self) -> bool:
        """Whether to parse the body's bytes so far before its end is known: only when the input has paused (a
        client waiting for an answer), they end where a message can (`}` or `]`), and they grew since the last try;
        above EAGER_PARSE bytes, doubled, so that a large body arriving slowly costs at most one more parse."""
        size = len(self._buffer)
        if not self._paused or size <= self._tried or size > EAGER_PARSE and size < 2 * self._tried \
                or not _ends_a_value(self._buffer):
            return False
        self._tried = len(self._buffer)
        return True

    def _header_line(self, before: int) -> int:
        """Where the first header line that starts before `before` starts, or -1. Only lines with a real line end
        can be one, so this looks at each line once, as its `\\n` arrives (a body on one line: one memchr)."""
        buffer = self._buffer
        stop = min(len(buffer), before + MAX_LINE)
        while (end := buffer.find(b"\n", self._scanned, stop)) >= 0:
            found = HEADER_LINE.search(buffer, max(self._line_start, end - MAX_LINE), end + 1)
            if found and found.start() < before:
                return found.start()
            self._scanned = self._line_start = end + 1
        self._scanned = max(self._scanned, stop)
        return -1

    def _header_at(self, at: int) -> bool | None:
        """Whether a header line starts at `at`; None while the bytes there cannot tell yet."""
        if at >= len(self._buffer):
            return None
        if HEADER_LINE.match(self._buffer, at):
            return True
        head = bytes(self._buffer[at:at + MAX_LINE])
        return None if len(head) < MAX_LINE and HEADER_PREFIX.fullmatch(head) else False


def _json(body: bytes | bytearray) -> tuple[bool, Any]:
    """(True, the value) or (False, why it is not JSON)."""
    try:
        return True, json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting too deep
        return False, str(exc) or type(exc).__name__


def _ends_a_value(buffer: bytearray) -> bool:
    """Whether the bytes can end a JSON object or array: closing brackets (and whitespace) after what ends a
    value (`"`, a digit, true, false, null) or opens an empty one. Every complete message passes; a body cut
    inside a string of code mostly does not (`; }`, `\\n}`), so it is not parsed in vain."""
    at = len(buffer) - 1
    while at >= 0 and buffer[at] in SPACE:
        at -= 1
    if at < 0 or buffer[at] not in b"}]":
        return False
    while at >= 0 and buffer[at] in b"}] \t\r\n":
        at -= 1
    return at >= 0 and buffer[at] in b'"0123456789el{['


def _skip_space(buffer: bytearray, at: int) -> int:
    while at < len(buffer) and buffer[at] in SPACE:
        at += 1
    return at


def _counted_how(body: bytes | bytearray, length: int) -> str:
    """The likely cause when a body is longer than its Content-Length: a length in characters or UTF-16 units."""
    text = bytes(body).decode("utf-8", "replace")
    if len(text) == length or len(text.encode("utf-16-le")) // 2 == length:
        return " (the client counted characters, not UTF-8 bytes)"
    return ""


def _preview(head: bytes | bytearray, size: int) -> str:
    """The first bytes of `size` as a Python literal, for a log line."""
    return repr(bytes(head[:PREVIEW])) + (f"... ({size} bytes)" if size > PREVIEW else "")
