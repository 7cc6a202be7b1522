"""Compile diagnostics for .cu files, end to end over stdio with a real LSP client and the real nvcc."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.conftest import FIXTURES
from tests.lsp.helpers import (
    codes,
    initialize_params,
    needs_nvcc,
    open_document,
    replace_document,
    save_document,
    server_config,
    wait_for_publish,
)

BAD = "__global__ void f(int* p){ int x = ; p[0] = y; }\n"
GOOD = "__global__ void f(int* p){ int x = 1; p[0] = x; }\n"

pytestmark = needs_nvcc


def errors(params: types.PublishDiagnosticsParams) -> list[types.Diagnostic]:
    return [d for d in params.diagnostics if d.severity == types.DiagnosticSeverity.Error]


async def test_errors_at_exact_lines_and_columns_then_cleared_on_fix(client: LanguageClient, workspace: Path):
    path = workspace / "bad.cu"
    path.write_text(BAD)
    uri = open_document(client, path, "\n\n" + BAD)  # two blank lines first: line numbers must follow
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
    found = sorted((d.range.start.line, d.range.start.character, d.range.end.character, d.message)
                   for d in errors(params))
    assert [(line, col, end) for line, col, end, _ in found] == [
        (2, BAD.index("= ;") + 2, BAD.index("= ;") + 3), (2, BAD.index("= y") + 2, BAD.index("= y") + 3)]
    assert "expected an expression" in found[0][3]
    assert 'identifier "y" is undefined' in found[1][3]
    assert params.version == 1
    assert {d.code for d in errors(params)} == {"nvcc-error"}

    replace_document(client, uri, GOOD, version=2)
    path.write_text(GOOD)
    save_document(client, uri)
    fixed = await wait_for_publish(client, uri, lambda p: p.version == 2)
    assert errors(fixed) == []
    assert codes(fixed) == ["ptxas-resources"]
    assert fixed.diagnostics[0].range.start.line == 0
    assert fixed.diagnostics[0].message.startswith("f: sm_90:")


async def test_kernels_fixture_gives_ptxas_resources_for_each_kernel(client: LanguageClient, workspace: Path):
    text = (FIXTURES / "kernels.cu").read_text()
    path = workspace / "kernels.cu"
    path.write_text(text)
    uri = open_document(client, path, text)
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
    resources = {d.data["kernel"]: d for d in params.diagnostics if d.code == "ptxas-resources"}
    assert sorted(resources) == sorted(["vec_add", "transpose_read_uncoalesced", "smem_conflict", "divergent",
                                        "spills", "tiny_grid", "matmul_naive"])
    spills = resources["spills"]
    assert spills.severity == types.DiagnosticSeverity.Information
    assert spills.range.start.line == text.split("\n").index(
        "__global__ void spills(const float* in, float* out, int n, int j) {")
    assert spills.data["resources"][0]["stackFrame"] == 1024
    assert "1024 B stack" in spills.message
    smem = resources["smem_conflict"].data["resources"][0]
    assert (smem["sharedBytes"], smem["barriers"]) == (4096, 1)
    assert not errors(params)

    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    assert len(lenses) == 7
    assert all(lens.command.title.startswith("ptxas sm_90:") for lens in lenses)


SPILLING = """\
__global__ void __launch_bounds__(1024, 2) heavy(const float* in, float* out, int n, int j) {
    float acc[64];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    #pragma unroll
    for (int k = 0; k < 64; ++k) acc[k] = in[(i * 64 + k) % n];
    float s = 0.f;
    #pragma unroll
    for (int r = 0; r < 8; ++r)
        #pragma unroll
        for (int k = 0; k < 64; ++k) s += acc[k] * acc[(k * 7 + r) & 63] + acc[(k * 13 + r) & 63];
    out[i % n] = s + acc[j & 63];
}
"""


async def test_a_kernel_that_really_spills_gets_a_spill_warning(client: LanguageClient, workspace: Path):
    path = workspace / "heavy.cu"
    uri = open_document(client, path, SPILLING)
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
    spill = [d for d in params.diagnostics if d.code == "ptxas-spill"]
    assert len(spill) == 1, codes(params)
    assert spill[0].severity == types.DiagnosticSeverity.Warning
    assert spill[0].range.start.line == 0
    assert spill[0].range.start.character == SPILLING.index("heavy")
    assert spill[0].data["spillStores"] > 0 and spill[0].data["spillLoads"] > 0
    assert f"{spill[0].data['spillStores']} bytes spill stores" in spill[0].message


async def test_rapid_edits_publish_only_the_newest_version(client: LanguageClient, workspace: Path):
    path = workspace / "rapid.cu"
    uri = open_document(client, path, "__global__ void a(int* p){ p[0] = one; }\n", version=1)
    for version in range(2, 6):
        replace_document(client, uri, f"__global__ void a(int* p){{ p[0] = v{version}; }}\n", version=version)
    params = await wait_for_publish(client, uri, lambda p: p.version == 5)
    assert ['identifier "v5" is undefined' in d.message for d in errors(params)] == [True]
    assert [p.version for _, p in client.published if p.uri == uri] == [5]


async def test_header_error_shows_on_the_include_line_with_the_header_as_related(client: LanguageClient,
                                                                                 workspace: Path):
    (workspace / "util.cuh").write_text("#pragma once\n__device__ int twice(int x) { return 2 * undefined_name; }\n")
    text = '#include <cstdio>\n#include "util.cuh"\n__global__ void k(int* p) { p[0] = twice(p[1]); }\n'
    path = workspace / "main.cu"
    path.write_text(text)
    uri = open_document(client, path, text)
    params = await wait_for_publish(client, uri, lambda p: bool(errors(p)))
    (error,) = errors(params)
    assert error.range.start.line == 1
    assert "util.cuh:2" in error.message
    assert error.related_information[0].location.uri.endswith("/util.cuh")
    assert error.related_information[0].location.range.start.line == 1


async def test_unsaved_buffer_is_compiled_with_includes_relative_to_the_real_file(client: LanguageClient,
                                                                                    workspace: Path):
    (workspace / "inc").mkdir()
    (workspace / "inc" / "consts.cuh").write_text("#define WIDTH 32\n")
    path = workspace / "uses_header.cu"
    path.write_text("// saved content differs from the buffer\n")
    uri = open_document(client, path, '#include "inc/consts.cuh"\n__global__ void k(int* p) { p[0] = WIDTH; }\n')
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
    assert codes(params) == ["ptxas-resources"]


@pytest_lsp.fixture(config=server_config())
async def default_client(lsp_client: LanguageClient, workspace: Path):
    await lsp_client.initialize_session(initialize_params(workspace, {"debounceMs": 50}))
    yield
    await lsp_client.shutdown_session()


async def test_by_default_a_healthy_kernel_has_a_lens_and_no_problem_while_a_spill_is_a_warning(
        default_client: LanguageClient, workspace: Path):
    """resourceUsage defaults to the code lens: the Problems panel holds no entry per healthy kernel."""
    client = default_client
    uri = open_document(client, workspace / "good.cu", GOOD)
    await wait_for_publish(client, uri, lambda p: True)
    lenses: list[types.CodeLens] = []
    for _ in range(200):
        lenses = await client.text_document_code_lens_async(
            types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))) or []
        if lenses:
            break
        await asyncio.sleep(0.05)
    assert [lens.command.title.startswith("ptxas sm_90: ") for lens in lenses] == [True], lenses
    assert all(not p.diagnostics for _, p in client.published if p.uri == uri)
    heavy = open_document(client, workspace / "heavy.cu", SPILLING)
    params = await wait_for_publish(client, heavy, lambda p: bool(p.diagnostics))
    assert codes(params) == ["ptxas-spill"]
