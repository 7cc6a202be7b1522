"""`kernel-lsp serve --tcp HOST:PORT`: a client connects over TCP and gets diagnostics; malformed frames are read
as over stdio."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from kernel_lsp.findings import path_to_uri
from tests.lsp.test_raw_messages import frame, read_message


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def connect(port: int, client: LanguageClient) -> None:
    for _ in range(100):
        try:
            await client.start_tcp("127.0.0.1", port)
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"kernel-lsp did not listen on 127.0.0.1:{port}")


async def test_serve_over_tcp(tmp_path: Path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "kernel_lsp", "serve", "--tcp", f"127.0.0.1:{port}"],
                              stderr=subprocess.DEVNULL)
    client = LanguageClient("tcp-test", "1")
    published: asyncio.Queue = asyncio.Queue()

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_publish(params: types.PublishDiagnosticsParams) -> None:
        published.put_nowait(params)

    try:
        await connect(port, client)
        result = await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), root_uri=path_to_uri(tmp_path)))
        assert result.server_info.name == "kernel-lsp"
        client.initialized(types.InitializedParams())
        uri = path_to_uri(tmp_path / "m.py")
        client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
            uri=uri, language_id="python", version=1, text="def f(:\n")))
        params = await asyncio.wait_for(published.get(), timeout=30)
        assert (params.uri, [d.code for d in params.diagnostics]) == (uri, ["python-syntax"])
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await client.stop()
        server.kill()
        server.wait()


async def test_tcp_reads_malformed_frames_as_stdio_does(tmp_path: Path):
    """Over TCP too the server reads frames with its own reader: an initialize with a lowercase header name and
    LF-only line ends is answered, a shutdown whose Content-Length counts characters (a ∑ in it) too, and exit ends
    the server with status 0."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "kernel_lsp", "serve", "--tcp", f"127.0.0.1:{port}"],
                              stderr=subprocess.DEVNULL, env={**os.environ, "KERNEL_LSP_CACHE_DIR": str(tmp_path)})
    try:
        for _ in range(100):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"kernel-lsp did not listen on 127.0.0.1:{port}")
        initialize = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "processId": None, "rootUri": path_to_uri(tmp_path), "capabilities": {},
            "initializationOptions": {"workspaceCheck": False, "watch": "off"}}}).encode()
        writer.write(f"content-length: {len(initialize)}\n\n".encode() + initialize)
        assert "capabilities" in (await asyncio.wait_for(read_message(reader), 30))["result"]
        shutdown = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "shutdown", "params": None,
                               "note": "∑"}, ensure_ascii=False)
        writer.write(f"Content-Length: {len(shutdown)}\r\n\r\n".encode() + shutdown.encode())
        while (message := await asyncio.wait_for(read_message(reader), 30)).get("id") != 2:
            pass
        assert message["result"] is None
        writer.write(frame({"jsonrpc": "2.0", "method": "exit"}))
        await writer.drain()
        assert await asyncio.to_thread(server.wait, 30) == 0
    finally:
        server.kill()
        server.wait()
