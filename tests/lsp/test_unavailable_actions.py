"""Ctrl+. on a kernel that nothing can run here (issue 42): a Triton candidate on a machine without a GPU, no API key.
Whatever the client, the menu is never empty and nothing in it is enabled only to fail: Ctrl+. (every kind) lists
Optimize, Profile and the memory-safety check, each title saying why it cannot run; a client that shows disabled
actions gets them disabled, with the reason, in Refactor...; choosing one says the reason in one message, before any
worker starts. A `.cu` whose compile failed gets no runnable Profile."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from kernel_lsp.process.namespaces import nvidia_device_present
from tests.agent.test_tools import REFERENCE, TRITON
from tests.lsp.helpers import SERVER, initialize_params, needs_nvcc, open_document, wait_for_publish
from tests.lsp.test_profile_feature import code_action_client

pytestmark = pytest.mark.skipif(nvidia_device_present(), reason="the menu of a machine without a GPU")

CANDIDATE = "# kernel-lsp: reference=ref.py\n" + TRITON
KERNEL_LINE = CANDIDATE.splitlines().index("def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):")
KINDS = ["refactor.inspect.profileKernel", "refactor.inspect.sanitizeKernel", "refactor.rewrite.optimizeKernel"]
SERVER_ENV = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
CONFIG = ClientServerConfig(server_command=SERVER, client_factory=code_action_client, server_env=SERVER_ENV)
CLIENTS = {"vscode": "visual-studio-code", "neovim": "neovim@v0.7.0"}  # disabledSupport: declared, not declared


@pytest_lsp.fixture(config=CONFIG, params=list(CLIENTS))
async def client(lsp_client: LanguageClient, workspace: Path, request):
    params = initialize_params(workspace, {"debounceMs": 50, "compileOnChange": False})
    params.capabilities = pytest_lsp.client_capabilities(CLIENTS[request.param])
    await lsp_client.initialize_session(params)
    lsp_client.shows_disabled = request.param == "vscode"
    yield
    await lsp_client.shutdown_session()


async def actions(client: LanguageClient, uri: str, line: int, only: list[str] | None = None,
                  trigger: types.CodeActionTriggerKind | None = None) -> list[types.CodeAction]:
    at = types.Position(line=line, character=0)
    found = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
        context=types.CodeActionContext(diagnostics=[], only=only, trigger_kind=trigger)))
    return sorted(found or [], key=lambda a: a.kind)


async def choose(client: LanguageClient, action: types.CodeAction) -> tuple[dict, list[types.ShowMessageParams]]:
    """Runs the action's command as the editor does: its answer and the messages it showed."""
    before = len(client.messages)
    answer = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=action.command.command, arguments=action.command.arguments))
    return answer, client.messages[before:]


async def test_ctrl_dot_lists_every_action_saying_why_and_choosing_one_says_it_once(client: LanguageClient,
                                                                                      workspace: Path):
    (workspace / "ref.py").write_text(REFERENCE)
    (workspace / "relu.py").write_text(CANDIDATE)
    uri = open_document(client, workspace / "relu.py", CANDIDATE)

    ctrl_dot = await actions(client, uri, KERNEL_LINE, trigger=types.CodeActionTriggerKind.Invoked)
    assert [a.kind for a in ctrl_dot] == KINDS, [a.title for a in ctrl_dot]
    assert all(a.disabled is None for a in ctrl_dot)  # VS Code's Ctrl+. leaves disabled actions out
    briefs = [a.title.split(" — unavailable: ")[1] for a in ctrl_dot]
    assert briefs == ["needs a GPU", "needs a GPU", "no Anthropic API key"], [a.title for a in ctrl_dot]

    refactor = await actions(client, uri, KERNEL_LINE, only=[types.CodeActionKind.Refactor])
    assert [a.kind for a in refactor] == KINDS
    if client.shows_disabled:  # greyed out, the reason beside it; titles as runnable ones have
        assert all(a.disabled is not None and a.disabled.reason for a in refactor)
        assert "unavailable" not in " ".join(a.title for a in refactor)
        lightbulb = await actions(client, uri, KERNEL_LINE, trigger=types.CodeActionTriggerKind.Automatic)
        assert lightbulb and all(a.disabled is not None for a in lightbulb)  # no lightbulb for what cannot run
    else:  # disabled ones would be dropped: listed like Ctrl+.'s
        assert [a.title for a in refactor] == [a.title for a in ctrl_dot] and all(a.disabled is None for a in refactor)

    for action, brief in zip(ctrl_dot, briefs):
        answer, said = await choose(client, action)
        assert answer["status"] in ("unavailable", "error") and brief.split()[-1] in answer["message"], answer
        assert len(said) == 1 and brief.split()[-1] in said[0].message, (action.title, said)
    assert not client.worker_statuses  # each knew without starting the worker


async def test_once_the_worker_ran_ctrl_dot_still_lists_them(client: LanguageClient, workspace: Path):
    (workspace / "ref.py").write_text(REFERENCE)
    (workspace / "relu.py").write_text(CANDIDATE)
    uri = open_document(client, workspace / "relu.py", CANDIDATE)
    status = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.workerStatus", arguments=[]))
    assert status["state"] == "connected" and not status["gpu"], status
    ctrl_dot = await actions(client, uri, KERNEL_LINE)
    assert [a.kind for a in ctrl_dot] == KINDS and all(" — unavailable: " in a.title for a in ctrl_dot)
    assert all(a.disabled is None for a in ctrl_dot)


BROKEN_CU = "__global__ void scale(float* p) { p[threadIdx.x] *= undefined_factor; }\n"


@needs_nvcc
async def test_a_cu_whose_compile_failed_gets_no_runnable_profile(client: LanguageClient, workspace: Path):
    path = workspace / "scale.cu"
    path.write_text(BROKEN_CU.replace("undefined_factor", "2.0f"))
    uri = open_document(client, path, path.read_text())
    await wait_for_publish(client, uri)  # compiled: Profile runs (the static profile)
    [profile] = [a for a in await actions(client, uri, 0) if a.kind == KINDS[0]]
    assert profile.title == "Profile this kernel (scale)" and profile.disabled is None

    path.write_text(BROKEN_CU)
    client.text_document_did_close(types.DidCloseTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))
    uri = open_document(client, path, BROKEN_CU, version=2)
    await wait_for_publish(client, uri, lambda p: any(d.severity == types.DiagnosticSeverity.Error
                                                      for d in p.diagnostics))
    [profile] = [a for a in await actions(client, uri, 0) if a.kind == KINDS[0]]
    assert profile.title == "Profile this kernel (scale) — unavailable: does not compile"
    answer, said = await choose(client, profile)
    assert answer["status"] == "unavailable" and "last compile failed" in answer["message"], answer
    assert len(said) == 1 and "last compile failed" in said[0].message
    if client.shows_disabled:
        [disabled] = [a for a in await actions(client, uri, 0, only=[types.CodeActionKind.Refactor])
                      if a.kind == KINDS[0]]
        assert "last compile failed" in disabled.disabled.reason
