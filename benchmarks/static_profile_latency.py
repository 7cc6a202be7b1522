"""The static profile of a `.cu` (ptxas resources, SASS and its hints; no GPU) from the editor against the CLI:

    .venv/bin/python benchmarks/static_profile_latency.py [--repeat N] [--record]

On a copy of tests/fixtures/h200/kernels.cu (seven kernels), alternating N times in one run:
  - the CLI: `kernel-lsp profile kernels.cu --format json`, a fresh process each time, wall time as a shell sees it;
  - the editor: "Profile this kernel" (`kernel-lsp.profile` [uri]) through a real LSP client over stdio, round trip
    of the command, with the file open and its compile check done (as when a user clicks after the squiggles),
    in a server started once. The server profiles a `.cu` itself, in a compile slot, with no worker to start.
Target (issue 21): editor median <= 1.5x the CLI's median. Both results are checked to name the same kernels.
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import json
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

FIXTURE = ROOT / "tests" / "fixtures" / "h200" / "kernels.cu"
SERVER = [sys.executable, "-m", "kernel_lsp", "serve"]
TARGET_RATIO = 1.5


async def cli_once(path: Path) -> tuple[float, list[str]]:
    start = time.perf_counter()
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "kernel_lsp", "profile", str(path),
                                                   "--format", "json", stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    elapsed = time.perf_counter() - start
    assert process.returncode == 0, err.decode()[-2000:]
    return elapsed, sorted(k["kernel"] for k in json.loads(out)["kernels"])


async def editor_once(client: LanguageClient, uri: str) -> tuple[float, list[str], str]:
    start = time.perf_counter()
    outcome = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="kernel-lsp.profile", arguments=[uri]))
    elapsed = time.perf_counter() - start
    assert outcome.get("source") == "static" and outcome.get("kernels"), outcome
    return elapsed, sorted(outcome["kernels"]), outcome["problems"][0]


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["KERNEL_LSP_CACHE_DIR"] = str(root / "cache")
        path = root / "kernels.cu"
        text = FIXTURE.read_text()
        path.write_text(text)
        published = asyncio.Event()
        client = LanguageClient("kernel-lsp-bench", "1")
        client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(lambda params: published.set())
        client.feature("kernelLsp/workerStatus")(lambda params: workers.append(params))
        client.feature(types.WINDOW_SHOW_MESSAGE)(lambda params: None)
        workers: list = []
        await client.start_io(*SERVER)
        await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities(),
                                                             root_uri=root.as_uri()))
        client.initialized(types.InitializedParams())
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=path.as_uri(), language_id="cuda-cpp", version=1, text=text)))
        await asyncio.wait_for(published.wait(), 120)  # the compile check is done: the user sees the squiggles
        cli, editor, kernels, note = [], [], set(), ""
        for _ in range(max(repeat, 1)):
            elapsed, cli_kernels = await cli_once(path)
            cli.append(elapsed)
            elapsed, editor_kernels, note = await editor_once(client, path.as_uri())
            editor.append(elapsed)
            assert cli_kernels == editor_kernels, (cli_kernels, editor_kernels)
            kernels = set(cli_kernels)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
    assert not workers, f"the editor's static profile started a worker: {workers}"
    ratio = statistics.median(editor) / statistics.median(cli)
    print(f"note: {note}", file=sys.stderr)
    return [
        (f"CLI: kernel-lsp profile kernels.cu (a process each time, n={len(cli)})",
         f"{statistics.median(cli):.2f} s", "", ""),
        (f"editor: Profile this kernel on kernels.cu (server warm, n={len(editor)})",
         f"{statistics.median(editor):.2f} s", "", f"{len(kernels)} kernels, no worker started"),
        ("editor / CLI, medians", f"{ratio:.2f}x", f"<= {TARGET_RATIO}x", "met" if ratio <= TARGET_RATIO else "NOT met"),
    ]


if __name__ == "__main__":
    report.main("static_profile_latency.py", measure, default_repeat=3)
