"""A plain .cu: kernel-lsp's first squiggle against clangd's, and its full result against bare nvcc (issue 23).

    .venv/bin/python benchmarks/plain_cu_clangd.py [--repeat N] [--record]

The file is compile_latency.py's generated 2,000-line .cu. Both servers are started over stdio and get the same
edits as didChange (kernel-lsp with compileOnChange on, debounceMs 0 and resourceUsage "both", so that ptxas figures publish; clangd debounces by itself), alternating:
  - open: to the first publish of the file (clangd builds its preamble of the CUDA headers first);
  - an edit that mistypes a name in one kernel (another kernel each time): to the first publish holding that error
    (the first squiggle; target: kernel-lsp <= 1.0x clangd);
  - an edit that fixes it: to kernel-lsp's publish with ptxas figures and no error (the full result), against
    bare nvcc on the same text (target <= 1.05x).
kernel-lsp's first squiggle is its own clangd's when clangd is installed (compile/clangd.py; run with `--sync`, so
without the debounce an editor's clangd applies), nvcc's otherwise.
clangd 14 from Debian (`apt install clangd-14`), with `-xcuda --no-cuda-version-check` and sm_86 (the newest GPU
clang 14 knows; the headers and the diagnostics are the same) in compile_flags.txt.
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import report  # noqa: E402
from benchmarks.compile_latency import bare_nvcc, generated_source  # noqa: E402

KERNEL_LSP = [sys.executable, "-m", "kernel_lsp", "serve"]
CLANGD_FLAGS = "-xcuda\n--cuda-path=/usr/local/cuda\n--cuda-gpu-arch=sm_86\n--no-cuda-version-check\n-std=c++17\n"


class Server:
    def __init__(self, name: str, argv: list[str], options: dict | None) -> None:
        self.name, self.argv, self.options = name, argv, options
        self.client = LanguageClient("kernel-lsp-bench", "1")
        self.latest: tuple[float, list[types.Diagnostic]] = (0.0, [])
        self.arrived = asyncio.Event()

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_publish(params: types.PublishDiagnosticsParams) -> None:
            self.latest = (time.perf_counter(), params.diagnostics)
            self.arrived.set()

    async def start(self, root: Path) -> None:
        await self.client.start_io(*self.argv)
        await self.client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), root_uri=root.as_uri(), initialization_options=self.options))
        self.client.initialized(types.InitializedParams())

    async def until(self, started: float, done, timeout_s: float = 120.0) -> float:
        """Seconds from `started` to the first publish for which done(diagnostics) holds."""
        deadline = time.monotonic() + timeout_s
        while not (self.latest[0] >= started and done(self.latest[1])):
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), max(0.1, deadline - time.monotonic()))
        return self.latest[0] - started

    def open(self, uri: str, text: str) -> float:
        self.latest = (0.0, [])
        started = time.perf_counter()
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="cuda", version=1, text=text)))
        return started

    def change(self, uri: str, version: int, text: str) -> float:
        started = time.perf_counter()
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
        return started

    async def stop(self) -> None:
        await self.client.shutdown_async(None)
        self.client.exit(None)
        await self.client.stop()


def _errors(diagnostics: list[types.Diagnostic]) -> list[str]:
    return [d.message for d in diagnostics if d.severity == types.DiagnosticSeverity.Error]


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    clangd = shutil.which("clangd-14") or shutil.which("clangd")
    if clangd is None:
        raise SystemExit("clangd is not installed (apt install clangd-14)")
    text = generated_source()
    opened: dict[str, list[float]] = {"kernel-lsp": [], "clangd": []}
    squiggle: dict[str, list[float]] = {"kernel-lsp": [], "clangd": []}
    full, nvcc = [], []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "compile_flags.txt").write_text(CLANGD_FLAGS)
        path = root / "generated.cu"
        path.write_text(text)
        uri = path.as_uri()
        servers = [Server("kernel-lsp", KERNEL_LSP, {"compileOnChange": True, "debounceMs": 0, "resourceUsage": "both"}),
                   Server("clangd", [clangd, "--log=error"], None)]
        for server in servers:
            await server.start(root)
        try:
            for server in servers:
                opened[server.name].append(await server.until(server.open(uri, text), lambda d: True))
            for i in range(repeat):
                name = f"helper{(7 * i + 3) % 100}"
                typo = text.replace(f"= {name}(", f"= {name}_typo(", 1)
                for server in servers:
                    started = server.change(uri, 2 * i + 2, typo)
                    squiggle[server.name].append(await server.until(
                        started, lambda d, n=name: any(f"{n}_typo" in m for m in _errors(d))))
                fixed = text + f"// edit {i}\n"
                path.write_text(fixed)
                nvcc.append(await asyncio.to_thread(bare_nvcc, path))
                kernel_lsp = servers[0]
                started = kernel_lsp.change(uri, 2 * i + 3, fixed)
                full.append(await kernel_lsp.until(started, lambda d: not _errors(d) and any(
                    "registers" in x.message for x in d)))
                servers[1].change(uri, 2 * i + 3, fixed)
                print(f"  #{i + 1}: squiggle kernel-lsp {squiggle['kernel-lsp'][-1]:.2f} s, clangd "
                      f"{squiggle['clangd'][-1]:.2f} s; full {full[-1]:.2f} s, nvcc {nvcc[-1]:.2f} s", file=sys.stderr)
        finally:
            for server in servers:
                await server.stop()
    first = statistics.median(squiggle["kernel-lsp"]) / statistics.median(squiggle["clangd"])
    exact = statistics.median(full) / statistics.median(nvcc)
    return [
        ("open: first publish, kernel-lsp", f"{statistics.median(opened['kernel-lsp']):.2f} s", "", ""),
        ("open: first publish, clangd (builds its preamble)", f"{statistics.median(opened['clangd']):.2f} s", "", ""),
        ("edit: first squiggle, kernel-lsp", f"{statistics.median(squiggle['kernel-lsp']):.2f} s", "", ""),
        ("edit: first squiggle, clangd", f"{statistics.median(squiggle['clangd']):.2f} s", "", ""),
        ("first squiggle, kernel-lsp / clangd", f"{first:.2f}x", "<= 1.0x", "met" if first <= 1.0 else "not met"),
        ("full result (ptxas), kernel-lsp / bare nvcc", f"{exact:.2f}x ({statistics.median(full):.2f} s against "
         f"{statistics.median(nvcc):.2f} s)", "<= 1.05x", "met" if exact <= 1.05 else "not met"),
    ]


def versions() -> str:
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.split()[-1]
    clangd = shutil.which("clangd-14") or shutil.which("clangd") or "clangd"
    return f"nvcc {nvcc}, " + subprocess.run([clangd, "--version"], capture_output=True, text=True).stdout.split("\n")[0]


if __name__ == "__main__":
    report.main("plain_cu_clangd.py", measure, default_repeat=5, machine_extra=versions)
