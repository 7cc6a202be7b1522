"""CuTe DSL kernels in the editor: saving a `.py` with @cute.kernel/@cute.jit runs the worker's compile check (no
GPU needed; never on open alone, since it runs the file's code), whose figures land on the kernel's name and whose
error lands on its line; the kernel
gets the profile code action like any other; verification on a machine without a GPU says why it cannot run."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.lsp.helpers import open_document, replace_document, save_document, wait_for_publish
from tests.worker.test_cute_dsl_check import ADD, INDEX_LINE, KERNEL_LINE, REFERENCE, with_line_after_index

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(importlib.util.find_spec("nvidia_cutlass_dsl") is None,
                       reason="the CuTe DSL is not installed (pip install 'kernel-lsp[cute-dsl]')"),
]

HEADER = "# kernel-lsp: reference=add_ref.py\n"


def dsl_codes(params: types.PublishDiagnosticsParams) -> list[str]:
    return sorted(str(d.code) for d in params.diagnostics if str(d.code).startswith(("cute-dsl", "ptxas")))


async def test_a_dsl_file_is_checked_on_open_and_its_error_shows_on_save(client: LanguageClient, workspace: Path):
    (workspace / "add_ref.py").write_text(REFERENCE)
    path = workspace / "add_new.py"
    path.write_text(HEADER + ADD)
    uri = open_document(client, path, HEADER + ADD)
    await asyncio.sleep(1.0)
    assert not any(dsl_codes(p) for _, p in client.published if p.uri == uri)  # opening runs nothing
    save_document(client, uri)
    params = await wait_for_publish(client, uri, lambda p: "ptxas-resources" in dsl_codes(p), timeout=240)
    [figures] = [d for d in params.diagnostics if d.code == "ptxas-resources"]
    assert figures.range.start.line == KERNEL_LINE + 1 and "registers" in figures.message
    assert figures.message.startswith("add_kernel: sm_90a: ")

    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=figures.range,
        context=types.CodeActionContext(diagnostics=[])))
    titles = [action.title for action in actions or []]
    assert any("add_kernel" in title for title in titles), titles

    broken = HEADER + with_line_after_index("    bad = cute.make_layout((4, 8), stride=(8, 1, 2))")
    path.write_text(broken)
    replace_document(client, uri, broken, 2)
    after = len(client.published)
    save_document(client, uri)
    params = await wait_for_publish(client, uri, lambda p: "cute-dsl-error" in dsl_codes(p), after=after,
                                    timeout=240)
    [error] = [d for d in params.diagnostics if d.code == "cute-dsl-error"]
    assert error.range.start.line == INDEX_LINE + 2 and "congruent" in error.message
    assert error.severity == types.DiagnosticSeverity.Error and error.related_information
    assert "ptxas-resources" not in dsl_codes(params)  # the figures of the version that compiled are gone


async def test_verifying_a_dsl_candidate_without_a_gpu_says_why(client: LanguageClient, workspace: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("with a GPU the candidate is verified (tests/gpu)")
    (workspace / "add_ref.py").write_text(REFERENCE)
    path = workspace / "add_new.py"
    path.write_text(HEADER + ADD)
    uri = open_document(client, path, HEADER + ADD)
    answer = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.verify", arguments=[uri]))
    assert "only on an NVIDIA GPU" in answer["summary"], answer
