"""Verification in the editor: save -> worker "verify" job -> diagnostics, a code lens on ModelNew, $/progress."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from kernel_lsp.findings import path_to_uri
from tests.lsp.helpers import (
    initialize_params,
    open_document,
    replace_document,
    save_document,
    server_config,
    wait_for_publish,
)

REFERENCE = '''\
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 33)]


def get_init_inputs():
    return []
'''

TRITON_CANDIDATE = '''\
# kernel-lsp: reference=relu.py
import torch
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x, OFFSET), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
        return out
'''

CPU_SETTINGS = {"debounceMs": 50, "verifyDevice": "cpu", "trials": 2, "timedCalls": 5, "warmupCalls": 1,
                "baselines": ["eager"]}


def candidate(offset: str = "0.0") -> str:
    return TRITON_CANDIDATE.replace("OFFSET", offset)


def open_on_disk(client: LanguageClient, path: Path, text: str) -> str:
    """Written first, as an editor writes a file before it sends didSave: the worker verifies what is on disk."""
    path.write_text(text)
    return open_document(client, path, text)


def lens_titles(lenses: list[types.CodeLens] | None) -> list[str]:
    return [lens.command.title for lens in lenses or [] if lens.command]


async def code_lenses(client: LanguageClient, uri: str) -> list[types.CodeLens]:
    return await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))) or []


async def wait_for_lens(client: LanguageClient, uri: str, predicate, timeout: float = 240.0) -> types.CodeLens:
    deadline = time.monotonic() + timeout
    titles: list[str] = []
    while time.monotonic() < deadline:
        lenses = await code_lenses(client, uri)
        titles = lens_titles(lenses)
        for lens in lenses:
            if lens.command and predicate(lens.command.title):
                return lens
        await asyncio.sleep(0.2)
    raise AssertionError(f"no matching code lens within {timeout} s; last titles: {titles}")


def verify_codes(params: types.PublishDiagnosticsParams) -> list[str]:
    return sorted(str(d.code) for d in params.diagnostics if str(d.code).startswith(("verify", "integrity", "run-")))


async def verify_command(client: LanguageClient, uri: str) -> dict:
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.verify", arguments=[uri]))


@pytest_lsp.fixture(config=server_config())
async def unreachable(lsp_client: LanguageClient, workspace: Path):
    """A server whose worker address refuses connections."""
    await lsp_client.initialize_session(initialize_params(workspace, {"debounceMs": 50,
                                                                      "worker": "tcp:127.0.0.1:1"}))
    yield
    await lsp_client.shutdown_session()


async def test_missing_reference_is_a_diagnostic_on_the_header(client: LanguageClient, workspace: Path):
    text = "import torch\n\n# kernel-lsp: reference=nowhere.py\nclass ModelNew:\n    pass\n"
    uri = open_document(client, workspace / "cand.py", text)
    save_document(client, uri)
    params = await wait_for_publish(client, uri, lambda p: any(d.code == "verify-reference-error"
                                                              for d in p.diagnostics))
    (problem,) = [d for d in params.diagnostics if d.code == "verify-reference-error"]
    assert problem.range.start.line == 2 and "nowhere.py" in problem.message
    assert lens_titles(await code_lenses(client, uri)) == []
    (workspace / "nowhere.py").write_text(REFERENCE)
    after = len(client.published)
    save_document(client, uri)
    await wait_for_publish(client, uri, lambda p: "verify-reference-error" not in verify_codes(p), after=after)


async def test_a_file_that_is_no_candidate_is_left_alone(client: LanguageClient, workspace: Path):
    uri = open_document(client, workspace / "helpers.py", "def f(x):\n    return x\n")
    save_document(client, uri)
    await asyncio.sleep(1.0)
    assert all(not p.diagnostics for _, p in client.published if p.uri == uri)
    assert lens_titles(await code_lenses(client, uri)) == []
    assert not client.progress_reports
    answer = await verify_command(client, uri)
    assert answer["status"] == "not-a-candidate"


async def test_a_reference_asked_to_verify_is_told_it_is_one(client: LanguageClient, workspace: Path):
    """Not "define Model": it has Model, and lacks the ModelNew a verification runs."""
    path = workspace / "relu.py"
    path.write_text(REFERENCE)
    answer = await verify_command(client, open_document(client, path, REFERENCE))
    assert answer["status"] == "not-a-candidate" and answer["message"].startswith("a reference (Model"), answer
    assert [m.message for m in client.messages] == [f"kernel-lsp: relu.py: {answer['message']}"]


async def test_open_candidate_offers_a_verify_lens_on_model_new(client: LanguageClient, workspace: Path):
    (workspace / "relu.py").write_text(REFERENCE)
    uri = open_document(client, workspace / "relu_new.py", candidate())
    (lens,) = await code_lenses(client, uri)
    assert lens.command.title == "verify against relu.py"
    assert lens.command.command == "kernel-lsp.verify" and list(lens.command.arguments) == [uri]
    assert lens.range.start.line == candidate().split("\n").index("class ModelNew(torch.nn.Module):")


async def test_unavailable_worker_is_one_diagnostic_and_the_lens_says_so(unreachable: LanguageClient,
                                                                         workspace: Path):
    client = unreachable
    (workspace / "relu.py").write_text(REFERENCE)
    uri = open_on_disk(client, workspace / "relu_new.py", candidate())
    save_document(client, uri)
    params = await wait_for_publish(client, uri, lambda p: "verify-unavailable" in verify_codes(p), timeout=60)
    (problem,) = [d for d in params.diagnostics if d.code == "verify-unavailable"]
    assert problem.range.start.line == 0 and "tcp:127.0.0.1:1" in problem.message
    # the worker's absence is the setup's, not an error of the file
    assert problem.severity == types.DiagnosticSeverity.Information
    lens = await wait_for_lens(client, uri, lambda t: t.startswith("not verified: "))
    assert "unavailable" in lens.command.title
    tokens = [t for t, reports in client.progress_reports.items() if str(t).startswith("kernel-lsp/verify/")]
    assert tokens and isinstance(client.progress_reports[tokens[0]][-1], types.WorkDoneProgressEnd)


# ---- end to end on the CPU: the worker's real "verify" job, Triton under TRITON_INTERPRET=1 -------------------


@pytest_lsp.fixture(config=server_config({"TRITON_INTERPRET": "1"}))
async def cpu(lsp_client: LanguageClient, workspace: Path):
    """A server whose local worker (and its sandbox) run Triton kernels on the CPU."""
    await lsp_client.initialize_session(initialize_params(workspace, CPU_SETTINGS))
    yield
    await lsp_client.shutdown_session()


def verify_progress(client: LanguageClient) -> list[list]:
    return [reports for token, reports in client.progress_reports.items() if str(token).startswith("kernel-lsp/verify/")]


async def test_saved_honest_candidate_is_verified_with_a_lens_and_progress(cpu: LanguageClient, workspace: Path):
    (workspace / "relu.py").write_text(REFERENCE)
    uri = open_on_disk(cpu, workspace / "relu_new.py", candidate())
    save_document(cpu, uri)
    lens = await wait_for_lens(cpu, uri, lambda t: t != "verifying…" and not t.startswith("verify against"))
    assert lens.command.title.startswith("correct 2/2"), lens.command.title
    assert lens.command.title == "correct 2/2 · run on the CPU: timings not comparable"  # no interpreter ratios
    assert lens.range.start.line == candidate().split("\n").index("class ModelNew(torch.nn.Module):")
    assert verify_codes(await wait_for_publish(cpu, uri)) == []
    (reports,) = verify_progress(cpu)
    assert isinstance(reports[0], types.WorkDoneProgressBegin) and reports[0].title == "Verifying relu_new.py"
    assert any(isinstance(r, types.WorkDoneProgressReport) for r in reports)
    assert isinstance(reports[-1], types.WorkDoneProgressEnd) and reports[-1].message == lens.command.title

    replace_document(cpu, uri, candidate() + "\n# an unsaved edit\n", version=2)
    stale = await wait_for_lens(cpu, uri, lambda t: t.endswith("(before your last edit)"), timeout=10)
    assert stale.command.title == lens.command.title + " (before your last edit)"


async def test_wrong_candidate_gets_a_mismatch_on_forward(cpu: LanguageClient, workspace: Path):
    (workspace / "relu.py").write_text(REFERENCE)
    text = candidate("0.5")
    uri = open_on_disk(cpu, workspace / "relu_new.py", text)
    save_document(cpu, uri)
    params = await wait_for_publish(cpu, uri, lambda p: "verify-mismatch" in verify_codes(p), timeout=240)
    (mismatch,) = [d for d in params.diagnostics if d.code == "verify-mismatch"]
    assert mismatch.range.start.line == text.split("\n").index("    def forward(self, x):")
    assert mismatch.severity == types.DiagnosticSeverity.Error
    lens = await wait_for_lens(cpu, uri, lambda t: t.startswith("rejected"), timeout=10)
    assert "0/2" in lens.command.title

    # an unsaved edit with a syntax error: compile's diagnostic joins the verdict, which is kept, marked stale
    replace_document(cpu, uri, text + "def broken(:\n", version=2)
    both = await wait_for_publish(cpu, uri, lambda p: p.version == 2 and any(d.code == "python-syntax"
                                                                             for d in p.diagnostics))
    assert "verify-mismatch" in verify_codes(both)
    assert lens_titles(await code_lenses(cpu, uri)) == [lens.command.title + " (before your last edit)"]


@pytest_lsp.fixture(config=server_config({"TRITON_INTERPRET": "1"}))
async def on_demand(lsp_client: LanguageClient, workspace: Path):
    await lsp_client.initialize_session(initialize_params(workspace, {**CPU_SETTINGS, "verifyOnSave": False}))
    yield
    await lsp_client.shutdown_session()


async def test_verify_command_runs_on_demand(on_demand: LanguageClient, workspace: Path):
    (workspace / "relu.py").write_text(REFERENCE)
    uri = open_on_disk(on_demand, workspace / "relu_new.py", candidate())
    save_document(on_demand, uri)  # verifyOnSave is off: nothing runs
    await asyncio.sleep(0.5)
    assert lens_titles(await code_lenses(on_demand, uri)) == ["verify against relu.py"]
    answer = await verify_command(on_demand, uri)
    assert answer["status"] == "ok" and answer["summary"].startswith("correct 2/2"), answer
    assert answer["verdict"] == "verified"  # what a client words as "verified", never from the status alone
    assert lens_titles(await code_lenses(on_demand, uri)) == [answer["summary"]]

    # asked for by the user, the run verifies the buffer as shown, unsaved: the disk still holds the honest text
    replace_document(on_demand, uri, candidate("0.5"), version=2)
    unsaved = await verify_command(on_demand, uri)
    assert unsaved["status"] == "ok" and unsaved["summary"].startswith("rejected · correct 0/2"), unsaved
    assert unsaved["verdict"] == "rejected"
    assert lens_titles(await code_lenses(on_demand, uri)) == [unsaved["summary"]]  # of this text: not stale
    assert (workspace / "relu_new.py").read_text() == candidate()

    # a candidate that was never saved at all (no file on disk) is verified from its buffer too
    fresh = open_document(on_demand, workspace / "relu_unsaved.py", candidate())
    never_saved = await verify_command(on_demand, fresh)
    assert never_saved["status"] == "ok" and never_saved["summary"].startswith("correct 2/2"), never_saved
    assert not (workspace / "relu_unsaved.py").exists()


async def test_saving_the_reference_verifies_its_open_candidates_and_a_newer_save_cancels(cpu: LanguageClient,
                                                                                        workspace: Path):
    uri = open_on_disk(cpu, workspace / "relu_new.py", candidate())
    reference_uri = open_on_disk(cpu, workspace / "relu.py", REFERENCE)
    save_document(cpu, reference_uri)
    deadline = time.monotonic() + 60
    while not any(verify_progress(cpu)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    save_document(cpu, reference_uri)  # the second run replaces the first, which is cancelled
    lens = await wait_for_lens(cpu, uri, lambda t: t.startswith("correct"))
    assert lens.command.title.startswith("correct 2/2")
    ends = [reports[-1] for reports in verify_progress(cpu)]
    assert [end.message for end in ends] == ["cancelled", lens.command.title]
    assert lens_titles(await code_lenses(cpu, reference_uri)) == []  # the reference is no candidate itself


async def summary_entry(client: LanguageClient, path: Path) -> dict | None:
    state = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="kernel-lsp.workspaceSummary"))
    return next((f for f in state["files"] if f["path"] == str(path.resolve())), None)


@pytest_lsp.fixture(config=server_config({"TRITON_INTERPRET": "1"}))
async def watched(lsp_client: LanguageClient, workspace: Path):
    """As `cpu`, watching the disk itself (the test client does not send workspace/didChangeWatchedFiles)."""
    await lsp_client.initialize_session(initialize_params(workspace, {**CPU_SETTINGS, "watch": "watchdog"}))
    yield
    await lsp_client.shutdown_session()


async def test_a_closed_candidate_is_verified_again_when_its_reference_changes_on_disk(watched: LanguageClient,
                                                                                       workspace: Path):
    """Never opened: written on disk after the start (as a checkout would), verified in the background, its verdict
    published and listed in the workspace summary; the reference changed on disk -> verified again, the mismatch
    gone. (Candidates already there at the start are compile-checked, not verified: that waits for a change.)"""
    deadline = time.monotonic() + 30
    while not (await watched.workspace_execute_command_async(types.ExecuteCommandParams(
            command="kernel-lsp.workspaceSummary")))["ready"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    (workspace / "relu.py").write_text(REFERENCE)
    path = workspace / "relu_new.py"
    path.write_text(candidate("0.5"))
    uri = path.resolve().as_uri()
    rejected = await wait_for_publish(watched, uri, lambda p: "verify-mismatch" in verify_codes(p), timeout=240)
    assert rejected.version is None
    entry = await summary_entry(watched, path)
    assert entry is not None and not entry["open"] and entry["verify"].startswith("rejected"), entry

    mark = len(watched.published)
    (workspace / "relu.py").write_text(REFERENCE.replace("torch.relu(x)", "torch.clamp(x, min=0.5)"))
    deadline = time.monotonic() + 240
    while not (entry := await summary_entry(watched, path))["verify"].startswith("correct 2/2"):
        assert time.monotonic() < deadline, entry
        await asyncio.sleep(0.2)
    published = [p for _, p in watched.published[mark:] if p.uri == uri]
    assert published and verify_codes(published[-1]) == [] and published[-1].version is None


async def verified_in_a_server_that_then_stops(config, workspace: Path, path: Path, text: str) -> dict:
    """`text` (a wrong candidate) written to `path` and verified by a server that then shuts down, flushing the
    verdict to the on-disk cache; its answer."""
    server = await config.start()
    try:
        await server.initialize_session(initialize_params(workspace, {**CPU_SETTINGS, "verifyOnSave": False}))
        answer = await verify_command(server, open_on_disk(server, path, text))
        assert answer["summary"].startswith("rejected · correct 0/2"), answer
    finally:
        await server.shutdown_session()  # flushes the cache
    return answer


async def test_a_verdict_survives_a_restart_for_the_same_files_and_only_for_them(workspace: Path, tmp_path: Path):
    """The verdict and its findings are kept in the workspace's on-disk cache under the job's content-addressed key:
    a restarted server shows them on open, with their age, without running anything; other text shows none."""
    config = server_config({"TRITON_INTERPRET": "1", "KERNEL_LSP_CACHE_DIR": str(tmp_path / "cache")})
    (workspace / "relu.py").write_text(REFERENCE)
    wrong = candidate("0.5")
    answer = await verified_in_a_server_that_then_stops(config, workspace, workspace / "relu_new.py", wrong)

    second = await config.start()
    try:
        await second.initialize_session(initialize_params(workspace, {**CPU_SETTINGS, "verifyOnSave": False}))
        uri = open_document(second, workspace / "relu_new.py", wrong)
        params = await wait_for_publish(second, uri, lambda p: "verify-mismatch" in verify_codes(p), timeout=30)
        assert [d.range.start.line for d in params.diagnostics if d.code == "verify-mismatch"] == \
            [wrong.split("\n").index("    def forward(self, x):")]
        titles = lens_titles(await code_lenses(second, uri))
        assert titles == [answer["summary"] + " (verified just now)"], titles
        assert not verify_progress(second)  # shown from the cache: nothing ran
        other = open_on_disk(second, workspace / "relu_other.py", candidate("0.25"))
        assert lens_titles(await code_lenses(second, other)) == ["verify against relu.py"]
    finally:
        await second.shutdown_session()


async def test_after_a_restart_a_closed_candidates_kept_verdict_is_published_before_it_is_opened(workspace: Path,
                                                                                                tmp_path: Path):
    """A verdict kept on disk for a candidate's files as they are is shown at start-up (in the Problems panel and
    the workspace summary), not only once the file is opened again; nothing runs for it."""
    config = server_config({"TRITON_INTERPRET": "1", "KERNEL_LSP_CACHE_DIR": str(tmp_path / "cache")})
    (workspace / "relu.py").write_text(REFERENCE)
    path = workspace / "relu_new.py"
    answer = await verified_in_a_server_that_then_stops(config, workspace, path, candidate("0.5"))

    second = await config.start()
    try:
        await second.initialize_session(initialize_params(workspace, {**CPU_SETTINGS, "verifyOnSave": False}))
        params = await wait_for_publish(second, path_to_uri(path), lambda p: "verify-mismatch" in verify_codes(p),
                                        timeout=30)
        assert params.version is None  # a closed file's
        entry = await summary_entry(second, path)
        assert entry is not None and not entry["open"] and entry["verify"] == answer["summary"] + \
            " (verified just now)", entry
        assert not verify_progress(second)  # shown from the cache: nothing ran
    finally:
        await second.shutdown_session()
