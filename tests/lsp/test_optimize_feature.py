"""The "Optimize this kernel" action in the editor: pytest-lsp's client, `kernel-lsp serve`, a real local worker on the CPU
(Triton under TRITON_INTERPRET=1) and the real anthropic client against the fake Messages API (scripted turns)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Union

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from kernel_lsp.findings import path_to_uri
from tests.agent.fake_api import FakeMessagesApi, delayed, error_turn, text_turn, tool_use_turn
from tests.agent.test_tools import REFERENCE, TRITON
from tests.lsp.helpers import (
    SERVER,
    initialize_params,
    open_document,
    recording_client,
    replace_document,
)

pytestmark = pytest.mark.timeout(300)

CANDIDATE = "# kernel-lsp: reference=ref.py\n" + TRITON  # 64 programs of 64 elements: each one interpreted
FAST = CANDIDATE.replace("x.numel(), 64)", "x.numel(), 4096)").replace("BLOCK=64", "BLOCK=4096")
SIDE_FILE = "relu.kernel-lsp-best.py"
IMPROVING = [tool_use_turn("write_candidate", {"source": FAST}), tool_use_turn("verify", {}),
             tool_use_turn("finish", {"summary": "one program of 4096"})]


def optimizing_client() -> LanguageClient:
    """The recording client, also answering (and keeping) workspace/applyEdit requests, and reading codeAction
    replies right (lsprotocol's converter structures a CodeAction as a Command, as in test_profile_feature)."""
    client = recording_client()
    converter = client.protocol._converter
    converter.register_structure_hook(
        Union[types.Command, types.CodeAction],
        lambda obj, _: converter.structure(obj, types.Command if isinstance(obj.get("command"), str)
                                           else types.CodeAction))
    client.applied_edits = []

    @client.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(c: LanguageClient, params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        c.applied_edits.append(params)
        return types.ApplyWorkspaceEditResult(applied=True)

    return client


# no key or endpoint from the developer's environment: the tests say which one the server gets
SERVER_ENV = {**{k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")},
              "TRITON_INTERPRET": "1"}
CONFIG = ClientServerConfig(server_command=SERVER, client_factory=optimizing_client, server_env=SERVER_ENV)


def cpu_settings(workspace: Path, api: FakeMessagesApi, **more) -> dict:
    return {"debounceMs": 50, "verifyDevice": "cpu", "trials": 2, "timedCalls": 5, "baselines": ["eager"],
            "anthropicBaseUrl": api.url, "anthropicApiKey": "sk-ant-test",
            "trajectoryDir": str(workspace / "trajectories"), **more}


@pytest.fixture
def api():
    with FakeMessagesApi([]) as server:  # each test adds its turns
        yield server


@pytest_lsp.fixture(config=CONFIG)
async def optimizing(lsp_client: LanguageClient, workspace: Path, api: FakeMessagesApi):
    await lsp_client.initialize_session(initialize_params(workspace, cpu_settings(workspace, api)))
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=CONFIG)
async def keyless(lsp_client: LanguageClient, workspace: Path, api: FakeMessagesApi):
    settings = {k: v for k, v in cpu_settings(workspace, api).items() if k != "anthropicApiKey"}
    await lsp_client.initialize_session(initialize_params(workspace, settings))
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=CONFIG)
async def keyless_vscode(lsp_client: LanguageClient, workspace: Path, api: FakeMessagesApi):
    """No key, and the client says it is VS Code: the remedy is the extension's command."""
    settings = {k: v for k, v in cpu_settings(workspace, api).items() if k != "anthropicApiKey"}
    params = initialize_params(workspace, settings)
    params.client_info = types.ClientInfo(name="Visual Studio Code", version="1.100.0")
    await lsp_client.initialize_session(params)
    yield
    await lsp_client.shutdown_session()


def candidate_on_disk(client: LanguageClient, workspace: Path, text: str = CANDIDATE) -> str:
    (workspace / "ref.py").write_text(REFERENCE)
    (workspace / "relu.py").write_text(text)
    return open_document(client, workspace / "relu.py", text)


async def optimize(client: LanguageClient, uri: str) -> dict:
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.optimize", arguments=[uri]))


async def wait_until(predicate, timeout: float = 240.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def optimize_progress(client: LanguageClient) -> list:
    return next((reports for token, reports in client.progress_reports.items()
                 if str(token).startswith("kernel-lsp/optimize/")), [])


def messages_with(client: LanguageClient, text: str) -> list[str]:
    return [m.message for m in client.messages if text in m.message]


async def test_the_action_is_offered_on_the_kernel_and_on_model_new_only(optimizing: LanguageClient,
                                                                           workspace: Path):
    uri = candidate_on_disk(optimizing, workspace)

    async def actions(line: int, only=None) -> list[types.CodeAction]:
        found = await optimizing.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(start=types.Position(line=line, character=0), end=types.Position(line=line, character=0)),
            context=types.CodeActionContext(diagnostics=[], only=only)))
        return [a for a in found or [] if a.kind == "refactor.rewrite.optimizeKernel"]

    kernel_line = CANDIDATE.splitlines().index("def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):")
    model_new_line = CANDIDATE.splitlines().index("class ModelNew(nn.Module):")
    on_kernel, on_model_new = await actions(kernel_line), await actions(model_new_line)
    assert [a.title for a in on_kernel] == ["Optimize this kernel (relu_kernel)"]
    assert [a.title for a in on_model_new] == ["Optimize this kernel (ModelNew)"]
    assert on_kernel[0].command.command == "kernel-lsp.optimize" and list(on_kernel[0].command.arguments) == [uri]
    assert await actions(1) == [] and await actions(kernel_line, only=["quickfix"]) == []
    assert len(await actions(kernel_line, only=["refactor"])) == 1
    reference_uri = open_document(optimizing, workspace / "ref.py", REFERENCE)  # a problem: Model, no ModelNew

    async def problem_actions(line: int) -> list[str]:
        found = await optimizing.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=reference_uri),
            range=types.Range(start=types.Position(line=line, character=0), end=types.Position(line=line, character=0)),
            context=types.CodeActionContext(diagnostics=[])))
        return [a.title for a in found or [] if a.kind == "refactor.rewrite.optimizeKernel"]
    model_line = REFERENCE.splitlines().index("class Model(nn.Module):")
    assert await problem_actions(model_line) == ["Optimize this kernel (a new ModelNew in ref_new.py)"]
    assert await problem_actions(model_line + 2) == []  # only on the class line


