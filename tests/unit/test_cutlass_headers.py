"""The CUTLASS/CuTe headers: where they are found (the cutlassInclude setting, $CUTLASS_PATH/include, the
nvidia-cutlass package), CuTe sources compiled by the real nvcc against them (a .cu and a load_inline .py), and a
missing header's message saying what to do."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from kernel_lsp.compile import toolchain
from kernel_lsp.compile.check import Document, Scratch, check_document
from kernel_lsp.compile.toolchain import cutlass_headers
from kernel_lsp.config import Settings
from kernel_lsp.findings import path_to_uri

pytestmark = pytest.mark.timeout(1800)  # nvcc over torch's headers, on a loaded 2-core machine

NEEDS_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)")
NEEDS_PACKAGE = pytest.mark.skipif(importlib.util.find_spec("cutlass_library") is None,
                                   reason="the CUTLASS headers need: pip install 'kernel-lsp[cutlass]'")

CUTE_CU = """\
#include <cute/tensor.hpp>
using namespace cute;

__global__ void scale_kernel(float* x, float s, int n) {
    Tensor t = make_tensor(make_gmem_ptr(x), make_shape(n));
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) t(i) = t(i) * s;
}
"""

CUTE_PY = '''\
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <cute/tensor.hpp>

__global__ void cute_scale(float* x, float s, int n) {
    auto t = cute::make_tensor(cute::make_gmem_ptr(x), cute::make_shape(n));
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) t(i) = t(i) * s;
}
void scale_cuda(torch::Tensor x, double s) {
    cute_scale<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), (float)s, (int)x.numel());
}
"""

ext = load_inline(name="cute_scale_ext", cpp_sources="void scale_cuda(torch::Tensor x, double s);",
                  cuda_sources=cuda_src, functions=["scale_cuda"])
