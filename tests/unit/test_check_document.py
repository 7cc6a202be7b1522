"""check_document on load_inline files: device results first, host (main.cpp) results mapped to the .py."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from kernel_lsp.compile.check import Document, Scratch, check_document
from kernel_lsp.config import Settings
from kernel_lsp.findings import path_to_uri

pytestmark = [
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (its headers)"),
]

SOURCE = '''\
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
__global__ void scale(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
void scale_cuda(torch::Tensor x, double s) {
    scale<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), (float)s, (int)x.numel());
}
"""

cpp_src = (
    "void scale_cuda(torch::Tensor x, double s);\\n"
    "int helper() { return not_declared_anywhere; }"
)

ext = load_inline(name="scale_ext", cpp_sources=cpp_src, cuda_sources=cuda_src,
                  functions=["scale_cuda", "no_such_function"])
'''


@pytest.mark.slow
async def test_device_stage_reports_first_then_host_errors_on_py_lines(tmp_path: Path):
    path = tmp_path / "candidate.py"
    doc = Document(path_to_uri(path), path, SOURCE, 1)
    reports = [r async for r in check_document(doc, Settings(), Scratch())]
    assert [r.stage for r in reports] == ["python", "device", "host", "done"]
    assert [f.code for f in reports[1].findings] == ["ptxas-resources"]
    lines = SOURCE.split("\n")
    assert reports[1].findings[0].range.start.line == lines.index(
        "__global__ void scale(float* x, float s, int n) {")

    host = {f.message.split(";")[0]: f for f in reports[-1].findings if f.code == "host-error"}
    undeclared = next(f for m, f in host.items() if "not_declared_anywhere" in m)
    row = next(i for i, line in enumerate(lines) if "not_declared_anywhere" in line)
    assert (undeclared.range.start.line, undeclared.range.start.character) == (row, lines[row].index("not_declared"))
    # the PYBIND11_MODULE lines torch generates have no place in the .py: the load_inline call carries them
    missing = next(f for m, f in host.items() if "no_such_function" in m)
    assert missing.range.start.line == lines.index(
        'ext = load_inline(name="scale_ext", cpp_sources=cpp_src, cuda_sources=cuda_src,')
    assert reports[-1].final and not any(r.final for r in reports[:-1])


def test_a_missing_cuda_header_of_a_cpu_torch_is_blamed_on_the_build(tmp_path):
    """compile.check._with_header_advice: the header advice for torch's CUDA headers, given only where torch's
    include folder lacks the CUDA configuration header (a CPU build); a CUDA build's message stays nvcc's."""
    from kernel_lsp.compile.check import _with_header_advice
    from kernel_lsp.compile.toolchain import TorchHeaders
    from kernel_lsp.config import Settings
    from kernel_lsp.findings import Finding, Range, Severity

    include = tmp_path / "torch" / "include"
    (include / "c10" / "cuda").mkdir(parents=True)
    torch = TorchHeaders((str(include), str(tmp_path / "python")), "c++17")
    missing = Finding("file:///x.py", Range.line(3), Severity.ERROR, "kernel-lsp", "host-error",
                      "cusparse.h: No such file or directory (in cuda/CUDAContextLight.h:10, instantiated here)")
    advised = _with_header_advice(missing, Settings(), torch)
    assert "comes with a CUDA build of torch, and this one is a CPU build" in advised.message
    assert str(include) in advised.message and advised.data["torchBuild"] == "cpu"
    # the machine's limit, not the file's error: Information, under its own code, the compiler's kept in the data
    assert (advised.severity, advised.code, advised.data["compilerCode"]) == (Severity.INFORMATION,
                                                                              "torch-cpu-build", "host-error")
    other = Finding("file:///x.py", Range.line(3), Severity.ERROR, "kernel-lsp", "host-error",
                    "my_header.h: No such file or directory")
    assert _with_header_advice(other, Settings(), torch) == other  # the user's own missing header: nvcc's words
    (include / "c10" / "cuda" / "impl").mkdir()
    (include / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("")
    assert _with_header_advice(missing, Settings(), torch) == missing  # a CUDA build: something else is wrong
