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


async def answer(stdout: asyncio.StreamReader, request_id: int, timeout: float = 30.0) -> dict:
    async def wait() -> dict:
        while True:
            message = await read_message(stdout)
            if message.get("id") == request_id and "method" not in message:
                return message
    return await asyncio.wait_for(wait(), timeout)


async def test_requests_and_notifications_without_params_are_handled(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text("__global__ void k(float* p) { p[0] = 1.0f; }\n")
    server = await asyncio.create_subprocess_exec(
        *SERVER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "KERNEL_LSP_CACHE_DIR": str(tmp_path / "cache")})
    try:
        send = server.stdin.write
        send(frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "processId": None, "rootUri": path_to_uri(tmp_path), "capabilities": {},
            "initializationOptions": {"workspaceCheck": False, "watch": "off"}}}))
        assert "capabilities" in (await answer(server.stdout, 1))["result"]
        send(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        send(frame({"jsonrpc": "2.0", "method": "kernelLsp/visibleDocuments"}))  # no params: nothing visible
        for request_id in range(2, 100):
            send(frame({"jsonrpc": "2.0", "id": request_id, "method": "kernelLsp/workspaceSummary"}))
            summary = (await answer(server.stdout, request_id))["result"]
            if summary["ready"]:
                break
            await asyncio.sleep(0.05)
        assert [Path(f["path"]).name for f in summary["files"]] == ["k.cu"]
        assert summary["files"][0]["compile"] == "not checked" and summary["watching"] == "off"
        send(frame({"jsonrpc": "2.0", "id": 100, "method": "shutdown"}))
        assert (await answer(server.stdout, 100))["result"] is None
        send(frame({"jsonrpc": "2.0", "method": "exit"}))
        assert await asyncio.wait_for(server.wait(), 30) == 0
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
