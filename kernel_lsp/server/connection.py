"""The LSP connection: the client's bytes through FrameReader (framing.py) to pygls, over stdio or TCP, and a reply
to every request that pygls would leave unanswered.

pygls's own loop reads stdin with a reader that goes deaf on the first malformed frame (framing.py says how), so
`serve_stdio` and `serve_tcp` replace `start_io` and `start_tcp`: the same protocol object and writer, our reader.
On top of pygls, KernelProtocol answers what a client would otherwise wait on forever: a body that is not JSON
(-32700, id null: none can be read), a message that is not a JSON-RPC request (-32600: a JSON array, a value that
is not an object, `jsonrpc` missing or not "2.0", no `method`, a `method` or `id` of the wrong type; with the
request's id when it has one, else null), and params that do not fit their method (-32602). Nothing a client sends
ends the server: only `exit`, the end of the input, or a broken pipe does."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import select
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, BinaryIO

from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcParseError,
)
from pygls.io_ import StdoutWriter
from pygls.protocol import LanguageServerProtocol
from pygls.server import JsonRPCServer

from kernel_lsp.server.framing import Event, FrameReader, Problem

log = logging.getLogger(__name__)

CHUNK = 256 * 1024  # the most one read asks for: a pipe gives at most what it holds (64 KiB on Linux)
DRAIN = 16 * 1024 * 1024  # the most one ask of DescriptorChunks takes from a pipe that keeps having more
PAUSE_S = 0.05  # how long DescriptorChunks waits for the rest of a body before it hands over what came
EXIT_GRACE_S = 5.0  # how long the tasks still running when the server ends may take to stop


class _Answered:
    """A request answered with an error while it was read (its params did not fit its method): nothing to handle."""

    jsonrpc = "2.0"


ANSWERED = _Answered()


class KernelProtocol(LanguageServerProtocol):
    """JSON-RPC lets a request or notification leave `params` out; pygls's fallback message type for methods
    outside the LSP (kernelLsp/workspaceSummary) needs it, and would drop such a request unanswered.

    A request whose params do not fit its method's types (a position given as a string, a negative line, a
    diagnostic without a range) is answered -32602 with what did not fit; pygls only logs it, and the client
    would wait forever. `receive` takes what FrameReader read: -32700 and -32600 are answered there."""

    def receive(self, event: Event) -> None:
        """One event of the FrameReader. A Problem is logged (a body that is not JSON also answered -32700); a
        message that is not a request, notification or response is answered -32600 (`invalid_requests`); the
        rest goes to pygls as its own reader would hand it over."""
        if isinstance(event, Problem):
            log.warning("LSP input: %s", event.text)
            if event.parse_error:
                self._send_error(None, JsonRpcParseError.CODE, f"parse error: {event.text}")
            return
        invalid = invalid_requests(event.value)
        for request_id, why in invalid:
            log.warning("LSP input: an invalid request (id %s): %s", json.dumps(request_id), why)
            self._send_error(request_id, JsonRpcInvalidRequest.CODE, f"invalid request: {why}")
        if invalid:
            return
        try:
            self.handle_message(self.structure_message(event.value))
        except Exception as exc:  # as pygls's loop: logged and reported, and the next message is read
            log.exception("could not handle a message")
            self._server._report_server_error(exc, JsonRpcException)

    def _send_error(self, request_id: Any, code: int, message: str) -> None:
        """An error reply built by hand: the id is echoed as sent, even one of a type LSP does not allow."""
        self._send_data({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})

    def structure_message(self, data: dict[str, Any]):
        if isinstance(data, dict) and "method" in data and "params" not in data:
            data = {**data, "params": None}
        try:
            return super().structure_message(data)
        except (JsonRpcInvalidParams, JsonRpcInternalError) as exc:
            request_id = data.get("id") if isinstance(data, dict) else None
            if "method" not in data or not isinstance(request_id, int | str) or isinstance(request_id, bool):
                raise  # a notification or a response: there is no one to answer
            cause = str(exc.__cause__ or exc).strip().splitlines()
            log.warning("invalid params for %s (id %s): %s", data["method"], request_id, " ".join(cause)[:500])
            self._send_response(request_id, error=types.ResponseError(
                code=JsonRpcInvalidParams.CODE,
                message=f"invalid params for {data['method']}: {cause[0] if cause else type(exc).__name__}"))
            return ANSWERED

    def handle_message(self, message: Any) -> Any:
        if message is ANSWERED:
            return None
        return super().handle_message(message)

    def _execute_handler(self, msg_id: Any, handler: Any, callback: Any, args: Any = None, kwargs: Any = None):
        """pygls keeps each handler's future under its message id until a request's answer removes it; the futures
        of notifications (every didChange) and of the steps of its generator handlers are never removed, some KiB
        per keystroke for good. A finished future leaves the table here (a cancel only needs an unstarted one)."""
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        future = self._request_futures.get(msg_id)
        if future is not None:
            future.add_done_callback(lambda done, key=msg_id: self._forget_future(key, done))

    def _forget_future(self, key: Any, done: Any) -> None:
        if self._request_futures.get(key) is done:
            del self._request_futures[key]


def invalid_requests(value: Any) -> list[tuple[Any, str]]:
    """(id, what is wrong) for each -32600 reply that a JSON value read from the client needs; [] for a request,
    a notification or a response (no `method`, and `result` or `error`). A response without `"jsonrpc": "2.0"`
    is answered with id null, never its own: that id names one of the server's requests. A batch (a JSON array;
    LSP has none) gets one reply per request in it, or one with id null."""
    if isinstance(value, list):
        ids = [m["id"] for m in value if isinstance(m, dict) and "id" in m and "method" in m]
        return [(request_id, "a batch (a JSON array): LSP has none") for request_id in ids] or \
            [(None, "a batch (a JSON array): LSP has none")]
    if not isinstance(value, dict):
        return [(None, f"{json.dumps(value)[:40]} instead of an object")]
    request_id = value.get("id")
    if "method" not in value and "id" in value and ("result" in value or "error" in value):
        return [] if value.get("jsonrpc") == "2.0" else [(None, 'a response without "jsonrpc": "2.0"')]
    if value.get("jsonrpc") != "2.0":
        why = f'"jsonrpc" is {json.dumps(value["jsonrpc"])}, not "2.0"' if "jsonrpc" in value else 'no "jsonrpc"'
    elif "method" not in value:
        why = 'no "method"'
    elif not isinstance(value["method"], str):
        why = f'"method" is {json.dumps(value["method"])}, not a string'
    elif "id" in value and (not isinstance(request_id, int | str) or isinstance(request_id, bool)):
        why = f'"id" is {json.dumps(request_id)}, neither an integer nor a string'
    else:
        return []
    return [(request_id, why)]


async def serve_chunks(read: Callable[[int, bytearray], Awaitable[tuple[bytearray, bool]]],
                       protocol: KernelProtocol) -> int:
    """Hand each message of the input to the protocol until the input ends; then the exit status: 1 when it ended
    inside a message (logged), else 0. `exit` ends the process before that (SystemExit from pygls).
    `read(wanted, unread)` gives the reader's unread bytes and the next ones after them (no more at the end of
    the input; `wanted`: what the body being read still needs, for a reader that can wait for it) and whether the
    input has paused (FrameReader.feed)."""
    frames = FrameReader()
    ended = False
    while not ended:
        wanted = frames.wanted
        unread = frames.unread()
        size = len(unread)  # `read` may extend `unread` itself
        data, paused = await read(wanted, unread)
        ended = len(data) == size
        for event in frames.feed(data, paused or ended):
            protocol.receive(event)
    cut_off = frames.close()
    for event in cut_off:
        protocol.receive(event)
    log.info("the client closed the connection%s", "; exiting with status 1" if cut_off else "")
    return 1 if cut_off else 0


class DescriptorChunks:
    """Reads a file descriptor in a daemon thread when asked: the event loop never blocks on it, and a read still
    waiting when `exit` ends the process does not hold the process up (an executor's thread is joined at exit).
    os.read, not the BufferedReader of sys.stdin, whose lock a waiting daemon thread would hold while the
    interpreter closes it at exit (a fatal error).

    One ask waits for the first bytes, then takes what follows: all the pipe holds, and while fewer bytes than
    wanted (the rest of a body) have come, what the writer sends without pausing for PAUSE_S. So a large message
    costs a hop or two between threads, as pygls's `read(n)` does, not one per 64 KiB; a Content-Length that
    overshoots its body only delays the answer by PAUSE_S (FrameReader then parses the body early)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._asks: queue.SimpleQueue[tuple[int, bytearray, asyncio.AbstractEventLoop,
                                            asyncio.Future[tuple[bytearray, bool]]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"kernel-lsp-read-fd{fd}", daemon=True)

    async def read(self, wanted: int, unread: bytearray) -> tuple[bytearray, bool]:
        """`unread` and the next bytes after it (only `unread` at the end of the input), and whether the input
        paused after them."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[bytearray, bool]] = loop.create_future()
        self._asks.put((wanted, unread, loop, answer))
        if not self._thread.is_alive():
            self._thread.start()
        return await answer

    def _serve(self) -> None:
        waiting = select.poll()
        waiting.register(self._fd, select.POLLIN)
        while True:
            wanted, unread, loop, answer = self._asks.get()
            data = bytearray(len(unread) + max(CHUNK, min(wanted, DRAIN)))
            data[:len(unread)] = unread  # the start of a body; its rest is read in behind it, where it is parsed
            try:
                with memoryview(data)[len(unread):] as free:
                    size = last = os.readv(self._fd, [free])
                    while last and size < len(free) and waiting.poll(PAUSE_S * 1000 if size < wanted else 0):
                        last = os.readv(self._fd, [free[size:]])
                        size += last
                paused = not last or not waiting.poll(0)
            except OSError as exc:
                _post(loop, answer, None, exc)
                return
            del data[len(unread) + size:]
            if not _post(loop, answer, (data, paused), None) or not size:
                return


def _post(loop: asyncio.AbstractEventLoop, answer: asyncio.Future[tuple[bytearray, bool]],
          read: tuple[bytearray, bool] | None, error: BaseException | None) -> bool:
    """Hands a read to the loop; False when the loop is closed (the server is ending, after Ctrl-C say): nobody
    is waiting for it then."""
    try:
        loop.call_soon_threadsafe(_settle, answer, read, error)
    except RuntimeError:  # "Event loop is closed"
        return False
    return True


def _settle(answer: asyncio.Future[tuple[bytearray, bool]], read: tuple[bytearray, bool] | None,
            error: BaseException | None) -> None:
    if answer.done():
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(read)


def serve_stdio(server: JsonRPCServer, stdin: int, stdout: BinaryIO) -> int:
    """Serve the client on these (stdin: a file descriptor) until `exit` or the end of the input; the exit status
    (`exit`: 0 after `shutdown`, else 1, as LSP asks)."""
    server.protocol.set_writer(StdoutWriter(stdout))
    return run_server(server, serve_chunks(DescriptorChunks(stdin).read, server.protocol))


def serve_tcp(server: JsonRPCServer, host: str, port: int) -> int:
    """Serve the first client that connects to host:port, as serve_stdio serves its one client."""
    async def serve() -> int:
        status: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        clients: list[asyncio.StreamWriter] = []

        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            clients.append(writer)
            if len(clients) > 1:  # one client, one protocol: a second one would take over its replies
                log.warning("a second client connected; it is not served")
                writer.close()
                return
            server.protocol.set_writer(writer)
            try:
                status.set_result(await serve_chunks(lambda _, unread: _after(unread, reader.read(CHUNK)),
                                                     server.protocol))
            except OSError as exc:
                status.set_exception(exc)

        listening = await asyncio.start_server(connection, host, port)
        log.info("serving on %s:%s", host, port)
        async with listening:
            return await status

    return run_server(server, serve())


async def _after(unread: bytearray, read: Awaitable[bytes]) -> tuple[bytearray, bool]:
    """A StreamReader's bytes after the unread ones, taken as a pause each time: asyncio does not say whether more
    is waiting."""
    unread += await read
    return unread, True


def run_server(server: JsonRPCServer, serving: Coroutine[Any, Any, int]) -> int:
    """Run `serving` to its exit status, as asyncio.run would, but the tasks still running at the end get
    EXIT_GRACE_S to finish their cancellation, not for ever: on CPython 3.11 a subprocess cancelled while its
    pipes are being connected (a compile started just before `exit`) never finishes its `_wait`, and asyncio.run
    would leave the process alive after `exit`. Then the server's own shutdown (pygls: its thread pool)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(serving)
    except SystemExit as exc:  # pygls's `exit` handler
        return exc.code if isinstance(exc.code, int) else 1
    except OSError as exc:  # a broken pipe, a reset connection, an input that cannot be read
        log.error("the connection to the client failed: %s", exc)
        return 1
    finally:
        try:
            _wind_down(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()
            server.shutdown()


def _wind_down(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=EXIT_GRACE_S))
        if pending:
            log.warning("exiting with %d task(s) that did not stop within %g s: %s", len(pending), EXIT_GRACE_S,
                        ", ".join(sorted(task.get_coro().__qualname__ for task in pending)))
    loop.run_until_complete(loop.shutdown_asyncgens())
