"""JSON-RPC as some clients write it, byte for byte over the server's stdin: a request or notification of
kernel-lsp's own methods without `params` (JSON-RPC allows leaving it out) is handled, not dropped; every request
gets a reply, whatever is wrong with it; a frame whose header does not fit its body (kernel_lsp/server/framing.py)
is still read, logged, and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kernel_lsp.findings import path_to_uri
from tests.lsp.helpers import SERVER


def frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return f"Content-Length: {len(body)}\r\n\r\n".encode() + body


async def read_message(stdout: asyncio.StreamReader) -> dict:
    length = None
    while True:
        line = (await stdout.readline()).decode()
        if line in ("\r\n", ""):
            break
        if line.lower().startswith("content-length:"):
            length = int(line.split(":")[1])
    assert length is not None, "the server closed its stdout"
    return json.loads(await stdout.readexactly(length))


async def answer(stdout: asyncio.StreamReader, request_id: int | None, timeout: float = 30.0) -> dict:
    async def wait() -> dict:
        while True:
            message = await read_message(stdout)
            if message.get("id") == request_id and "method" not in message:
                return message
    return await asyncio.wait_for(wait(), timeout)


async def started_server(root: Path) -> asyncio.subprocess.Process:
    """`kernel-lsp serve` on raw pipes, initialized on `root` (no workspace check, no watching); its log is appended
    to root/server.log (`input_problems` reads it)."""
    server = await asyncio.create_subprocess_exec(
        *SERVER, "--log-file", str(root / "server.log"), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "KERNEL_LSP_CACHE_DIR": str(root / "cache")})
    server.stdin.write(frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "processId": None, "rootUri": path_to_uri(root), "capabilities": {},
        "initializationOptions": {"workspaceCheck": False, "watch": "off"}}}))
    assert "capabilities" in (await answer(server.stdout, 1))["result"]
    server.stdin.write(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    return server


async def shuts_down(server: asyncio.subprocess.Process, request_id: int, exit_timeout: float) -> None:
    """shutdown answered with null, then exit ends the process with status 0."""
    server.stdin.write(frame({"jsonrpc": "2.0", "id": request_id, "method": "shutdown"}))
    assert (await answer(server.stdout, request_id))["result"] is None
    server.stdin.write(frame({"jsonrpc": "2.0", "method": "exit"}))
    assert await asyncio.wait_for(server.wait(), exit_timeout) == 0


def input_problems(root: Path) -> list[str]:
    """What the server logged about its input (framing.Problem and invalid requests), in order."""
    return [line.split("LSP input: ", 1)[1] for line in (root / "server.log").read_text().splitlines()
            if "LSP input: " in line]


async def killed(server: asyncio.subprocess.Process) -> None:
    if server.returncode is None:
        server.kill()
        await server.wait()


async def test_requests_and_notifications_without_params_are_handled(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text("__global__ void k(float* p) { p[0] = 1.0f; }\n")
    server = await started_server(tmp_path)
    try:
        send = server.stdin.write
        send(frame({"jsonrpc": "2.0", "method": "kernelLsp/visibleDocuments"}))  # no params: nothing visible
        for request_id in range(2, 100):
            send(frame({"jsonrpc": "2.0", "id": request_id, "method": "kernelLsp/workspaceSummary"}))
            summary = (await answer(server.stdout, request_id))["result"]
            if summary["ready"]:
                break
            await asyncio.sleep(0.05)
        assert [Path(f["path"]).name for f in summary["files"]] == ["k.cu"]
        assert summary["files"][0]["compile"] == "not checked" and summary["watching"] == "off"
        await shuts_down(server, 100, exit_timeout=30)
    finally:
        await killed(server)


BAD_REQUESTS = [  # (method, params): wrong types and values a careless or buggy client sends
    ("textDocument/hover", {"textDocument": {"uri": "URI"}, "position": "3:4"}),
    ("textDocument/hover", {"textDocument": {"uri": "URI"}, "position": {"line": -1, "character": 0}}),
    ("textDocument/hover", {"textDocument": {"uri": "URI"}, "position": {"line": 10**9, "character": 10**9}}),
    ("textDocument/hover", {"textDocument": "URI", "position": {"line": 0, "character": 0}}),
    ("textDocument/hover", None),
    ("textDocument/codeLens", None),
    ("textDocument/codeLens", {"textDocument": {"uri": 42}}),
    ("textDocument/codeAction", {"textDocument": {"uri": "URI"}, "range": {"start": {"line": 0, "character": 0},
                                 "end": {"line": 0, "character": 0}}, "context": {"diagnostics": [{"bogus": 1}]}}),
    ("textDocument/codeAction", {"textDocument": {"uri": "URI"}, "range": "all", "context": {}}),
    ("workspace/executeCommand", {"command": 7, "arguments": "x"}),
    ("workspace/executeCommand", {"command": "kernel-lsp.profile", "arguments": [{"not": "a uri"}]}),
    ("kernelLsp/workspaceSummary", [1, 2, 3]),
]


async def test_every_malformed_request_gets_a_reply_and_the_server_keeps_serving(tmp_path: Path) -> None:
    """Each request with parameters of the wrong type or value is answered, with a result or a well-formed error
    (a client would otherwise wait forever); a request that is not JSON gets -32700; the server then still
    answers a good request and shuts down when asked."""
    path = tmp_path / "k.cu"
    path.write_text("__global__ void k(float* p) { p[0] = 1.0f; }\n")
    uri = path_to_uri(path)
    server = await started_server(tmp_path)
    try:
        send = server.stdin.write
        send(frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": uri, "languageId": "cuda-cpp", "version": 1, "text": path.read_text()}}}))
        unanswered, codes = [], []
        for request_id, (method, params) in enumerate(BAD_REQUESTS, start=10):
            params = json.loads(json.dumps(params).replace('"URI"', json.dumps(uri)))
            send(frame({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}))
            try:
                reply = await answer(server.stdout, request_id, timeout=10)
            except asyncio.TimeoutError:
                unanswered.append((method, params))
                continue
            assert ("result" in reply) != ("error" in reply), reply
            if "error" in reply:
                assert isinstance(reply["error"].get("code"), int) and reply["error"].get("message"), reply
                codes.append(reply["error"]["code"])
        assert not unanswered, f"{len(unanswered)} of {len(BAD_REQUESTS)} never answered: {unanswered}"
        assert codes.count(-32602) >= 7, codes  # those whose params do not fit their types: invalid params
        body = b'{"jsonrpc": "2.0", "id": 99, "method": "textDocument/hover", "params": {'
        send(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert (await answer(server.stdout, None, timeout=10))["error"]["code"] == -32700  # no id can be read
        send(frame({"jsonrpc": "2.0", "id": 100, "method": "textDocument/hover", "params": {
            "textDocument": {"uri": uri}, "position": {"line": 0, "character": 17}}}))
        assert "result" in await answer(server.stdout, 100)
        await shuts_down(server, 101, exit_timeout=20)
    finally:
        await killed(server)


def hover(request_id: int, uri: str, **extra: object) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "textDocument/hover", "params": {
        "textDocument": {"uri": uri}, "position": {"line": 0, "character": 17}, **extra}}


def opened(path: Path) -> dict:
    return {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": path_to_uri(path), "languageId": "cuda-cpp", "version": 1, "text": path.read_text()}}}


def header(length: int) -> bytes:
    return f"Content-Length: {length}\r\n\r\n".encode()


FRAMINGS: list[tuple[str, Callable[[bytes], bytes], str | None]] = [
    # (what the client gets wrong, a body framed that way, what the server logs about it: None for nothing)
    ("Content-Length too long", lambda body: header(len(body) + 40) + body, "overran its message by 40 bytes"),
    ("Content-Length too short", lambda body: header(len(body) - 3) + body, "was 3 bytes short of its message"),
    ("Content-Length not a number", lambda body: b"Content-Length: twelve\r\n\r\n" + body,
     "Content-Length 'twelve' is not a number"),
    ("no header", lambda body: body, "a message without a header"),
    ("header name in lowercase", lambda body: f"content-length: {len(body)}\r\n\r\n".encode() + body, None),
    ("LF-only line ends", lambda body: f"Content-Length: {len(body)}\n\n".encode() + body, None),
    ("a stray line before it", lambda body: b"plugin: hello\r\n" + header(len(body)) + body,
     "skipped 15 bytes that are not a message: b'plugin: hello\\r\\n'"),
]


@pytest.mark.parametrize("framed, logged", [f[1:] for f in FRAMINGS], ids=[f[0] for f in FRAMINGS])
async def test_a_request_in_a_malformed_frame_is_answered_and_the_server_keeps_serving(
        tmp_path: Path, framed: Callable[[bytes], bytes], logged: str | None) -> None:
    """The request in the malformed frame is answered before anything else is sent (pygls's reader never answers
    it, nor anything after it), then a well-formed one; shutdown and exit end the server with status 0. The log
    has one line naming the problem, none for a frame that is only written differently."""
    path = tmp_path / "k.cu"
    path.write_text("__global__ void k(float* p) { p[0] = 1.0f; }\n")
    server = await started_server(tmp_path)
    try:
        server.stdin.write(frame(opened(path)))
        server.stdin.write(framed(json.dumps(hover(10, path_to_uri(path))).encode()))
        assert "result" in await answer(server.stdout, 10)
        server.stdin.write(frame(hover(11, path_to_uri(path))))
        assert "result" in await answer(server.stdout, 11)
        await shuts_down(server, 12, exit_timeout=20)
    finally:
        await killed(server)
    problems = input_problems(tmp_path)
    assert [logged in line for line in problems] == ([True] if logged else []), problems


async def test_a_client_counting_characters_instead_of_bytes_is_answered(tmp_path: Path) -> None:
    """Every Content-Length counts characters, as a client measuring a string instead of its UTF-8 bytes would:
    the document (ñ and ∑ in its text: 2 and 3 bytes, one character each) is opened with its text whole (its
    diagnostics come), the hover (a ∑ in its token) is answered, shutdown and exit end the server with 0."""
    path = tmp_path / "syntax_error.py"
    path.write_text("def f(:  # ñ∑\n")

    def counted(message: dict) -> bytes:
        text = json.dumps(message, ensure_ascii=False)
        return f"Content-Length: {len(text)}\r\n\r\n".encode() + text.encode()

    document = {**opened(path), "params": {"textDocument": {**opened(path)["params"]["textDocument"],
                                                          "languageId": "python"}}}
    request = hover(10, path_to_uri(path), workDoneToken="∑-10")
    server = await started_server(tmp_path)
    try:
        server.stdin.write(counted(document))
        server.stdin.write(counted(request))

        async def hover_and_diagnostics() -> tuple[dict, dict]:
            """The hover's answer and the document's first diagnostics, in whichever order they come."""
            hovered = published = None
            while hovered is None or published is None:
                message = await read_message(server.stdout)
                if message.get("id") == 10 and "method" not in message:
                    hovered = message
                elif message.get("method") == "textDocument/publishDiagnostics" and message["params"]["diagnostics"]:
                    published = message["params"]
            return hovered, published
        hovered, published = await asyncio.wait_for(hover_and_diagnostics(), 30)
        assert "result" in hovered and published["uri"] == path_to_uri(path)
        assert [d["code"] for d in published["diagnostics"]] == ["python-syntax"]
        await shuts_down(server, 11, exit_timeout=20)
    finally:
        await killed(server)
    assert [line.split(";")[0] for line in input_problems(tmp_path)] == [
        f"Content-Length {len(json.dumps(message, ensure_ascii=False))} was {extra} bytes short of its message (the "
        f"client counted characters, not UTF-8 bytes)" for message, extra in ((document, 3), (request, 2))]


async def test_input_ending_inside_a_message_exits_1_and_a_restarted_server_serves(tmp_path: Path) -> None:
    """A client that dies in the middle of a message: the server logs what was cut off and exits with 1 (it is not
    left running, deaf); the server the client starts next, on the same folder and cache, serves as usual."""
    cut_off = b'{"jsonrpc": "2.0", "id": 5, "method": "shutdo'
    server = await started_server(tmp_path)
    try:
        server.stdin.write(header(200) + cut_off)
        server.stdin.close()
        assert await asyncio.wait_for(server.wait(), 30) == 1
    finally:
        await killed(server)
    assert input_problems(tmp_path) == [
        f"the input ended inside a body of Content-Length 200 ({len(cut_off)} bytes: {cut_off!r})"]
    restarted = await started_server(tmp_path)
    try:
        restarted.stdin.write(frame(hover(10, path_to_uri(tmp_path / "k.cu"))))
        assert "result" in await answer(restarted.stdout, 10)
        await shuts_down(restarted, 11, exit_timeout=20)
    finally:
        await killed(restarted)


INVALID = [  # (a message that is no JSON-RPC request, the id its -32600 reply carries)
    ([hover(20, "URI")], 20),
    ([], None),
    ("hover", None),
    ({"jsonrpc": "2.0", "id": 21, "params": {}}, 21),
    ({"id": 22, "method": "textDocument/hover", "params": {}}, 22),
    ({"jsonrpc": "1.0", "id": 23, "method": "textDocument/hover", "params": {}}, 23),
    ({"jsonrpc": "2.0", "id": 24, "method": ["textDocument/hover"]}, 24),
    ({"jsonrpc": "2.0", "id": 2.5, "method": "textDocument/hover", "params": {}}, 2.5),
    ({"jsonrpc": "2.0", "id": {"n": 26}, "method": "textDocument/hover", "params": {}}, {"n": 26}),
    ({"jsonrpc": "2.0", "id": None, "method": "textDocument/hover", "params": {}}, None),
    ({"jsonrpc": "2.0", "method": 7}, None),
]


async def test_every_invalid_request_gets_a_32600_with_its_id_and_the_server_keeps_serving(tmp_path: Path) -> None:
    """A JSON array, a value that is not an object, no method, jsonrpc missing or wrong, a method or an id of a
    wrong type: each is answered -32600, with its id as sent when it has one (else null); then a good request is
    answered and the server shuts down with status 0."""
    uri = path_to_uri(tmp_path / "k.cu")
    server = await started_server(tmp_path)
    try:
        for message, request_id in INVALID:
            server.stdin.write(frame(json.loads(json.dumps(message).replace('"URI"', json.dumps(uri)))))
            reply = await answer(server.stdout, request_id, timeout=10)
            assert reply["error"]["code"] == -32600 and "invalid request" in reply["error"]["message"], reply
        server.stdin.write(frame(hover(30, uri)))
        assert "result" in await answer(server.stdout, 30)
        await shuts_down(server, 31, exit_timeout=20)
    finally:
        await killed(server)
    assert len(input_problems(tmp_path)) == len(INVALID)