async def test_a_verified_improvement_is_offered_as_a_previewed_edit(optimizing: LanguageClient, workspace: Path,
                                                                      api: FakeMessagesApi):
    uri = candidate_on_disk(optimizing, workspace)
    api.turns.extend(IMPROVING)
    started = await optimize(optimizing, uri)
    assert started["status"] == "started", started
    again = await optimize(optimizing, uri)  # one pass per document
    assert again["status"] == "running" and messages_with(optimizing, "already running")
    edit = (await wait_until(lambda: optimizing.applied_edits, what="workspace/applyEdit"))[0].edit
    change = edit.document_changes[0]
    assert change.text_document.uri == uri and len(change.edits) == 1
    assert change.edits[0].new_text == FAST and change.edits[0].range.start == types.Position(line=0, character=0)
    lines = CANDIDATE.split("\n")
    assert change.edits[0].range.end == types.Position(line=len(lines) - 1, character=len(lines[-1]))
    annotation = edit.change_annotations[change.edits[0].annotation_id]
    assert annotation.needs_confirmation is True and "faster" in annotation.description
    reports = optimize_progress(optimizing)
    assert isinstance(reports[0], types.WorkDoneProgressBegin) and reports[0].cancellable
    middle = [r.message for r in reports if isinstance(r, types.WorkDoneProgressReport)]
    assert any(m.startswith("verify: ") for m in middle) and any("calls, $" in m for m in middle)
    # the pass runs on the CPU: the best is counted as verified, not as an interpreter's speedup
    assert any("best: verified (CPU: timings not comparable; 1 candidate verified)" in m for m in middle), middle
    assert not any("×" in m for m in middle if not m.startswith("done: ")), middle  # done: compares times
    assert isinstance(reports[-1], types.WorkDoneProgressEnd) and "faster" in reports[-1].message
    assert (workspace / SIDE_FILE).read_text() == FAST
    assert (workspace / "relu.py").read_text() == CANDIDATE  # the edit is only offered
    assert api.requests[0].api_key == "sk-ant-test" and list((workspace / "trajectories").glob("*.jsonl"))
    assert all("sk-ant-test" not in m.message for m in optimizing.messages + optimizing.log_messages)


async def test_a_missing_key_is_a_message_naming_the_variable_and_the_server_goes_on(keyless: LanguageClient,
                                                                                      workspace: Path,
                                                                                      api: FakeMessagesApi):
    uri = candidate_on_disk(keyless, workspace)
    answer = await optimize(keyless, uri)
    assert answer["status"] == "error" and "ANTHROPIC_API_KEY" in answer["message"]
    assert [m.type for m in keyless.messages if "ANTHROPIC_API_KEY" in m.message] == [types.MessageType.Error]
    assert not api.requests and not keyless.applied_edits
    lenses = await keyless.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert lenses  # still answering


