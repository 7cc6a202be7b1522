"""The server's memory over a day of typing: RSS after N one-character didChange notifications on one document.

    .venv/bin/python benchmarks/edit_memory.py [--repeat N] [--record]

A real `kernel-lsp serve` over stdio (pygls's client), a `.cu` open, compile on change off (the compile itself is
not what is measured: `compileOnChange: false`), then N incremental one-character changes (default 20,000), a
hover after every 1,000 so the server has handled them all. RSS (VmRSS of the server process) before the first
change and after the last, and the growth per change. Target (issue 24): <= 120 MB after 20,000 changes.
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import report  # noqa: E402

SERVER = [sys.executable, "-m", "kernel_lsp", "serve"]
TARGET_MB = 120.0
TEXT = "__global__ void scale(float* p, float f) { p[threadIdx.x] *= f; }\n// "


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def measure(changes: int) -> list[tuple[str, str, str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["KERNEL_LSP_CACHE_DIR"] = str(root / "cache")
        path = root / "edited.cu"
        path.write_text(TEXT)
        client = LanguageClient("kernel-lsp-bench", "1")
        client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(lambda params: None)
        await client.start_io(*SERVER)
        pid = client._server.pid
        await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), root_uri=root.as_uri(),
            initialization_options={"compileOnChange": False, "workspaceCheck": False}))
        client.initialized(types.InitializedParams())
        uri = path.as_uri()
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="cuda-cpp", version=1, text=TEXT)))
        hover = types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri),
                                  position=types.Position(line=0, character=17))
        await client.text_document_hover_async(hover)
        before = rss_mb(pid)
        column = len(TEXT.splitlines()[-1])
        for i in range(changes):
            at = types.Position(line=1, character=column + i % 200)
            text = "x" if i % 400 < 200 else ""  # type 200 characters, delete them again: the text stays small
            change_range = types.Range(start=at, end=at) if text else types.Range(
                start=types.Position(line=1, character=column + 199 - i % 200),
                end=types.Position(line=1, character=column + 200 - i % 200))
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=i + 2),
                content_changes=[types.TextDocumentContentChangePartial(range=change_range, text=text)]))
            if i % 1000 == 999:
                await client.text_document_hover_async(hover)  # every change before it is handled
        await client.text_document_hover_async(hover)
        after = rss_mb(pid)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
    per_change_kib = (after - before) * 1024 / max(changes, 1)
    return [
        ("server RSS after initialize and open", f"{before:.1f} MB", "", ""),
        (f"server RSS after {changes} one-character changes", f"{after:.1f} MB", f"<= {TARGET_MB:.0f} MB",
         "met" if after <= TARGET_MB else "NOT met"),
        ("growth per change", f"{per_change_kib:.2f} KiB", "", ""),
    ]


if __name__ == "__main__":
    report.main("edit_memory.py", measure, default_repeat=20_000)
