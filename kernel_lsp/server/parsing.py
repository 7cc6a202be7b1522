"""Big Python documents parsed away from the event loop, and the features told of each document only once its text is
parsed.

ast.parse holds the GIL for the whole parse (over a second for a 50,000-line file), so neither the loop nor a thread
of the server can parse a big file without stalling every request: `ParseProcess` parses texts of
`LARGE_PARSE` characters or more in a child process (`python -m kernel_lsp.server.parsing`; `kernel-lsp serve`
offers it to kernel_lsp.sources, so every parse of the server goes there, those of its threads too), and the model
comes back into the sources' memo, where the features' own `parse_python` calls find it. Its dataclasses come back
as calls of their constructors (`_Rebuilt`): a plain unpickle holds the GIL throughout, and leaves every object with a
`__dict__` of its own, which made the garbage collector's full passes five times longer (236 ms instead of 49 with 4
models of 6,250 kernels kept).

`DocumentEvents` hands each document's notifications (open, change, save, close) to the features in the order they
came. One whose text is big and not parsed yet waits for that parse in a thread (the loop goes on answering), and the
notifications after it wait behind it; a change followed by another change is dropped (the next carries the newer
text), so typing in a big file never parses more than the text in flight and the newest. Meanwhile the features see
the document as they were last told of it (`waiting`, through the server's OpenDocuments): not open yet, or its
earlier text, so none parses the waiting text on the loop (a settings change republishing every open document, a
save verifying the candidates open beside it). A request on a document (hover, code lens, code action) waits until
its notifications are handed on and the text it holds now is parsed, so an answer never comes from a text older than
the last one sent. A document whose text is small goes straight through, as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from kernel_lsp.process.frames import read_frame, write_frame
from kernel_lsp.process.isolation import with_package_on_path
from kernel_lsp.sources import LARGE_PARSE, PythonModel, parse_python, parsed, python_model

log = logging.getLogger(__name__)


class ParseProcess:
    """One child process, started on the first big parse, in a session of its own (a Ctrl-C at the terminal is the
    server's to handle; an exit of the server ends its stdin, and it). One text at a time; a child that fails is
    replaced at the next parse, and this text parsed here."""

    def __init__(self) -> None:
        self._child: subprocess.Popen | None = None
        self._lock = threading.Lock()  # parses come from the loop's threads; the child takes one at a time

    def parse(self, text: str) -> PythonModel:
        """The text's model (blocks the calling thread, which holds no GIL while the child parses)."""
        with self._lock:
            try:
                child = self._started()
                write_frame(child.stdin.fileno(), {"text": text.encode("utf-8", "surrogatepass")})
                answer = read_frame(child.stdout.fileno())
            except OSError as exc:
                log.warning("the parsing process failed (%s)", exc)
                answer = None
            if answer is None:
                self._stop()
        if answer is None:
            log.warning("parsing a %d-character text in the server instead", len(text))
            return python_model(text)
        return pickle.loads(answer["model"])  # our own child's answer

    def close(self) -> None:
        """Ends the child now (a parse in flight is then made in its caller's thread)."""
        child = self._child
        if child is not None:
            child.kill()

    def _started(self) -> subprocess.Popen:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen([sys.executable, "-m", "kernel_lsp.server.parsing"], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, start_new_session=True,
                                           env=with_package_on_path(dict(os.environ)))  # this server's own code
        return self._child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()


class _Rebuilt(pickle.Pickler):
    """Pickles each dataclass as the call of its constructor with its fields (all of the model's take every field):
    unpickled, it is built as the parse builds it, in Python code between whose steps the loop may take the GIL."""

    def reducer_override(self, obj: Any) -> Any:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return type(obj), tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))
        return NotImplemented


