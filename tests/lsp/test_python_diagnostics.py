"""Compile diagnostics for load_inline sources inside .py files, mapped back to the .py lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.lsp.helpers import codes, needs_nvcc, open_document, wait_for_publish

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed: load_inline sources compile against its headers")

CANDIDATE = '''\
import torch
from torch.utils.cpp_extension import load_inline

cuda_source = """
__global__ void add_one(const float* a, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + 1.0f + missing_value;
}

torch::Tensor add_one_cuda(torch::Tensor a) {
    auto out = torch::empty_like(a);
    int n = a.numel();
    add_one<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor add_one_cuda(torch::Tensor a);"

ext = load_inline(name="add_one_ext", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["add_one_cuda"], verbose=False)


class ModelNew(torch.nn.Module):
    def forward(self, a):
        return ext.add_one_cuda(a)
'''


@needs_nvcc
@needs_torch
async def test_load_inline_error_lands_on_the_py_line(client: LanguageClient, workspace: Path):
    path = workspace / "model_new.py"
    uri = open_document(client, path, CANDIDATE)
    params = await wait_for_publish(client, uri, lambda p: any(d.code == "nvcc-error" for d in p.diagnostics),
                                    timeout=240)
    (error,) = [d for d in params.diagnostics if d.code == "nvcc-error"]
    line = CANDIDATE.split("\n").index("    if (i < n) out[i] = a[i] + 1.0f + missing_value;")
    assert error.range.start.line == line
    assert error.range.start.character == CANDIDATE.split("\n")[line].index("missing_value")
    assert error.range.end.character == error.range.start.character + len("missing_value")
    assert 'identifier "missing_value" is undefined' in error.message

    fixed = CANDIDATE.replace(" + missing_value", "")
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=fixed)]))
    done = await wait_for_publish(client, uri, lambda p: p.version == 2 and "ptxas-resources" in codes(p),
                                  timeout=240)
    resources = [d for d in done.diagnostics if d.code == "ptxas-resources"]
    assert resources[0].range.start.line == fixed.split("\n").index(
        "__global__ void add_one(const float* a, float* out, int n) {")
    assert not [d for d in done.diagnostics if d.severity == types.DiagnosticSeverity.Error]


async def test_python_syntax_error_is_a_diagnostic(client: LanguageClient, workspace: Path):
    text = "import torch\n\ndef forward(x):\n    return x +\n"
    uri = open_document(client, workspace / "broken.py", text)
    params = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
    assert codes(params) == ["python-syntax"]
    assert params.diagnostics[0].range.start.line == 3
    assert params.diagnostics[0].severity == types.DiagnosticSeverity.Error
