"""Settings from the three sources, invalid values, and the server staying free of torch and triton."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from tests.lsp.helpers import (initialize_params, needs_nvcc, open_document, recording_client,
                               wait_for_publish)

OK_KERNEL = "__global__ void ok(int* p) { p[0] = 1; }\n"


@needs_nvcc
@pytest.mark.parametrize("configured_client", [{"debounceMs": "fast", "arch": ["sm_80"], "bogusKey": 1}],
                         indirect=True)
async def test_invalid_values_warn_once_and_fall_back(configured_client: LanguageClient, workspace: Path):
    uri = open_document(configured_client, workspace / "k.cu", OK_KERNEL)
    params = await wait_for_publish(configured_client, uri, lambda p: bool(p.diagnostics))
    assert "sm_80:" in params.diagnostics[0].message  # the valid key still applied
    warnings = [m.message for m in configured_client.messages if m.type == types.MessageType.Warning]
    assert len([w for w in warnings if "debounceMs" in w]) == 1
    assert len([w for w in warnings if "bogusKey" in w]) == 1


def import_log_config(log: Path) -> ClientServerConfig:
    command = ["sh", "-c", f'exec "{sys.executable}" -X importtime -m kernel_lsp serve 2>"{log}"']
    return ClientServerConfig(server_command=command, client_factory=recording_client)


IMPORT_LOG = Path(tempfile.gettempdir()) / f"kernel-lsp-importtime-{os.getpid()}.log"


@pytest_lsp.fixture(config=import_log_config(IMPORT_LOG))
async def traced_client(lsp_client: LanguageClient, tmp_path: Path):
    await lsp_client.initialize_session(initialize_params(tmp_path, {"debounceMs": 0}))
    yield  # the test shuts the server down itself, to read the complete import trace


async def test_server_never_imports_torch_or_triton(traced_client: LanguageClient, tmp_path: Path):
    text = ('from torch.utils.cpp_extension import load_inline\nimport triton\n'
            'ext = load_inline(name="e", cpp_sources="", cuda_sources="__global__ void k() {}")\n')
    uri = open_document(traced_client, tmp_path / "m.py", text)
    await wait_for_publish(traced_client, uri, lambda p: True, timeout=240)
    await traced_client.shutdown_session()
    imported = {m.group(1).strip() for m in re.finditer(r"^import time:.*\|\s*(\S.*)$",
                                                         IMPORT_LOG.read_text(), re.MULTILINE)}
    IMPORT_LOG.unlink()
    assert "pygls" in imported  # the trace is real
    assert not {name for name in imported if name.split(".")[0] in ("torch", "triton")}
