"""[tool.kernel-lsp] in the workspace's pyproject.toml reaches the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.lsp.helpers import codes, needs_nvcc, open_document, wait_for_publish

OK_KERNEL = "__global__ void ok(int* p) { p[0] = 1; }\n"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text('[tool.kernel-lsp]\narch = ["sm_80", "sm_90"]\n'
                                             'resource-usage = "codeLens"\n')
    return tmp_path


@needs_nvcc
async def test_pyproject_settings_apply(client: LanguageClient, workspace: Path):
    uri = open_document(client, workspace / "k.cu", OK_KERNEL)
    await wait_for_publish(client, uri, lambda p: True)
    lenses = []
    for _ in range(100):
        lenses = await client.text_document_code_lens_async(
            types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
        if lenses:
            break
    assert [lens.command.title.count("sm_") for lens in lenses] == [2]
    assert "sm_80" in lenses[0].command.title and "sm_90" in lenses[0].command.title
    # resourceUsage = codeLens: no Information diagnostic
    assert "ptxas-resources" not in codes(client.published[-1][1])
