"""The server's memory over a day of typing: RSS after N one-character didChange notifications on one document.

    .venv/bin/python benchmarks/edit_memory.py [--repeat N] [--record]

What a user does, with the default settings (compile on change on): a real `kernel-lsp serve` over stdio (pygls's
client), a `.cu` open, then N incremental changes typed along growing lines (a character at a time, Enter every
60), a short pause every 50 changes and one past the debounce every 500, so that compiles of some versions run
while typing goes on, as they do for a user, and a
hover at each checkpoint so the server has handled every change before it is measured. RSS (VmRSS of the server)
after 1,000 changes and at 0 / 5,000 / 10,000 / 20,000 (default N). Target (issue 43): at N, <= 1.15x the RSS after
the first 1,000 changes. A second row set with `compileOnChange: false` (what the first version of this benchmark
measured, issue 24).
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import asyncio
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
TARGET_RATIO = 1.15
LINE = 60  # characters typed before Enter
TEXT = "__global__ void scale(float* p, float f) { p[threadIdx.x] *= f; }\n"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def typed(changes: int, options: dict[str, object]) -> dict[int, float]:
    """RSS (MB) at each checkpoint of `changes` typed with the initialization options `options`."""
    checkpoints = sorted({0, min(1000, changes), *(n for n in (5000, 10000, 20000) if n < changes), changes})
    seen: dict[int, float] = {}
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
            capabilities=types.ClientCapabilities(), root_uri=root.as_uri(), initialization_options=options))
        client.initialized(types.InitializedParams())
        uri = path.as_uri()
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="cuda-cpp", version=1, text=TEXT)))
        hover = types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri),
                                  position=types.Position(line=0, character=17))
        await client.text_document_hover_async(hover)
        seen[0] = rss_mb(pid)
        line, column = 1, 0
        for i in range(1, changes + 1):
            at = types.Position(line=line, character=column)
            text = "\n" if column >= LINE else "x"
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=i + 1),
                content_changes=[types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at),
                                                                        text=text)]))
            line, column = (line + 1, 0) if text == "\n" else (line, column + 1)
            if i % 500 == 0:
                await asyncio.sleep(0.6)  # a pause past the debounce (500 ms): a compile of this version runs
            elif i % 50 == 0:
                await asyncio.sleep(0.05)  # a short pause in the typing
            if i in checkpoints:
                await client.text_document_hover_async(hover)  # every change before it is handled
                seen[i] = rss_mb(pid)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
    return seen


async def measure(changes: int) -> list[tuple[str, str, str, str]]:
    rows = []
    for label, options in (("defaults (compile on change)", {}),
                           ("compileOnChange off", {"compileOnChange": False})):
        seen = await typed(changes, options)
        first = seen[min(1000, changes)]
        for count, mb in sorted(seen.items()):
            target, met = "", ""
            if count == changes and count > 1000:
                target = f"<= {TARGET_RATIO:.2f}x the RSS after 1000 ({first * TARGET_RATIO:.1f} MB)"
                met = "met" if mb <= first * TARGET_RATIO else "NOT met"
            rows.append((f"{label}: server RSS after {count} changes", f"{mb:.1f} MB", target, met))
        growth = (seen[changes] - first) * 1024 / max(changes - min(1000, changes), 1)
        rows.append((f"{label}: growth per change after the first 1000", f"{growth:.2f} KiB", "", ""))
    return rows


if __name__ == "__main__":
    report.main("edit_memory.py", measure, default_repeat=20_000)