async def optimize_actions(client: LanguageClient, uri: str, line: int,
                           only: list[str] | None = None) -> list[types.CodeAction]:
    """The action on `line`, as Ctrl+. asks (every kind), or as a menu of `only` these kinds (Refactor...)."""
    found = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        range=types.Range(start=types.Position(line=line, character=0), end=types.Position(line=line, character=0)),
        context=types.CodeActionContext(diagnostics=[], only=only)))
    return [a for a in found or [] if a.kind == "refactor.rewrite.optimizeKernel"]


REFACTOR = [types.CodeActionKind.Refactor]  # VS Code's Refactor... menu: it shows disabled actions


async def test_without_a_key_the_action_is_disabled_with_the_clients_own_remedy(keyless_vscode: LanguageClient,
                                                                                  workspace: Path):
    uri = candidate_on_disk(keyless_vscode, workspace)
    kernel_line = CANDIDATE.splitlines().index("def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):")
    [action] = await optimize_actions(keyless_vscode, uri, kernel_line, only=REFACTOR)
    assert action.disabled is not None and "kernel-lsp: Set Anthropic API Key" in action.disabled.reason
    assert "anthropicApiKey" not in action.disabled.reason  # a setting the extension does not have
    answer = await optimize(keyless_vscode, uri)
    assert answer["status"] == "error" and "Set Anthropic API Key" in answer["message"]


CU_KERNEL = """__global__ void scale_kernel(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
"""
BUILDS_THE_CU = """# kernel-lsp: reference=ref.py
import torch.nn as nn
from torch.utils.cpp_extension import load

ext = load(name="scale_ext", sources=["scale.cu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.scale(x)
"""


async def test_a_cu_kernel_is_optimized_through_the_candidate_that_builds_it(optimizing: LanguageClient,
                                                                              workspace: Path):
    (workspace / "scale.cu").write_text(CU_KERNEL)
    cu_uri = open_document(optimizing, workspace / "scale.cu", CU_KERNEL)
    [alone] = await optimize_actions(optimizing, cu_uri, 0, only=REFACTOR)  # no candidate loads it yet: disabled,
    assert alone.title == "Optimize this kernel (scale_kernel)" and "no candidate builds scale.cu" in \
        alone.disabled.reason  # with what to do
    [titled] = await optimize_actions(optimizing, cu_uri, 0)  # Ctrl+.: listed, its title saying why
    assert titled.title == "Optimize this kernel (scale_kernel) — unavailable: no candidate builds scale.cu"
    answer = await optimize(optimizing, cu_uri)  # chosen: the reason, in one message
    assert answer["status"] == "not-a-candidate" and answer["message"] == alone.disabled.reason
    (workspace / "ref.py").write_text(REFERENCE)
    (workspace / "scale_new.py").write_text(BUILDS_THE_CU)  # closed: found beside the .cu
    [through] = await optimize_actions(optimizing, cu_uri, 0)
    assert through.title == "Optimize this kernel (scale_kernel, through scale_new.py)" and through.disabled is None
    assert list(through.command.arguments) == [path_to_uri(workspace / "scale_new.py")]
    assert await optimize_actions(optimizing, cu_uri, 2) == []  # not on a kernel's name line


async def test_a_document_edited_during_the_pass_is_left_alone(optimizing: LanguageClient, workspace: Path,
                                                                api: FakeMessagesApi):
    uri = candidate_on_disk(optimizing, workspace)
    api.turns.extend(IMPROVING)
    assert (await optimize(optimizing, uri))["status"] == "started"
    replace_document(optimizing, uri, CANDIDATE + "\n# my own edit\n", version=2)
    said = await wait_until(lambda: messages_with(optimizing, "changed during the optimization pass"),
                            what="the message about the changed document")
    assert str(workspace / SIDE_FILE) in said[0] and (workspace / SIDE_FILE).read_text() == FAST
    await asyncio.sleep(0.5)
    assert not optimizing.applied_edits


