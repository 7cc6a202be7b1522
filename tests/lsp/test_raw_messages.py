"""JSON-RPC as some clients write it, byte for byte over the server's stdin: a request or notification of
kernel-lsp's own methods without `params` (JSON-RPC allows leaving it out) is handled, not dropped."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

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
    """`kernel-lsp serve` on raw pipes, initialized on `root` (no workspace check, no watching)."""
    server = await asyncio.create_subprocess_exec(
        *SERVER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
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