'''


def headers_folder(folder: Path, marker: str = "cute/tensor.hpp") -> Path:
    (folder / marker).parent.mkdir(parents=True)
    (folder / marker).write_text("// a header\n")
    return folder


def test_the_setting_comes_first_then_cutlass_path_then_the_package(tmp_path: Path, monkeypatch):
    package = headers_folder(tmp_path / "package" / "include", "cutlass/cutlass.h")
    monkeypatch.setattr(toolchain, "_cutlass_package_include", lambda: package)
    checkout = headers_folder(tmp_path / "checkout" / "include")
    setting = headers_folder(tmp_path / "mine")
    monkeypatch.setenv("CUTLASS_PATH", str(tmp_path / "checkout"))

    assert cutlass_headers(str(setting)) == toolchain.CutlassHeaders(str(setting), "the cutlassInclude setting")
    assert cutlass_headers("") == toolchain.CutlassHeaders(str(checkout), "$CUTLASS_PATH/include")
    # a setting naming a folder without the headers is passed over, not used
    assert cutlass_headers(str(tmp_path)).origin == "$CUTLASS_PATH/include"
    monkeypatch.delenv("CUTLASS_PATH")
    assert cutlass_headers("") == toolchain.CutlassHeaders(str(package), "the nvidia-cutlass package")
    monkeypatch.setattr(toolchain, "_cutlass_package_include", lambda: None)
    assert cutlass_headers("") is None
    problem = toolchain.cutlass_problem(str(tmp_path / "empty"))
    assert "pip install 'kernel-lsp[cutlass]'" in problem and "the nvidia-cutlass package (not installed)" in problem


@NEEDS_PACKAGE
def test_the_installed_package_is_found_without_importing_it():
    import sys

    found = cutlass_headers("")
    assert found is not None and found.origin in ("the nvidia-cutlass package", "$CUTLASS_PATH/include")
    assert (Path(found.include) / "cute" / "tensor.hpp").is_file()
    assert "cutlass_library" not in sys.modules or found.origin != "the nvidia-cutlass package"


@pytest.mark.slow
@NEEDS_NVCC
@NEEDS_PACKAGE
async def test_a_cute_cu_file_compiles_and_reports_its_kernels_resources(tmp_path: Path):
    path = tmp_path / "scale.cu"
    doc = Document(path_to_uri(path), path, CUTE_CU, 1)
    reports = [r async for r in check_document(doc, Settings.of(compile_timeout_s=900.0), Scratch())]
    findings = reports[-1].findings
    assert [f.code for f in findings] == ["ptxas-resources"], [f.message for f in findings]
    assert findings[0].range.start.line == 3 and "scale_kernel" in findings[0].message


@pytest.mark.slow
@NEEDS_NVCC
@NEEDS_PACKAGE
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (its headers)")
async def test_a_load_inline_file_with_cute_sources_compiles_with_torchs_flags(tmp_path: Path):
    path = tmp_path / "candidate.py"
    doc = Document(path_to_uri(path), path, CUTE_PY, 1)
    reports = [r async for r in check_document(doc, Settings.of(compile_timeout_s=900.0), Scratch())]
    findings = reports[-1].findings
    errors = [f for f in findings if f.severity == 1]
    assert errors == [], [f.message for f in errors]
    resources = [f for f in findings if f.code == "ptxas-resources"]
    assert len(resources) == 1 and resources[0].range.start.line == CUTE_PY.split("\n").index(
        "__global__ void cute_scale(float* x, float s, int n) {")


@pytest.mark.slow
@NEEDS_NVCC
async def test_a_missing_cute_header_says_where_kernel_lsp_looked_and_what_to_do(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(toolchain, "_cutlass_package_include", lambda: None)
    monkeypatch.delenv("CUTLASS_PATH", raising=False)
    path = tmp_path / "scale.cu"
    doc = Document(path_to_uri(path), path, CUTE_CU, 1)
    settings = Settings.of(cutlass_include=str(tmp_path / "nowhere"), compile_timeout_s=900.0)
    reports = [r async for r in check_document(doc, settings, Scratch())]
    (error,) = [f for f in reports[-1].findings if f.severity == 1]
    assert error.range.start.line == 0 and "cute/tensor.hpp" in error.message
    assert "pip install 'kernel-lsp[cutlass]'" in error.message and "cutlassInclude" in error.message


THREE_MISTAKES = """\
#include <cute/tensor.hpp>
using namespace cute;

__global__ void wrong_rank(float* x, int n) {
    Tensor t = make_tensor(make_gmem_ptr(x), make_shape(n), 3);
    t(threadIdx.x) = 0.f;
}

__global__ void missing_argument(float* x) {
    Int c;
    x[0] = c;
}

__global__ void asserted(float* x) {
    auto layout = make_layout(make_shape(Int<2>{}, Int<4>{}));
    CUTE_STATIC_ASSERT_V(rank(layout) == Int<3>{});
    x[0] = layout(0);
}
"""


@pytest.mark.slow
@NEEDS_NVCC
@NEEDS_PACKAGE
async def test_cute_template_errors_are_one_short_finding_each_on_the_users_line(tmp_path: Path):
    """A layout of the wrong rank (its error is deep in CuTe's headers), a missing template argument and a failed
    static assertion: each on its own line of the user's file, short, the header chain collapsed."""
    path = tmp_path / "three.cu"
    doc = Document(path_to_uri(path), path, THREE_MISTAKES, 1)
    reports = [r async for r in check_document(doc, Settings.of(compile_timeout_s=900.0), Scratch())]
    errors = [f for f in reports[-1].findings if f.severity == 1]
    lines = THREE_MISTAKES.split("\n")
    by_line = {}
    for error in errors:
        by_line.setdefault(error.range.start.line, []).append(error)
    assert 0 not in by_line  # nothing on the #include line
    (rank,) = by_line[lines.index("    t(threadIdx.x) = 0.f;")]  # where the user's code instantiated it
    assert rank.message.startswith('static_assert failed: "Mismatched Ranks" (cute/stride.hpp:'), rank.message
    assert len(rank.message) <= 300 and "detected during" not in rank.message
    assert rank.related[0].uri.endswith("/cute/stride.hpp")  # the header's line first
    assert any("instantiation frames inside template library headers" in r.message for r in rank.related)
    assert any(r.message.startswith("then: cannot deduce the return type") for r in rank.related)  # merged
    missing = by_line[lines.index("    Int c;")]
    assert 'argument list for alias template "cute::Int" is missing' in missing[0].message
    (asserted,) = by_line[lines.index("    CUTE_STATIC_ASSERT_V(rank(layout) == Int<3>{});")]
    assert "static assertion failed" in asserted.message


@pytest.mark.slow
@NEEDS_NVCC
@NEEDS_PACKAGE
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (its headers)")
async def test_a_cute_template_error_in_load_inline_sources_lands_on_the_py_line(tmp_path: Path):
    source = CUTE_PY.replace("cute::make_shape(n))", "cute::make_shape(n), 3)")
    path = tmp_path / "candidate.py"
    doc = Document(path_to_uri(path), path, source, 1)
    reports = [r async for r in check_document(doc, Settings.of(compile_timeout_s=900.0), Scratch())]
    (error,) = [f for f in reports[-1].findings if f.severity == 1]
    assert error.range.start.line == source.split("\n").index("    if (i < n) t(i) = t(i) * s;")
    assert error.message.startswith('static_assert failed: "Mismatched Ranks"'), error.message