async def test_no_improvement_says_so_and_names_the_side_file(optimizing: LanguageClient, workspace: Path,
                                                              api: FakeMessagesApi):
    uri = candidate_on_disk(optimizing, workspace)
    broken = CANDIDATE.replace("mask = offsets < n", "mask = offsets <")
    api.turns.extend([tool_use_turn("write_candidate", {"source": broken}), tool_use_turn("verify", {}),
                      tool_use_turn("finish", {"summary": "no luck"})])
    assert (await optimize(optimizing, uri))["status"] == "started"
    said = await wait_until(lambda: messages_with(optimizing, "no verified improvement"),
                            what="the no-improvement message")
    assert str(workspace / SIDE_FILE) in said[0] and not optimizing.applied_edits


async def test_cancelling_the_progress_stops_the_pass(optimizing: LanguageClient, workspace: Path,
                                                      api: FakeMessagesApi):
    uri = candidate_on_disk(optimizing, workspace)
    api.turns.extend([tool_use_turn("read_candidate", {}), delayed(text_turn("too late"), 60)])
    assert (await optimize(optimizing, uri))["status"] == "started"
    await wait_until(lambda: len(api.requests) >= 2, what="the second model turn")
    token = next(t for t in optimizing.progress_reports if str(t).startswith("kernel-lsp/optimize/"))
    optimizing.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    said = await wait_until(lambda: messages_with(optimizing, "was cancelled"), timeout=30,
                            what="the cancelled message")
    assert "relu.py" in said[0]
    end = optimize_progress(optimizing)[-1]
    assert isinstance(end, types.WorkDoneProgressEnd) and end.message == "cancelled"


async def test_a_refused_key_is_one_error_message_and_the_server_goes_on(optimizing: LanguageClient,
                                                                         workspace: Path, api: FakeMessagesApi):
    uri = candidate_on_disk(optimizing, workspace)
    api.turns.append(error_turn(401, "authentication_error", "invalid x-api-key"))
    assert (await optimize(optimizing, uri))["status"] == "started"
    said = await wait_until(lambda: [m for m in optimizing.messages if "stopped: model API error" in m.message],
                            what="the model error message")
    assert said[0].type == types.MessageType.Error and "ANTHROPIC_API_KEY" in said[0].message
    assert not optimizing.applied_edits and "sk-ant-test" not in said[0].message
    api.turns.extend(IMPROVING)  # the next pass works
    assert (await optimize(optimizing, uri))["status"] == "started"
    await wait_until(lambda: optimizing.applied_edits, what="workspace/applyEdit")


async def test_a_problem_files_pass_offers_its_verified_candidate_as_a_new_file(optimizing: LanguageClient,
                                                                               workspace: Path, api: FakeMessagesApi):
    (workspace / "ref.py").write_text(REFERENCE)
    uri = open_document(optimizing, workspace / "ref.py", REFERENCE)
    written = FAST.removeprefix("# kernel-lsp: reference=ref.py\n")  # the model writes no header
    api.turns.extend([tool_use_turn("write_candidate", {"source": written}), tool_use_turn("verify", {}),
                      tool_use_turn("finish", {"summary": "a first Triton kernel"})])
    started = await optimize(optimizing, uri)
    assert started["status"] == "started" and started["reference"] == str(workspace / "ref.py"), started
    edit = (await wait_until(lambda: optimizing.applied_edits, what="workspace/applyEdit"))[0].edit
    create, insert = edit.document_changes
    new_uri = (workspace / "ref_new.py").as_uri()
    assert isinstance(create, types.CreateFile) and create.uri == new_uri
    assert create.options.overwrite is False and create.options.ignore_if_exists is False
    assert insert.text_document.uri == new_uri and insert.edits[0].new_text == "# kernel-lsp: reference=ref.py\n" + written
    assert edit.change_annotations[insert.edits[0].annotation_id].needs_confirmation is True
    assert (workspace / "ref.py").read_text() == REFERENCE and not (workspace / "ref_new.py").exists()


async def test_a_problem_files_candidate_never_overwrites_a_file(optimizing: LanguageClient, workspace: Path,
                                                                  api: FakeMessagesApi):
    (workspace / "ref.py").write_text(REFERENCE)
    (workspace / "ref_new.py").write_text("# mine\n")
    uri = open_document(optimizing, workspace / "ref.py", REFERENCE)
    api.turns.extend([tool_use_turn("write_candidate", {"source": FAST}), tool_use_turn("verify", {}),
                      tool_use_turn("finish", {"summary": "done"})])
    assert (await optimize(optimizing, uri))["status"] == "started"
    said = await wait_until(lambda: messages_with(optimizing, "was not created as ref_new.py"),
                            what="the not-created message")
    assert "ref_new.py exists already" in said[0] and "ref.kernel-lsp-best.py" in said[0]
    assert (workspace / "ref_new.py").read_text() == "# mine\n" and not optimizing.applied_edits
