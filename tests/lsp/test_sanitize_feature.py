"""Memory safety in the editor through a real LSP client: the "Check memory safety (compute-sanitizer)" action on a
kernel of a `.py` candidate, and the check after verification (sanitizeAfterVerify). This machine has no GPU: the
server knows it before the worker starts (no GPU device here), the worker says so once started, the server tells the
user (once, after verifications) and keeps answering."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from kernel_lsp.profile.sanitize import NO_GPU
from kernel_lsp.server.sanitize_feature import NO_GPU_HERE
from tests.lsp.helpers import (
    SERVER,
    initialize_params,
    open_document,
    replace_document,
    save_document,
)
from tests.lsp.test_profile_feature import code_action_client
from tests.lsp.test_verify_feature import REFERENCE
from tests.lsp.test_verify_feature import TRITON_CANDIDATE as VERIFY_TRITON_CANDIDATE

ACTION_KIND = "refactor.inspect.sanitizeKernel"


LOAD_INLINE_CANDIDATE = '''\
# kernel-lsp: reference=relu.py
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = """
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu(torch::Tensor x);", cuda_sources=cuda_source,
                  functions=["relu"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x.contiguous())
'''

TRITON_CANDIDATE = VERIFY_TRITON_CANDIDATE.replace("OFFSET", "0.0")

CPU_VERIFY = {"debounceMs": 50, "compileOnChange": False, "verifyDevice": "cpu", "trials": 2, "timedCalls": 5,
              "warmupCalls": 1, "baselines": ["eager"]}


def config(env: dict[str, str] | None = None) -> ClientServerConfig:
    return ClientServerConfig(server_command=SERVER, client_factory=code_action_client,
                              server_env={**os.environ, **(env or {})})


@pytest_lsp.fixture(config=config())
async def client(lsp_client: LanguageClient, workspace: Path):
    await lsp_client.initialize_session(initialize_params(workspace, {"debounceMs": 50, "compileOnChange": False}))
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=config({"TRITON_INTERPRET": "1"}))
async def after_verify(lsp_client: LanguageClient, workspace: Path):
    """A server whose local worker verifies Triton on the CPU, checking memory safety after each verification."""
    await lsp_client.initialize_session(initialize_params(workspace, {**CPU_VERIFY, "sanitizeAfterVerify": True}))
    yield
    await lsp_client.shutdown_session()


async def sanitize_actions(client: LanguageClient, uri: str, line: int,
                           only: list[str] | None = None) -> list[types.CodeAction]:
    """The action on `line`, as Ctrl+. asks (every kind), or as a menu of `only` these kinds (Refactor...)."""
    at = types.Position(line=line, character=0)
    found = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=types.Range(start=at, end=at),
        context=types.CodeActionContext(diagnostics=[], only=only)))
    return [a for a in found or [] if a.kind == ACTION_KIND]


def no_gpu_messages(client: LanguageClient) -> list[types.ShowMessageParams]:
    return [m for m in client.messages if NO_GPU in m.message]


def sanitizer_diagnostics(client: LanguageClient) -> list[types.Diagnostic]:
    return [d for _, p in client.published for d in p.diagnostics if str(d.code).startswith("sanitizer-")]


async def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.1)


async def test_the_action_is_offered_on_a_kernel_and_without_a_gpu_says_so(client: LanguageClient, workspace: Path):
    """Before the worker starts, the local worker is known to have no GPU (this machine shows none): Ctrl+. lists the
    action saying so in its title, Refactor... lists it disabled with the reason, and choosing it says the reason
    once, starting no worker and no job."""
    (workspace / "relu.py").write_text(REFERENCE)
    path = workspace / "relu_new.py"
    path.write_text(LOAD_INLINE_CANDIDATE)
    uri = open_document(client, path, LOAD_INLINE_CANDIDATE)
    lines = LOAD_INLINE_CANDIDATE.splitlines()
    kernel_line = next(i for i, text in enumerate(lines) if "void relu_kernel(" in text)

    [action] = await sanitize_actions(client, uri, kernel_line)
    assert action.title == "Check memory safety (compute-sanitizer) — unavailable: needs a GPU"
    assert action.disabled is None
    assert action.command.command == "kernel-lsp.sanitize" and list(action.command.arguments) == [uri]
    [disabled] = await sanitize_actions(client, uri, kernel_line, only=[types.CodeActionKind.Refactor])
    assert disabled.title == "Check memory safety (compute-sanitizer)" and disabled.disabled.reason == NO_GPU_HERE
    assert not await sanitize_actions(client, uri, lines.index("class ModelNew(torch.nn.Module):"))  # no kernel

    helper = workspace / "helper.py"  # a kernel, but no reference and no ModelNew: it says why
    helper_text = LOAD_INLINE_CANDIDATE.replace("# kernel-lsp: reference=relu.py", "#").replace("ModelNew", "Other")
    helper_uri = open_document(client, helper, helper_text)
    [not_candidate] = await sanitize_actions(client, helper_uri, kernel_line, only=[types.CodeActionKind.Refactor])
    assert not_candidate.disabled is not None and not_candidate.disabled.reason.startswith("not a candidate")

    answer = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=action.command.command, arguments=action.command.arguments))
    assert answer == {"uri": uri, "status": "unavailable", "message": NO_GPU_HERE}, answer
    [said] = no_gpu_messages(client)
    assert said.type == types.MessageType.Warning and said.message.startswith("kernel-lsp: relu_new.py not checked")
    assert not client.worker_statuses and not client.progress_reports  # known without a job
    assert not sanitizer_diagnostics(client)
    hover = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=kernel_line, character=18)))
    assert hover is not None and "relu_kernel" in hover.contents.value


async def test_a_cu_program_gets_the_action_and_a_plain_cu_file_does_not(client: LanguageClient, workspace: Path):
    from tests.gpu.sanitizer_candidates import STANDALONE

    program = workspace / "prog.cu"
    uri = open_document(client, program, STANDALONE)
    lines = STANDALONE.splitlines()
    kernel_line = next(i for i, text in enumerate(lines) if "void scale(" in text)
    [action] = await sanitize_actions(client, uri, kernel_line)
    assert action.title.endswith("unavailable: needs a GPU") and list(action.command.arguments) == [uri]
    library = STANDALONE[:STANDALONE.index("int main(")]  # the same kernel, no main(): nothing to run
    plain_uri = open_document(client, workspace / "kernels.cu", library)
    assert not await sanitize_actions(client, plain_uri, kernel_line)
    answer = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=action.command.command, arguments=action.command.arguments))
    assert answer == {"uri": uri, "status": "unavailable", "message": NO_GPU_HERE}, answer


async def test_after_verification_a_missing_gpu_is_said_once(after_verify: LanguageClient, workspace: Path):
    client = after_verify
    (workspace / "relu.py").write_text(REFERENCE)
    path = workspace / "relu_new.py"
    path.write_text(TRITON_CANDIDATE)
    uri = open_document(client, path, TRITON_CANDIDATE)

    def verifications_ended() -> int:
        return sum(1 for token, reports in client.progress_reports.items()
                   if str(token).startswith("kernel-lsp/verify/") and reports  # created, not begun yet: none
                   and isinstance(reports[-1], types.WorkDoneProgressEnd) and reports[-1].message.startswith("correct"))

    save_document(client, uri)
    await wait_until(lambda: verifications_ended() == 1, 240, "the first verification")
    await wait_until(lambda: no_gpu_messages(client), 60, "the warning that compute-sanitizer needs a GPU")

    edited = TRITON_CANDIDATE + "\n# saved again: new content\n"
    path.write_text(edited)
    replace_document(client, uri, edited, version=2)
    save_document(client, uri)
    await wait_until(lambda: verifications_ended() == 2, 240, "the second verification")
    await asyncio.sleep(2.0)  # a check after it would have said so by now
    [said] = no_gpu_messages(client)
    assert said.type == types.MessageType.Warning
    assert not sanitizer_diagnostics(client)
