"""Hover on a kernel name, answered from a profile kept in memory, through a real LSP client over stdio.

    .venv/bin/python benchmarks/hover_latency.py [--repeat N] [--record]

Opens a copy of tests/fixtures/h200/kernels.cu, imports the fixture's ncu export (details and raw pages) with
`kernel-lsp.importProfile`, then times N hovers over its seven kernel names, round trip as the client sees it:
  - hover on a profiled kernel (target: median <= 20 ms);
  - hover right after an edit (the document's kernels are parsed again first);
and the import itself (parse, hints, seven roofline charts written). --record appends the table to
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import report  # noqa: E402
FIXTURES = ROOT / "tests" / "fixtures" / "h200"
SERVER = [sys.executable, "-m", "kernel_lsp", "serve"]
KERNELS = ("vec_add", "transpose_read_uncoalesced", "smem_conflict", "divergent", "spills", "tiny_grid",
           "matmul_naive")
TARGET_S = 0.020


def name_positions(text: str) -> list[types.Position]:
    lines = text.splitlines()
    found = []
    for name in KERNELS:
        line = next(i for i, t in enumerate(lines) if "__global__" in t and f" {name}(" in t)
        found.append(types.Position(line=line, character=lines[line].index(f" {name}(") + 2))
    return found


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def figure(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.2f} ms (p90 {p90(values) * 1000:.2f} ms, n={len(values)})"


async def timed(call) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = await call
    return time.perf_counter() - t0, result


async def hover_times(client: LanguageClient, uri: str, positions: list[types.Position], count: int,
                      edit_text: str | None = None) -> list[float]:
    """`count` hovers round the kernel names; with edit_text, each after a didChange that adds a line at the end."""
    times = []
    for i in range(count):
        if edit_text is not None:
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=i + 2),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=edit_text + f"// edit {i}\n")]))
        elapsed, result = await timed(client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=positions[i % len(positions)])))
        assert result is not None and "top hints" in result.contents.value, result
        times.append(elapsed)
    return times


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["KERNEL_LSP_CACHE_DIR"] = str(root / "cache")  # the server's charts go here, not ~/.cache
        client = LanguageClient("kernel-lsp-bench", "1")
        client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(lambda params: None)  # expected; not timed here
        await client.start_io(*SERVER)
        await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), root_uri=root.as_uri(),
            initialization_options={"compileOnChange": False}))
        client.initialized(types.InitializedParams())
        path = root / "kernels.cu"
        text = (FIXTURES / "kernels.cu").read_text()
        path.write_text(text)
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=path.as_uri(), language_id="cuda-cpp", version=1, text=text)))
        imported, outcome = await timed(client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="kernel-lsp.importProfile",
            arguments=[str(FIXTURES / "ncu_details.csv"), str(FIXTURES / "ncu_raw.csv")])))
        assert outcome["status"] == "ok", outcome
        await asyncio.sleep(1.0)  # the compile check of the opened file finishes before hovers are timed
        positions = name_positions(text)
        await hover_times(client, path.as_uri(), positions, 10)  # warm-up
        cached = await hover_times(client, path.as_uri(), positions, repeat)
        edited = await hover_times(client, path.as_uri(), positions, repeat, edit_text=text)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
    return [
        ("importProfile (7 kernels, details + raw CSV, charts drawn)", f"{imported * 1000:.0f} ms", "", ""),
        ("hover on a profiled kernel (kernels.cu)", figure(cached), "<= 20 ms",
         "ok" if statistics.median(cached) <= TARGET_S else "MISSED"),
        ("hover right after an edit (kernels parsed again)", figure(edited), "<= 20 ms",
         "ok" if statistics.median(edited) <= TARGET_S else "MISSED"),
    ]


if __name__ == "__main__":
    report.main("hover_latency.py", measure, default_repeat=200)
