"""Profiles in the editor through a real LSP client: importing the H200 fixture's ncu export, hover cards on kernel
names, hint diagnostics (filterable by code), the "Profile this kernel" action, and the profile command."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Union

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from kernel_lsp.findings import uri_to_path
from kernel_lsp.server.hover_card import NO_PROFILE
from tests.conftest import FIXTURES
from tests.lsp.conftest import FIGURES_AS_DIAGNOSTICS
from tests.lsp.helpers import (
    SERVER,
    initialize_params,
    needs_nvcc,
    open_document,
    recording_client,
    wait_for_publish,
)

CHARTS = Path(tempfile.mkdtemp(prefix="kernel-lsp-test-cache-"))  # the server's cache folder: charts land here
PROFILE_CODE = re.compile(r"^(ncu|hint)-")

LOAD_INLINE = '''\
import triton
from torch.utils.cpp_extension import load_inline

cuda_source = """
__global__ void vec_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""
module = load_inline(name="vec", cpp_sources="", cuda_sources=cuda_source)


@triton.jit
def tiny_grid(x_ptr):
    pass
'''


def code_action_client() -> LanguageClient:
    """The recording client, reading codeAction replies right: lsprotocol's converter structures a CodeAction
    (whose `command` is an object) as a Command with that object as its string."""
    client = recording_client()
    converter = client.protocol._converter
    converter.register_structure_hook(
        Union[types.Command, types.CodeAction],
        lambda obj, _: converter.structure(obj, types.Command if isinstance(obj.get("command"), str)
                                           else types.CodeAction))
    return client


CONFIG = ClientServerConfig(server_command=SERVER, client_factory=code_action_client,
                            server_env={**os.environ, "KERNEL_LSP_CACHE_DIR": str(CHARTS)})


@pytest_lsp.fixture(config=CONFIG)
async def client(lsp_client: LanguageClient, workspace: Path, request):
    options = {"debounceMs": 50, "compileOnChange": False, **FIGURES_AS_DIAGNOSTICS, **getattr(request, "param", {})}
    await lsp_client.initialize_session(initialize_params(workspace, options))
    yield
    await lsp_client.shutdown_session()


def open_kernels(client: LanguageClient, workspace: Path) -> tuple[str, list[str]]:
    path = workspace / "kernels.cu"
    shutil.copy(FIXTURES / "kernels.cu", path)
    text = path.read_text()
    return open_document(client, path, text), text.splitlines()


async def import_fixture(client: LanguageClient, raw: bool = True) -> dict:
    args = [str(FIXTURES / "ncu_details.csv")] + ([str(FIXTURES / "ncu_raw.csv")] if raw else [])
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.importProfile", arguments=args))


def name_position(lines: list[str], name: str) -> types.Position:
    """The position of a kernel's name on its `__global__` line."""
    line = next(i for i, text in enumerate(lines) if "__global__" in text and f" {name}(" in text)
    return types.Position(line=line, character=lines[line].index(f" {name}(") + 2)


async def hover(client: LanguageClient, uri: str, position: types.Position) -> str | None:
    result = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=position))
    return None if result is None else result.contents.value


def chart_path(card: str) -> Path:
    link = re.search(r"!\[[^\]]*\]\((file://[^)]+\.svg)\)", card)
    assert link, card
    return uri_to_path(link.group(1))


async def test_hover_shows_the_imported_profile(client: LanguageClient, workspace: Path):
    uri, lines = open_kernels(client, workspace)
    outcome = await import_fixture(client)
    assert outcome["status"] == "ok" and "smem_conflict" in outcome["kernels"] and not outcome["problems"]

    card = await hover(client, uri, name_position(lines, "smem_conflict"))
    assert card is not None
    assert "**smem_conflict**" in card and "memory bound" in card
    hints = card.split("top hints:")[1]
    assert re.search(r"`ncu-SharedMemoryConflicts` \(est\. gain 95\.8%\)", hints), card
    assert "bank conflict" in hints
    assert "DRAM 460 of 4809 GB/s" in card and "achieved occupancy 47.1%" in card
    chart = chart_path(card)
    assert chart.is_file() and chart.read_text().lstrip().startswith("<svg")

    tiny = await hover(client, uri, name_position(lines, "tiny_grid"))
    assert "latency bound" in tiny and re.search(r"`hint-small-grid` \(est\. gain 97%\): 4 blocks on 132 SMs", tiny)


async def test_hover_away_from_a_kernel_name_is_empty(client: LanguageClient, workspace: Path):
    uri, lines = open_kernels(client, workspace)
    await import_fixture(client)
    body_line = name_position(lines, "vec_add").line + 1
    assert await hover(client, uri, types.Position(line=body_line, character=4)) is None


async def test_hover_before_any_profile_says_how_to_get_one(client: LanguageClient, workspace: Path):
    uri, lines = open_kernels(client, workspace)
    card = await hover(client, uri, name_position(lines, "vec_add"))
    assert "**vec_add**" in card and "no profile yet: use 'Profile this kernel'" in card


@needs_nvcc
async def test_hover_without_profile_shows_ptxas_resources(client: LanguageClient, workspace: Path):
    uri, lines = open_kernels(client, workspace)
    await wait_for_publish(client, uri, lambda p: any(d.code == "ptxas-resources" for d in p.diagnostics))
    card = await hover(client, uri, name_position(lines, "spills"))
    assert re.search(r"ptxas sm_90: \d+ registers", card) and "no profile yet" in card


async def test_import_without_the_raw_page_has_no_chart_and_says_why(client: LanguageClient, workspace: Path):
    uri, lines = open_kernels(client, workspace)
    outcome = await import_fixture(client, raw=False)
    assert outcome["status"] == "ok" and "raw page" in outcome["problems"][0]
    card = await hover(client, uri, name_position(lines, "smem_conflict"))
    assert "ncu-SharedMemoryConflicts" in card and "![" not in card


async def test_import_of_a_missing_file_is_an_error(client: LanguageClient, workspace: Path):
    outcome = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.importProfile", arguments=[str(workspace / "none.csv")]))
    assert outcome["status"] == "error" and "none.csv" in outcome["message"]


async def test_hints_become_diagnostics_on_kernel_names(client: LanguageClient, workspace: Path):
    uri, lines = open_kernels(client, workspace)
    await import_fixture(client)
    params = await wait_for_publish(client, uri, lambda p: any(PROFILE_CODE.match(str(d.code)) for d in p.diagnostics))
    hints = [d for d in params.diagnostics if PROFILE_CODE.match(str(d.code))]
    assert {d.severity for d in hints} <= {types.DiagnosticSeverity.Information, types.DiagnosticSeverity.Hint}
    codes = {str(d.code) for d in hints}
    assert {"ncu-SharedMemoryConflicts", "hint-small-grid", "hint-memory-bound"} <= codes
    small_grid = next(d for d in hints if d.code == "hint-small-grid")
    assert small_grid.range.start.line == name_position(lines, "tiny_grid").line


@pytest.mark.parametrize("client", [{"ignore": ["ncu-*"]}], indirect=True)
async def test_ignore_setting_filters_hint_codes(client: LanguageClient, workspace: Path):
    uri, _ = open_kernels(client, workspace)
    await import_fixture(client)
    params = await wait_for_publish(client, uri, lambda p: any(str(d.code).startswith("hint-") for d in p.diagnostics))
    assert not [d.code for d in params.diagnostics if str(d.code).startswith("ncu-")]


async def test_hints_are_published_when_a_document_opens_later(client: LanguageClient, workspace: Path):
    await import_fixture(client)
    uri, _ = open_kernels(client, workspace)
    await wait_for_publish(client, uri, lambda p: any(d.code == "hint-small-grid" for d in p.diagnostics))


async def test_hover_on_load_inline_and_triton_kernels_in_python(client: LanguageClient, workspace: Path):
    path = workspace / "model_new.py"
    path.write_text(LOAD_INLINE)
    uri = open_document(client, path, LOAD_INLINE)
    await import_fixture(client)
    lines = LOAD_INLINE.splitlines()
    card = await hover(client, uri, name_position(lines, "vec_add"))
    assert "**vec_add**" in card and "memory bound" in card
    triton_line = lines.index("def tiny_grid(x_ptr):")
    card = await hover(client, uri, types.Position(line=triton_line, character=len("def ti")))
    assert "**tiny_grid**" in card and "hint-small-grid" in card
    await wait_for_publish(client, uri, lambda p: any(d.code == "hint-memory-bound" for d in p.diagnostics))


async def test_profile_action_is_offered_on_a_kernel_name(client: LanguageClient, workspace: Path):
    uri, lines = open_kernels(client, workspace)
    at = name_position(lines, "smem_conflict")
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
        context=types.CodeActionContext(diagnostics=[])))
    # beside Optimize, in Ctrl+. (kernels.cu has its own main(), so the memory-safety check is offered too)
    assert sorted(a.kind for a in actions) == ["refactor.inspect.profileKernel", "refactor.inspect.sanitizeKernel",
                                               "refactor.rewrite.optimizeKernel"], [a.title for a in actions]
    [action] = [a for a in actions if a.kind == "refactor.inspect.profileKernel"]
    assert action.title.startswith("Profile this kernel")
    assert action.command.command == "kernel-lsp.profile" and list(action.command.arguments) == [uri, "smem_conflict"]

    elsewhere = types.Position(line=0, character=0)
    none = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=elsewhere, end=elsewhere),
        context=types.CodeActionContext(diagnostics=[])))
    assert not none
    quickfix_only = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
        context=types.CodeActionContext(diagnostics=[], only=[types.CodeActionKind.QuickFix])))
    assert not quickfix_only


async def test_profiling_a_cu_file_says_it_is_static_and_needs_no_worker(client: LanguageClient, workspace: Path):
    """A `.cu` gets the static profile, run by the server itself: no worker is started for it (the worker's
    start took 8-11 s of the editor's wait), and the note says what it is as information, not a warning."""
    uri, lines = open_kernels(client, workspace)
    outcome = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.profile", arguments=[uri, "spills"]))
    assert outcome["status"] == "not-profiled" and outcome["source"] == "static", outcome
    assert "profiled statically, by the server" in outcome["problems"][0], outcome
    assert "reference" not in outcome["problems"][0]  # a plain .cu has none
    assert not client.worker_statuses, client.worker_statuses  # no worker was started: the server profiled it
    said = [m for m in client.messages if "profiled statically" in m.message]
    assert said and all(m.type == types.MessageType.Info for m in said)  # what this machine is: no warning
    reports = [r for token, r in client.progress_reports.items() if str(token).startswith("kernel-lsp/profile/")]
    assert reports and isinstance(reports[0][0], types.WorkDoneProgressBegin)
    assert isinstance(reports[0][-1], types.WorkDoneProgressEnd)


@pytest.mark.parametrize("client", [{"verifyDevice": "cpu"}], indirect=True)
async def test_profiling_a_triton_candidate_on_the_cpu_is_said_once_without_contradiction(client: LanguageClient,
                                                                                         workspace: Path):
    """A Triton kernel on the CPU has neither ncu nor CUDA to profile statically: one message says so, not a note
    that "this is the static profile" followed by a warning that there is nothing to profile statically."""
    path = workspace / "tiny.py"
    text = "import triton\n\n\n@triton.jit\ndef tiny_grid(x_ptr):\n    pass\n"
    path.write_text(text)
    uri = open_document(client, path, text)
    outcome = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.profile", arguments=[uri, "tiny_grid"]))
    # known before any job (no GPU device here, a local worker): answered at once, in one message
    assert outcome["status"] == "unavailable" and "ncu" in outcome["message"], outcome
    said = [m for m in client.messages if "profile" in m.message]
    assert len(said) == 1 and said[0].type in (types.MessageType.Warning, types.MessageType.Info), said
    assert outcome["message"] in said[0].message, said
    assert "this is the static profile" not in said[0].message, said


@needs_nvcc
@pytest.mark.parametrize("name, place, elsewhere", [
    ("Neovim", ":lua vim.diagnostic.setqflist()", "Problems panel"),
    ("Visual Studio Code", "the Problems panel", "setqflist"),
])
async def test_a_profile_that_cannot_build_points_to_the_clients_own_diagnostics(workspace: Path, name: str,
                                                                                  place: str, elsewhere: str):
    """nvcc's errors are on their lines: a Neovim user is not sent to VS Code's Problems panel, nor the reverse."""
    client = await CONFIG.start()
    try:
        params = initialize_params(workspace, {"debounceMs": 50, "compileOnChange": False})
        params.client_info = types.ClientInfo(name=name)
        await client.initialize_session(params)
        path = workspace / "broken.cu"
        text = "__global__ void k(int* p) { p[0] = y; }\n"
        path.write_text(text)
        uri = open_document(client, path, text)
        outcome = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="kernel-lsp.profile", arguments=[uri]))
        built = [p for p in outcome["problems"] if "its errors are on their lines" in p]
        assert built and place in built[0] and elsewhere not in built[0], outcome
    finally:
        await client.shutdown_session()


@needs_nvcc
async def test_static_profile_without_a_gpu_marks_source_lines(client: LanguageClient, workspace: Path):
    uri, lines = open_kernels(client, workspace)
    outcome = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.profile", arguments=[uri, "spills"]))
    assert outcome["kernels"] == ["spills"], outcome
    card = await hover(client, uri, name_position(lines, "spills"))
    assert "`hint-local-memory`" in card and "no GPU run" in card
    params = await wait_for_publish(client, uri, lambda p: any(d.code == "hint-local-memory" for d in p.diagnostics))
    local = next(d for d in params.diagnostics if d.code == "hint-local-memory")
    assert "buf[" in lines[local.range.start.line]  # on the source line (-lineinfo), not on the kernel's name
    code = lines[local.range.start.line].rstrip()  # the line's code, not column 1 of its indentation
    assert (local.range.start.character, local.range.end.character) == (len(code) - len(code.lstrip()), len(code))


@pytest.mark.parametrize("client", [{"verifyDevice": "cpu"}], indirect=True)
async def test_a_triton_kernel_without_a_gpu_gets_the_action_disabled_with_the_reason(client: LanguageClient,
                                                                                      workspace: Path):
    """ncu profiles Python kernels; on the CPU there is no such profile, so the menu (Refactor..., which shows
    disabled actions) says so instead of failing after a click. The load_inline CUDA kernel of the same file keeps
    its action (its static profile runs)."""
    path = workspace / "mixed.py"
    path.write_text(LOAD_INLINE)
    uri = open_document(client, path, LOAD_INLINE)
    lines = LOAD_INLINE.splitlines()

    async def profile_actions(line: int) -> list[types.CodeAction]:
        at = types.Position(line=line, character=0)
        found = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
            context=types.CodeActionContext(diagnostics=[], only=[types.CodeActionKind.Refactor])))
        return [a for a in found or [] if a.kind == "refactor.inspect.profileKernel"]

    [triton_action] = await profile_actions(lines.index("def tiny_grid(x_ptr):"))
    assert triton_action.disabled is not None and "needs a GPU" in triton_action.disabled.reason
    [cuda_action] = await profile_actions(next(i for i, t in enumerate(lines) if "void vec_add(" in t))
    assert cuda_action.disabled is None
    card = await hover(client, uri, types.Position(line=lines.index("def tiny_grid(x_ptr):"), character=6))
    assert "no profile: needs a GPU" in card and "use 'Profile this kernel'" not in card


@needs_nvcc
async def test_a_profile_survives_a_restart_for_the_same_text_and_only_for_it(workspace: Path, tmp_path: Path):
    """A profile is kept in the workspace's on-disk cache under the profile job's content-addressed key: a
    restarted server shows its card and hints on open, with their age, without profiling again; an edit marks the
    card as made before it; another text of the file gets none."""
    config = ClientServerConfig(server_command=SERVER, client_factory=code_action_client,
                                server_env={**os.environ, "KERNEL_LSP_CACHE_DIR": str(tmp_path / "cache")})
    options = {"debounceMs": 50, "compileOnChange": False}
    first = await config.start()
    try:
        await first.initialize_session(initialize_params(workspace, options))
        uri, lines = open_kernels(first, workspace)
        outcome = await first.workspace_execute_command_async(
            types.ExecuteCommandParams(command="kernel-lsp.profile", arguments=[uri, "spills"]))
        assert outcome["kernels"] == ["spills"], outcome
        await first.workspace_execute_command_async(
            types.ExecuteCommandParams(command="kernel-lsp.profile", arguments=[uri, "divergent"]))
    finally:
        await first.shutdown_session()  # flushes the cache

    second = await config.start()
    try:
        await second.initialize_session(initialize_params(workspace, options))
        path = workspace / "kernels.cu"
        text = path.read_text()
        lines = text.splitlines()
        uri = open_document(second, path, text + "// another text\n")  # not the text profiled: nothing shown
        await asyncio.sleep(1.5)
        assert NO_PROFILE in await hover(second, uri, name_position(lines, "spills"))
        second.text_document_did_close(types.DidCloseTextDocumentParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        uri = open_document(second, path, text)  # the text profiled
        params = await wait_for_publish(second, uri, lambda p: any(d.code == "hint-local-memory"
                                                                   for d in p.diagnostics), timeout=30)
        assert "buf[" in lines[next(d for d in params.diagnostics if d.code == "hint-local-memory").range.start.line]
        card = await hover(second, uri, name_position(lines, "spills"))
        assert "`hint-local-memory`" in card and "no GPU run · profiled just now_" in card, card
        assert "_profile:" in (await hover(second, uri, name_position(lines, "divergent")))  # both kept
        assert NO_PROFILE in await hover(second, uri, name_position(lines, "vec_add"))  # never profiled
        assert not [t for t in second.progress_reports if str(t).startswith("kernel-lsp/profile/")]  # none ran
        second.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=3),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text + "// edit\n")]))
        card = await hover(second, uri, name_position(lines, "spills"))
        assert "profiled just now (before your last edit)" in card, card
    finally:
        await second.shutdown_session()


@needs_nvcc
@pytest.mark.parametrize("name", ["with space.cu", "ñ.cu"])
async def test_a_path_with_a_space_or_a_non_ascii_letter_gets_every_feature(workspace: Path, name: str):
    """Such a file's URI is percent-encoded (`with%20space.cu`, `%C3%B1.cu`): the buffer open at the start is what is
    diagnosed (not the broken file on disk), and hover, the code actions and profiling find the document."""
    path = workspace / name
    path.write_text("__global__ void broken(int* p) { p[0] = y; }\n")  # on disk: an error the buffer does not have
    text = (FIXTURES / "kernels.cu").read_text()
    client = await CONFIG.start()
    try:
        await client.initialize_session(initialize_params(workspace, {"debounceMs": 50, "compileOnChange": False}))
        uri = open_document(client, path, text)
        assert "%" in uri, uri
        params = await wait_for_publish(client, uri, lambda p: p.version == 1, timeout=60)
        assert not [d for d in params.diagnostics if d.severity == types.DiagnosticSeverity.Error], params
        lines = text.splitlines()
        card = await hover(client, uri, name_position(lines, "spills"))
        assert card is not None and "**spills**" in card, card
        at = name_position(lines, "spills")
        actions = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
            context=types.CodeActionContext(diagnostics=[])))
        assert "refactor.inspect.profileKernel" in [a.kind for a in actions or []], actions
        outcome = await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="kernel-lsp.profile", arguments=[uri, "spills"]))
        assert outcome["kernels"] == ["spills"], outcome
        assert "`hint-local-memory`" in await hover(client, uri, at)
    finally:
        await client.shutdown_session()
