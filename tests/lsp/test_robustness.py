"""Bad input and missing or broken tools: a clear diagnostic or message, and the server keeps serving."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from kernel_lsp.findings import path_to_uri
from tests.lsp.helpers import (
    codes,
    initialize_params,
    needs_nvcc,
    open_document,
    replace_document,
    server_config,
    wait_for_publish,
)

OK_KERNEL = "__global__ void ok(int* p) { p[0] = 1; }\n"


async def still_serving(client: LanguageClient, workspace: Path, name: str = "alive.py") -> None:
    """The server answers a fresh document after whatever came before."""
    uri = open_document(client, workspace / name, "def f(:\n")
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics), timeout=30)
    assert codes(params) == ["python-syntax"]


def fake_tool(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize("configured_client", [{"nvccPath": "/nonexistent/cuda/bin/nvcc"}], indirect=True)
async def test_missing_nvcc_gives_one_message_and_a_diagnostic(configured_client: LanguageClient, workspace: Path):
    client = configured_client
    first = open_document(client, workspace / "a.cu", OK_KERNEL)
    second = open_document(client, workspace / "b.cu", OK_KERNEL)
    for uri in (first, second):
        params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
        assert codes(params) == ["nvcc-missing"]
        assert "nvccPath" in params.diagnostics[0].message
    shown = [m for m in client.messages if "CUDA compiler not found" in m.message]
    assert len(shown) == 1 and shown[0].type == types.MessageType.Error
    await still_serving(client, workspace)


@pytest.fixture
def broken_nvcc(workspace: Path) -> str:
    return fake_tool(workspace / "nvcc-broken", "echo 'nvcc: cannot load libnvvm' >&2\nexit 127\n")


async def test_broken_nvcc_says_so(client: LanguageClient, workspace: Path, broken_nvcc: str):
    client.set_configuration({"nvccPath": broken_nvcc}, section="kernelLsp")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={}))
    uri = open_document(client, workspace / "k.cu", OK_KERNEL)
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
    assert codes(params) == ["nvcc-missing"]
    assert "--version failed" in params.diagnostics[0].message and "cannot load libnvvm" in params.diagnostics[0].message


async def test_hung_nvcc_is_stopped_at_the_timeout(client: LanguageClient, workspace: Path):
    hung = fake_tool(workspace / "nvcc-hangs", 'if [ "$1" = --version ]; then echo "Cuda compilation tools, '
                                               'release 13.0, V13.0.88"; exit 0; fi\nsleep 600\n')
    client.set_configuration({"nvccPath": hung, "compileTimeoutS": 1}, section="kernelLsp")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={}))
    uri = open_document(client, workspace / "k.cu", OK_KERNEL)
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics), timeout=30)
    assert codes(params) == ["compile-timeout"]
    assert "within 1 s" in params.diagnostics[0].message
    await still_serving(client, workspace)


@needs_nvcc
async def test_binary_and_invalid_text_get_diagnostics_not_a_crash(client: LanguageClient, workspace: Path):
    junk = "".join(map(chr, range(0, 256))) + "\udcff\ud800 lone surrogates"
    uri = open_document(client, workspace / "junk.cu", junk)
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
    assert any(d.severity == types.DiagnosticSeverity.Error for d in params.diagnostics)
    py_uri = open_document(client, workspace / "junk.py", "\x00\x01 def \udcff(")
    params = await wait_for_publish(client, py_uri, lambda p: bool(p.diagnostics))
    assert "python-syntax" in codes(params)
    await still_serving(client, workspace)


@needs_nvcc
async def test_five_megabyte_file(client: LanguageClient, workspace: Path):
    body = "".join(f"__device__ float f{i}(float x) {{ return x * {i}.0f + 1.0f; }}\n" for i in range(90_000))
    text = body + "__global__ void big(float* p) { p[0] = f7(p[1]) + undefined_in_big; }\n"
    assert len(text) > 5_000_000
    uri = open_document(client, workspace / "big.cu", text)
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics), timeout=240)
    (error,) = [d for d in params.diagnostics if d.severity == types.DiagnosticSeverity.Error]
    assert error.range.start.line == 90_000 and "undefined_in_big" in error.message
    await still_serving(client, workspace)


@needs_nvcc
async def test_thousands_of_diagnostics_are_capped_errors_first_with_one_counting_the_rest(client: LanguageClient,
                                                                                         workspace: Path):
    """Generated garbage: 1,500 `#warning` lines, then 5 errors at the very end. The editor gets the default cap of
    500: the 5 errors (which come last in the file), the first 494 warnings, and one last diagnostic counting the
    1,006 warnings left out and naming the command that prints them all."""
    text = "".join(f"#warning generated {i}\n" for i in range(1500)) + "".join(f"int e{i} = ;\n" for i in range(5))
    path = workspace / "garbage.cu"
    uri = open_document(client, path, text)
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
    *shown, last = params.diagnostics
    assert len(params.diagnostics) == 500
    errors = [d for d in shown if d.severity == types.DiagnosticSeverity.Error]
    assert [d.range.start.line for d in errors] == list(range(1500, 1505))
    warnings = [d for d in shown if d.severity == types.DiagnosticSeverity.Warning]
    assert [d.range.start.line for d in warnings] == list(range(494))  # in the file's order
    assert last.code == "diagnostics-left-out" and last.severity == types.DiagnosticSeverity.Warning
    assert last.message.startswith("1006 more diagnostics not shown (1006 warnings): 499 of 1505 are"), last.message
    assert f"`kernel-lsp check {path}`" in last.message


@needs_nvcc
async def test_file_deleted_between_change_and_compile(client: LanguageClient, workspace: Path):
    folder = workspace / "gone"
    folder.mkdir()
    path = folder / "k.cu"
    path.write_text(OK_KERNEL)
    uri = open_document(client, path, OK_KERNEL)
    await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
    path.unlink()
    os.rmdir(folder)
    replace_document(client, uri, "__global__ void ok(int* p) { p[0] = nope; }\n", version=2)
    # nvcc's result (clangd's preliminary error may come first, where clangd is installed)
    params = await wait_for_publish(client, uri, lambda p: p.version == 2 and not any(
        "preliminary" in d.message for d in p.diagnostics))
    assert ['identifier "nope" is undefined' in d.message for d in params.diagnostics] == [True]


@needs_nvcc
async def test_include_cycle(client: LanguageClient, workspace: Path):
    (workspace / "a.cuh").write_text('#include "b.cuh"\n')
    (workspace / "b.cuh").write_text('#include "a.cuh"\n')
    text = '#include "a.cuh"\n' + OK_KERNEL
    uri = open_document(client, workspace / "cycle.cu", text)
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics), timeout=120)
    errs = [d for d in params.diagnostics if d.severity == types.DiagnosticSeverity.Error]
    assert errs and errs[0].range.start.line == 0
    await still_serving(client, workspace)


@needs_nvcc
async def test_a_named_pipe_and_a_symlink_loop_cost_only_themselves(workspace: Path):
    """A FIFO named like a kernel file would block whoever reads it, for good; a symlink loop that a `.cu`
    includes has no end. Present from the start, they are skipped with a message: the other files are still
    checked, a hover and a new document are still answered, and the server shuts down when asked."""
    os.mkfifo(workspace / "pipe.cu")
    os.symlink(workspace / "loop_b.cuh", workspace / "loop_a.cuh")
    os.symlink(workspace / "loop_a.cuh", workspace / "loop_b.cuh")
    (workspace / "uses_loop.cu").write_text('#include "loop_a.cuh"\n' + OK_KERNEL)
    (workspace / "closed.cu").write_text("__global__ void k(int* p) { p[0] = missing; }\n")
    client = await server_config().start()
    try:
        await client.initialize_session(initialize_params(workspace, {"debounceMs": 50}))
        closed = path_to_uri(workspace / "closed.cu")
        params = await wait_for_publish(client, closed, lambda p: bool(p.diagnostics), timeout=120)
        assert any("missing" in d.message for d in params.diagnostics), params  # the scan went on past them
        os.mkfifo(workspace / "late.cu")  # one more, while the server runs, reported as the editor's watcher would
        (workspace / "after.cu").write_text("__global__ void k(int* p) { p[0] = gone; }\n")
        after = path_to_uri(workspace / "after.cu")
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[
            types.FileEvent(uri=path_to_uri(workspace / "late.cu"), type=types.FileChangeType.Created),
            types.FileEvent(uri=after, type=types.FileChangeType.Created)]))
        params = await wait_for_publish(client, after, lambda p: bool(p.diagnostics), timeout=120)
        assert any("gone" in d.message for d in params.diagnostics), params
        uri = open_document(client, workspace / "open.cu", OK_KERNEL)
        await wait_for_publish(client, uri, lambda p: p.version == 1, timeout=120)
        await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=0, character=17)))
        await still_serving(client, workspace)
    finally:
        await asyncio.wait_for(client.shutdown_session(), 30)


def big_python(name: str = "kernel", kernels: int = 6_250) -> str:
    """A 50,000-line Triton file, 8 lines a kernel: `@triton.jit` on line 8k+3, `def {name}_{k}` on line 8k+4."""
    lines = ["import triton", "import triton.language as tl", ""]
    for k in range(kernels):
        lines += ["@triton.jit", f"def {name}_{k}(x_ptr, y_ptr, n, BLOCK: tl.constexpr):",
                  "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "    mask = offs < n",
                  "    x = tl.load(x_ptr + offs, mask=mask)", "    tl.store(y_ptr + offs, x * 2, mask=mask)", "    return",
                  ""]
    return "\n".join(lines) + "\n"


def hover_at(client: LanguageClient, uri: str, line: int, character: int) -> asyncio.Task:
    """The hover request as a task: sent when the task starts, so tasks made in turn send in turn."""
    return asyncio.ensure_future(client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=character))))


async def test_a_50000_line_python_file_is_parsed_while_other_requests_are_answered(client: LanguageClient,
                                                                                   workspace: Path):
    """A hover on the big file waits for its parse; a hover on a small document sent after it is answered first
    (with every parse on the loop, requests are answered in the order they came). The big file's answer then comes
    from its own text: its first kernel's card."""
    text = big_python()
    assert len(text.splitlines()) >= 50_000
    small = open_document(client, workspace / "small.cu", OK_KERNEL)
    big = open_document(client, workspace / "big.py", text)
    answered: list[str] = []
    on_big, on_small = hover_at(client, big, 4, 6), hover_at(client, small, 0, 17)
    on_big.add_done_callback(lambda _: answered.append("big"))
    on_small.add_done_callback(lambda _: answered.append("small"))
    big_card, _ = await asyncio.gather(on_big, on_small)
    assert answered == ["small", "big"]
    assert big_card is not None and "kernel_0" in big_card.contents.value, big_card
    await wait_for_publish(client, big, lambda p: p.version == 1)
    await still_serving(client, workspace)


async def test_typing_in_a_50000_line_file_answers_from_the_newest_text_and_checks_no_text_in_between(
        client: LanguageClient, workspace: Path):
    """Three changes come while the opened text is parsed: the two that the next change replaces are never handed
    on (never checked, never published); a hover sent meanwhile is answered from the newest text."""
    big = open_document(client, workspace / "big.py", big_python("opened"))
    for version, name in ((2, "typed"), (3, "retyped"), (4, "newest")):
        replace_document(client, big, big_python(name), version)
    card = await hover_at(client, big, 4, 6)
    assert card is not None and "newest_0" in card.contents.value, card
    await wait_for_publish(client, big, lambda p: p.version == 4)
    assert {p.version for _, p in client.published if p.uri == big} <= {1, 4}
