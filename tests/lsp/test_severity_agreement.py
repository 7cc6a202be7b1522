"""The same finding has the same severity, on the same line, in the terminal and in the editor: `kernel-lsp check`
and `kernel-lsp profile` (--format json) against a real server's published diagnostics on the same files. The
figures ptxas gives (ptxas-resources) are the one deliberate difference: the CLI prints them as info lines, the
editor shows them as a code lens on the kernel under the default resourceUsage "codeLens"."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from kernel_lsp.findings import Severity
from tests.lsp.helpers import initialize_params, needs_nvcc, open_document, server_config, wait_for_publish

pytestmark = needs_nvcc

TOUR = Path(__file__).resolve().parents[2] / "examples" / "tour"
FILES = ("broken.cu", "spill.cu")


@pytest_lsp.fixture(config=server_config())
async def default_client(lsp_client: LanguageClient, workspace: Path):
    await lsp_client.initialize_session(initialize_params(workspace, {"debounceMs": 50}))  # resourceUsage: default
    yield
    await lsp_client.shutdown_session()


def cli(*args: str, cwd: Path) -> str:
    result = subprocess.run([sys.executable, "-m", "kernel_lsp", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode in (0, 1), result.stderr
    return result.stdout


def cli_findings(workspace: Path) -> set[tuple[str, str, str, int]]:
    """(file, code, severity, 0-based line) of what `check` and `profile` print, ptxas's figures aside."""
    found = {(Path(f["path"]).name, f["code"], f["severity"], f["line"] - 1)
             for f in json.loads(cli("check", *FILES, "--format", "json", "--no-cache", cwd=workspace))
             if f["code"] != "ptxas-resources"}
    profile = json.loads(cli("profile", "spill.cu", "--format", "json", cwd=workspace))
    hints = [f for kernel in profile["kernels"] for f in kernel["findings"]]
    assert hints and all(f.get("line") for f in hints), hints  # static hints with a source line (-lineinfo)
    text = cli("profile", "spill.cu", cwd=workspace)  # the text output names the same severity
    assert all(any(line.split()[:2] == [f["diagnostic_severity"], f"{f['code']}:"] for line in text.splitlines())
               for f in hints), text
    return found | {("spill.cu", f["code"], f["diagnostic_severity"], f["line"] - 1) for f in hints}


async def test_check_and_profile_print_what_the_editor_shows(default_client: LanguageClient, workspace: Path):
    for name in FILES:
        shutil.copy(TOUR / name, workspace / name)
    expected = cli_findings(workspace)
    assert {code for _, code, _, _ in expected} >= {"nvcc-error", "ptxas-spill", "hint-spills"}, expected

    uris = {name: open_document(default_client, workspace / name, (workspace / name).read_text()) for name in FILES}
    await wait_for_publish(default_client, uris["broken.cu"], lambda p: any(d.code == "nvcc-error"
                                                                             for d in p.diagnostics))
    await wait_for_publish(default_client, uris["spill.cu"], lambda p: any(d.code == "ptxas-spill"
                                                                            for d in p.diagnostics))
    outcome = await default_client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="kernel-lsp.profile", arguments=[uris["spill.cu"], "heavy"]))
    assert outcome["kernels"] == ["heavy"], outcome
    await wait_for_publish(default_client, uris["spill.cu"], lambda p: any(d.code == "hint-spills"
                                                                            for d in p.diagnostics))
    shown = set()
    for name, uri in uris.items():
        latest = [p for _, p in default_client.published if p.uri == uri][-1]
        shown |= {(name, str(d.code), Severity(int(d.severity)).label, d.range.start.line) for d in latest.diagnostics}
    assert shown == expected

    # ptxas's figures: an info line in the terminal, a lens on the same line in the editor
    figures = {f["line"] - 1 for f in json.loads(cli("check", "spill.cu", "--format", "json", cwd=workspace))
               if f["code"] == "ptxas-resources"}
    lenses = await default_client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uris["spill.cu"])))
    assert figures and figures <= {lens.range.start.line for lens in lenses or [] if "registers" in lens.command.title}
