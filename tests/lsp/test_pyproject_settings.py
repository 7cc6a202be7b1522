"""[tool.kernel-lsp] in the workspace's pyproject.toml reaches the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from lsprotocol import types
import pytest_lsp
from pytest_lsp import LanguageClient

from tests.lsp.helpers import initialize_params, needs_nvcc, open_document, server_config, wait_for_publish

OK_KERNEL = "__global__ void ok(int* p) { p[0] = 1; }\n"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text('[tool.kernel-lsp]\narch = ["sm_80", "sm_90"]\n'
                                             'resource-usage = "diagnostic"\n')
    return tmp_path


@pytest_lsp.fixture(config=server_config())
async def client(lsp_client: LanguageClient, workspace: Path):
    """No initializationOptions: what the server does comes from pyproject.toml alone."""
    await lsp_client.initialize_session(initialize_params(workspace, {"debounceMs": 50}))
    yield
    await lsp_client.shutdown_session()


@needs_nvcc
async def test_pyproject_settings_apply(client: LanguageClient, workspace: Path):
    uri = open_document(client, workspace / "k.cu", OK_KERNEL)
    params = await wait_for_publish(client, uri, lambda p: any(d.code == "ptxas-resources" for d in p.diagnostics))
    # resource-usage = "diagnostic" (the default is a lens): the figures are a diagnostic, for both archs
    [figures] = [d for d in params.diagnostics if d.code == "ptxas-resources"]
    assert "sm_80" in figures.message and "sm_90" in figures.message, figures.message
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert not lenses
