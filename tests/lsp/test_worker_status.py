"""The server starts its local worker on demand and reports the worker's state to the client."""

from __future__ import annotations

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient


async def worker_status(client: LanguageClient) -> dict:
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.workerStatus", arguments=[]))


async def test_status_command_starts_the_local_worker_and_notifies(client: LanguageClient):
    status = await worker_status(client)
    assert status["state"] == "connected" and status["address"] == "local"
    assert status["versions"]["python"] and status["pingMs"] < 5000
    assert not status["busy"]
    states = [s.state for s in client.worker_statuses]  # pygls hands custom params over as objects
    assert states[:2] == ["starting", "connected"]


@pytest.mark.parametrize("configured_client", [{"worker": "tcp:127.0.0.1:1"}], indirect=True)
async def test_unreachable_remote_worker_is_reported(configured_client: LanguageClient):
    status = await worker_status(configured_client)
    assert status["state"] == "failed"
    assert "tcp:127.0.0.1:1" in status["message"] and "unavailable" in status["message"]