def _pickled(model: PythonModel) -> bytes:
    buffer = io.BytesIO()
    _Rebuilt(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(model)
    return buffer.getvalue()


def serve_parses() -> None:
    """The child: a text in on stdin, its model out on stdout, frame after frame, until stdin ends."""
    while (request := read_frame(sys.stdin.fileno())) is not None:
        model = python_model(request["text"].decode("utf-8", "surrogatepass"))
        write_frame(sys.stdout.fileno(), {"model": _pickled(model)})


@dataclass(frozen=True)
class DocumentEvent:
    kind: str  # open | change | save | close
    uri: str
    version: int | None = None
    text: str | None = None  # None for close


@dataclass(frozen=True)
class HandedDocument:
    """A document as its last notification handed on told the features (what they see while the next ones wait)."""
    uri: str
    version: int | None
    source: str


def needs_parse(uri: str, text: str | None) -> bool:
    """A big .py text whose model is not kept yet: the features would parse it where they stand."""
    return (text is not None and len(text) >= LARGE_PARSE and urlparse(uri).path.endswith(".py")
            and parsed(text) is None)


class DocumentEvents:
    """Hands document notifications on (`hand_on(event)`), per document in order, each once its text is parsed;
    `text_of(uri)` is the document's text now (None when it is not open). Documents are keyed by percent-decoded
    URI, as pygls keys them; `waiting` holds each whose notifications wait, as the features were last told of it
    (None: not opened yet)."""

    def __init__(self, hand_on: Callable[[DocumentEvent], None], text_of: Callable[[str], str | None]) -> None:
        self._hand_on = hand_on
        self._text_of = text_of
        self._queues: dict[str, deque[DocumentEvent]] = {}
        self._drains: dict[str, asyncio.Task] = {}
        self._handed: dict[str, HandedDocument] = {}  # every open document, as last handed on
        self.waiting: dict[str, HandedDocument | None] = {}

    def add(self, event: DocumentEvent) -> None:
        key = unquote(event.uri)
        queue = self._queues.get(key)
        if queue is None:
            if not needs_parse(event.uri, event.text):
                self._hand(event)  # nothing waits: at once, as the notification is read
                return
            queue = self._queues[key] = deque()
            self.waiting[key] = self._handed.get(key)
            self._drains[key] = asyncio.ensure_future(self._drain(key, queue))
        queue.append(event)

    def _hand(self, event: DocumentEvent) -> None:
        key = unquote(event.uri)
        if event.kind == "close":
            self._handed.pop(key, None)
        elif event.text is not None:
            self._handed[key] = HandedDocument(event.uri, event.version, event.text)
        if key in self.waiting:
            self.waiting[key] = self._handed.get(key)
        self._hand_on(event)

    async def settled(self, uri: str) -> None:
        """Returns once the document's notifications are handed on and the text it holds now is parsed."""
        while (drain := self._drains.get(unquote(uri))) is not None:
            await asyncio.shield(drain)  # a cancelled request leaves the notifications going
        text = self._text_of(uri)
        if needs_parse(uri, text):
            await asyncio.to_thread(parse_python, text)

    async def close(self) -> None:
        """Shutdown: the notifications still waiting are dropped."""
        drains = list(self._drains.values())
        for drain in drains:
            drain.cancel()
        await asyncio.gather(*drains, return_exceptions=True)

    async def _drain(self, key: str, queue: deque[DocumentEvent]) -> None:
        try:
            while queue:
                if not _superseded(queue):
                    event = queue[0]
                    if needs_parse(event.uri, event.text):
                        await asyncio.to_thread(parse_python, event.text)
                    if not _superseded(queue):  # a newer change may have come during the parse
                        try:
                            self._hand(event)
                        except Exception:  # a feature's bug costs this notification, not the ones after it
                            log.exception("handing %s of %s to the features failed", event.kind, event.uri)
                queue.popleft()
        finally:
            self._queues.pop(key, None)
            self._drains.pop(key, None)
            self.waiting.pop(key, None)


def _superseded(queue: deque[DocumentEvent]) -> bool:
    """The first is a change the next change replaces (its text is the document's as of that next change)."""
    return queue[0].kind == "change" and len(queue) > 1 and queue[1].kind == "change"


if __name__ == "__main__":
    serve_parses()
