"""A real LSP client (pytest-lsp) talking to `kernel-lsp serve` over stdio, started per test."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from pytest_lsp import LanguageClient

from tests.lsp.helpers import initialize_params, server_config


# these tests read a kernel's ptxas figures as a diagnostic (the default is a code lens only: test_cuda_diagnostics)
FIGURES_AS_DIAGNOSTICS = {"resourceUsage": "both"}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path


@pytest_lsp.fixture(config=server_config())
async def client(lsp_client: LanguageClient, workspace: Path):
    await lsp_client.initialize_session(initialize_params(workspace, {"debounceMs": 50, **FIGURES_AS_DIAGNOSTICS}))
    yield
    await lsp_client.shutdown_session()




@pytest_lsp.fixture(config=server_config())
async def configured_client(lsp_client: LanguageClient, workspace: Path, request):
    """A client whose initializationOptions come from indirect parametrization."""
    await lsp_client.initialize_session(initialize_params(workspace, {"debounceMs": 50, **FIGURES_AS_DIAGNOSTICS,
                                                                      **request.param}))
    yield
    await lsp_client.shutdown_session()
