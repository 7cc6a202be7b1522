"""Helpers for driving `kernel-lsp serve` over stdio with a real LSP client (pytest-lsp)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features
from pygls.protocol import default_converter

from kernel_lsp.findings import path_to_uri

SERVER = [sys.executable, "-m", "kernel_lsp", "--log-level", "INFO", "serve"]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)")


def recording_client() -> LanguageClient:
    """pytest-lsp's client, also keeping every publishDiagnostics in arrival order (with its version)."""
    client = LanguageClient(converter_factory=default_converter)
    client.published = []

    def publish(c: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
        c.published.append((time.monotonic(), params))
        c.diagnostics[params.uri] = params.diagnostics

    client.lens_refreshes = 0

    def refresh_lenses(c: LanguageClient, params: None) -> None:
        c.lens_refreshes += 1

    client.worker_statuses = []

    def worker_status(c: LanguageClient, params) -> None:
        c.worker_statuses.append(params)

    client.registrations = []  # client/registerCapability, accepted as an editor would

    def register(c: LanguageClient, params: types.RegistrationParams) -> None:
        c.registrations.extend(params.registrations)

    register_lsp_features(client, {**DEFAULT_CLIENT_FEATURES, types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS: publish,
                                   types.CLIENT_REGISTER_CAPABILITY: register,
                                   types.WORKSPACE_CODE_LENS_REFRESH: refresh_lenses,
                                   "kernelLsp/workerStatus": worker_status})
    return client


def server_config(env: dict[str, str] | None = None) -> ClientServerConfig:
    return ClientServerConfig(server_command=SERVER, client_factory=recording_client,
                              server_env={**os.environ, **(env or {})})


def initialize_params(root: Path, options: dict | None = None) -> types.InitializeParams:
    capabilities = pytest_lsp.client_capabilities("visual-studio-code")
    return types.InitializeParams(
        capabilities=capabilities,
        root_uri=path_to_uri(root),
        workspace_folders=[types.WorkspaceFolder(uri=path_to_uri(root), name=root.name)],
        initialization_options=options or {},
    )


def open_document(client: LanguageClient, path: Path, text: str, version: int = 1) -> str:
    uri = path_to_uri(path)
    language = "python" if path.suffix == ".py" else "cuda-cpp"
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)))
    return uri


def replace_document(client: LanguageClient, uri: str, text: str, version: int) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))


def save_document(client: LanguageClient, uri: str) -> None:
    client.text_document_did_save(types.DidSaveTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))


async def wait_for_publish(client: LanguageClient, uri: str, predicate=lambda p: True, *, after: int = 0,
                           timeout: float = 120.0) -> types.PublishDiagnosticsParams:
    """The first publishDiagnostics for `uri` (from index `after` on) that satisfies `predicate`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _, params in client.published[after:]:
            if params.uri == uri and predicate(params):
                return params
        await asyncio.sleep(0.05)
    seen = [(p.version, [d.code for d in p.diagnostics]) for _, p in client.published if p.uri == uri]
    raise AssertionError(f"no matching publishDiagnostics for {uri} within {timeout} s; seen: {seen}")


def codes(params: types.PublishDiagnosticsParams) -> list[str]:
    return sorted(str(d.code) for d in params.diagnostics)
