"""The server with `backend: "ray"`: a saved candidate is verified by a Ray actor (a Ray instance the server starts
itself), the status bar hears about the pool, and the LSP stream stays clean (Ray writes nothing on stdout)."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from pytest_lsp import LanguageClient

from tests.lsp.helpers import initialize_params, save_document, server_config
from tests.lsp.test_verify_feature import CPU_SETTINGS, REFERENCE, candidate, open_on_disk, wait_for_lens

pytest.importorskip("ray", reason="the Ray backend's tests need ray: pip install 'kernel-lsp[ray]'")


@pytest_lsp.fixture(config=server_config({"TRITON_INTERPRET": "1", "RAY_ADDRESS": ""}))
async def on_ray(lsp_client: LanguageClient, workspace: Path):
    await lsp_client.initialize_session(initialize_params(workspace, {**CPU_SETTINGS, "backend": "ray",
                                                                      "rayActors": 2}))
    yield
    await lsp_client.shutdown_session()


@pytest.mark.timeout(600)
async def test_a_saved_candidate_is_verified_by_a_ray_actor(on_ray: LanguageClient, workspace: Path):
    (workspace / "relu.py").write_text(REFERENCE)
    uri = open_on_disk(on_ray, workspace / "relu_new.py", candidate())
    save_document(on_ray, uri)
    lens = await wait_for_lens(on_ray, uri, lambda t: t != "verifying…" and not t.startswith("verify against"),
                               timeout=300)
    assert lens.command.title.startswith("correct 2/2"), lens.command.title
    states = [(s.state, s.address, s.gpu) for s in on_ray.worker_statuses]  # custom params come as objects
    assert ("connected", "ray:local", "2 Ray CPU actors on 1 node") in states, states
