"""The kernel-only compile of load_inline CUDA units (kernel_lsp/compile/split.py): what it blanks and keeps, when
its result stands for the exact one (a certificate from an agreeing version, an edit inside kernel bodies only, no
error naming something torch's headers declare), and, with the real nvcc and torch's headers, that what it shows
before the exact compile is what the exact compile then says, over KernelBench-style candidates."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from kernel_lsp.compile.check import Document
from kernel_lsp.compile.diagnostics import parse_compiler_output
from kernel_lsp.compile.reuse import PRELIMINARY, Reuse
from kernel_lsp.compile.service import CompileService
from kernel_lsp.compile.split import output_of, quoted_names, skeleton, split_text, tokens_of, top_level_statements
from kernel_lsp.compile.units import load_inline_units
from kernel_lsp.config import Settings
from kernel_lsp.findings import path_to_uri
from kernel_lsp.sources import parse_python

pytestmark = pytest.mark.timeout(1800)  # nvcc over torch's headers, on a loaded 2-core machine

# a load_inline unit preprocesses torch's headers (~15 MB): ~40 s of nvcc alone, several minutes on a 2-core CI
# machine running three test workers; what these tests check is what the compile says, not how fast
COMPILE_TIMEOUT_S = 900.0

no_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)")
no_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (its headers)")


def candidate(cuda: str, name: str = "ext", cpp: str = "torch::Tensor forward(torch::Tensor x);") -> str:
    return (f'from torch.utils.cpp_extension import load_inline\n\ncuda_src = r"""{cuda}"""\n\n'
            f'ext = load_inline(name="{name}", cpp_sources="{cpp}", cuda_sources=cuda_src, functions=["forward"])\n')


# KernelBench-style: a reduction with a __device__ helper, shared memory, a struct, a namespace, a constant
SOFTMAX = candidate(r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

namespace {
constexpr int kBlock = 256;
struct Pair { float max; float sum; };
__constant__ float kScale[1] = {1.0f};

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
}  // namespace

__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float partial[kBlock / 32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = warp_max(m);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = m;
    __syncthreads();
    Pair p{partial[0], 0.f};
    for (int c = threadIdx.x; c < cols; c += blockDim.x) p.sum += __expf(row[c] - p.max);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[(size_t)blockIdx.x * cols + c] = kScale[0] * __expf(row[c] - p.max) / p.sum;
}

static inline int blocks_for(int rows) { return rows; }

torch::Tensor forward(torch::Tensor x) {
    TORCH_CHECK(x.dim() == 2, "softmax: 2-D input");
    auto y = torch::empty_like(x);
    softmax_kernel<<<blocks_for(x.size(0)), kBlock>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.size(1));
    return y;
}
""")
# two kernels, no includes (load_inline's prologue brings torch/types.h), a host prototype naming torch
TWO_KERNELS = candidate(r"""
__global__ void add_kernel(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* c, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] *= s;
}

torch::Tensor forward(torch::Tensor x);

torch::Tensor forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = (int)x.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), x.data_ptr<float>(), y.data_ptr<float>(), n);
    scale_kernel<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), 0.5f, n);
    return y;
}
""")
# a kernel template instantiated only by its wrapper: the split compile has no instance, so ptxas disagrees (no
# include of its own: load_inline's prologue brings torch/types.h, a quarter of torch/extension.h's nvcc time)
TEMPLATED = candidate(r"""
template <typename scalar_t>
__global__ void relu_kernel(const scalar_t* x, scalar_t* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > scalar_t(0) ? x[i] : scalar_t(0);
}

torch::Tensor forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = (int)x.numel();
    relu_kernel<float><<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
""")
TOUR = Path(__file__).resolve().parents[2] / "examples" / "tour" / "scale_inline.py"


def device_unit(text: str, tmp_path: Path):
    ext = parse_python(text).extensions[0]
    return next(u for u in load_inline_units(ext, tmp_path / "candidate.py", ()) if u.stage == "device")


def test_the_split_keeps_device_code_types_and_lines_and_blanks_what_names_torch(tmp_path: Path):
    unit = device_unit(SOFTMAX, tmp_path)
    split = split_text(unit)
    assert split is not None
    kept, original = split.split("\n"), unit.text.split("\n")
    assert len(kept) == len(original)
    for line, before in zip(kept, original):  # each line is kept as it was, or blanked whole
        assert line == before or (line.strip() == "" and len(line) == len(before)), (line, before)
    assert not re.search(r"torch|TORCH_|#include <torch", split)
    for still in ("namespace {", "struct Pair", "__constant__ float kScale", "warp_max(float v)",
                  "softmax_kernel(const float*", "#include <cuda_runtime.h>"):
        assert still in split, still
    assert "blocks_for" not in split  # a host function: only the (blanked) wrapper calls it


def test_top_level_statements_enter_namespaces_and_end_bodies_at_their_brace():
    code = ('namespace a { namespace b {\nint f(int x) { return x; }\n} }\nextern          {\nvoid g();\n}\n'
            'struct S { int v; } s;\nauto h = [](int y) { return y; };\ntemplate <typename T> T k(T t) { return t; }\n'
            'int n = 3;')
    statements = [code[start:end].strip() for start, end, _ in top_level_statements(code)]
    assert statements == ["int f(int x) { return x; }", "void g();", "struct S { int v; } s;",
                          "auto h = [](int y) { return y; };", "template <typename T> T k(T t) { return t; }",
                          "int n = 3;"]
    assert [function for _, _, function in top_level_statements(code)] == [True, False, False, False, True, False]


def test_the_skeleton_changes_with_everything_but_kernel_bodies(tmp_path: Path):
    base = skeleton(device_unit(TWO_KERNELS, tmp_path))
    inside = TWO_KERNELS.replace("if (i < n) c[i] *= s;", "if (i < n) {\n        c[i] *= s * 2.f;\n    }")
    assert skeleton(device_unit(inside, tmp_path)) == base
    for outside in (TWO_KERNELS.replace("float* c, float s, int n)", "float* c, double s, int n)"),  # a signature
                    TWO_KERNELS.replace("0.5f, n);", "0.25f, n);"),  # a wrapper
                    TWO_KERNELS.replace("__global__ void add_kernel", "#define K 2\n__global__ void add_kernel")):
        assert skeleton(device_unit(outside, tmp_path)) != base


def test_a_certificate_needs_agreeing_compiled_outputs_the_same_command_and_skeleton(tmp_path: Path):
    unit = device_unit(TWO_KERNELS, tmp_path)
    ptxas = ("ptxas info    : Compiling entry function '_Z10add_kernelPKfS0_Pfi' for 'sm_90'\n"
             "ptxas info    : Used 10 registers, used 0 barriers\nptxas info    : Compile time = {} ms\n")
    exact = output_of(0, ptxas.format("12.5"), [])
    split = output_of(0, ptxas.format("3.1"), [])  # compile times differ, the figures do not
    more = output_of(0, ptxas.format("3.1").replace("Used 10", "Used 12"), [])
    reuse = Reuse()
    argv = ["nvcc", "-arch=sm_90", unit.file_name]
    assert not reuse.composable("u", unit, argv)
    assert not reuse.certify("u", unit, argv, exact, more) and not reuse.composable("u", unit, argv)
    assert reuse.certify("u", unit, argv, exact, split) and reuse.composable("u", unit, argv)
    assert not reuse.composable("u", unit, ["nvcc", "-arch=sm_80", unit.file_name])
    edited = device_unit(TWO_KERNELS.replace("c[i] *= s;", "c[i] *= s * s;"), tmp_path)
    assert reuse.composable("u", edited, argv)
    wrapper = device_unit(TWO_KERNELS.replace("0.5f, n);", "0.25f, n);"), tmp_path)
    assert not reuse.composable("u", wrapper, argv)
    failed = parse_compiler_output(f'{unit.file_name}(4): error: identifier "q" is undefined\n')
    assert reuse.certify("v", unit, argv, output_of(1, "", failed), output_of(1, "", failed))
    assert not reuse.composable("v", unit, argv)  # agreeing errors: ptxas never ran, nothing to certify
    assert not reuse.certify("u", unit, argv, exact, more) and not reuse.composable("u", unit, argv)


def test_quoted_names_and_tokens():
    messages = parse_compiler_output('x.cu(4): error: identifier "idxq" is undefined\n'
                                     'x.cu(5): error: namespace "std" has no member "max"\n'
                                     'x.cu(6): error: expected a ";"\n  }\n  ^\n\n'
                                     'x.cu(8): error: name followed by "::" must be a class or namespace name\n'
                                     '      c[i] = (float)at::Half(a[i]);\n                    ^\n\n'
                                     'x.cu(7): warning #177-D: variable "unused" was declared but never referenced\n')
    assert quoted_names(messages) == {"idxq", "std", "max", "at"}
    assert tokens_of('#define CUDA_KERNEL_ASSERT(c) x\nnamespace at { struct Half; } // comment_word\n"lit"') \
        >= {"CUDA_KERNEL_ASSERT", "at", "Half"}
    assert "comment_word" not in tokens_of("// comment_word\n")


def _doc(path: Path, text: str, version: int) -> Document:
    return Document(path_to_uri(path), path, text, version)


def _shown(findings) -> list[tuple]:
    return sorted((f.range.start.line, f.range.start.character, f.severity, f.code, f.message) for f in findings)


async def _check(service: CompileService, path: Path, text: str, version: int, settings: Settings):
    return [r async for r in service.run(_doc(path, text, version), settings)]


def _composed(reports) -> list | None:
    """The findings of the report that showed the split result as the full one, if any."""
    for report in reports:
        if any((f.data or {}).get("composed") for f in report.findings) or (
                report.stage == "fast" and not any((f.data or {}).get("preliminary") for f in report.findings)):
            return report.findings
    return None


DEVICE_ONLY = Settings.of(checks={"hostCompile": False},  # main.cpp is the host compiler's: not what is tested here
                       compile_timeout_s=COMPILE_TIMEOUT_S)


def _first_body_line(text: str, kernel: str) -> str:
    """`text` with a line opening the body of `kernel` that declares an unused variable (a warning)."""
    start = text.index(kernel)
    brace = text.index("{", start)
    return text[:brace + 1] + "\n    float kernel_lsp_unused = 1.0f;" + text[brace + 1:]


@pytest.mark.slow
@no_nvcc
@no_torch
@pytest.mark.parametrize("name, text, kernel", [
    ("softmax", SOFTMAX, "softmax_kernel"),
    ("two kernels", TWO_KERNELS, "scale_kernel"),
    ("tour", TOUR.read_text(), "scale_kernel"),
])
async def test_what_the_split_shows_after_an_edit_in_a_kernel_is_what_the_exact_compile_says(
        tmp_path: Path, name: str, text: str, kernel: str):
    path = tmp_path / "candidate.py"
    service = CompileService()
    first = await _check(service, path, text, 1, DEVICE_ONLY)
    assert [f.code for f in first[-1].findings if f.code.startswith("nvcc-error")] == [], first[-1].findings
    await service.reuse.settled()
    edited = _first_body_line(text, kernel)
    reports = await _check(service, path, edited, 2, DEVICE_ONLY)
    composed = _composed(reports)
    assert composed is not None, [(r.stage, r.findings) for r in reports]
    assert reports.index(next(r for r in reports if r.findings is composed)) < len(reports) - 1
    assert any('"kernel_lsp_unused"' in f.message for f in composed) and \
        any(f.code == "ptxas-resources" for f in composed), composed
    assert _shown(composed) == _shown(reports[-1].findings)  # the exact compile said the same
    assert service.reuse.disagreements == 0


@pytest.mark.slow
@no_nvcc
@no_torch
async def test_errors_are_composed_unless_they_name_something_torch_declares(tmp_path: Path):
    path = tmp_path / "candidate.py"
    service = CompileService()
    await _check(service, path, TWO_KERNELS, 1, DEVICE_ONLY)
    await service.reuse.settled()
    typo = TWO_KERNELS.replace("c[i] = a[i] + b[i];", "c[i] = a[idxq] + b[i];")
    reports = await _check(service, path, typo, 2, DEVICE_ONLY)
    composed = _composed(reports)
    assert composed is not None and [f.message for f in composed if f.code == "nvcc-error"] == \
        ['identifier "idxq" is undefined'], [(r.stage, r.findings) for r in reports]
    assert _shown(composed) == _shown(reports[-1].findings)
    # `at` is torch's namespace: without its headers the name is missing, which is the split's doing, not the
    # user's; so the error is only preliminary, and the exact compile says the kernel is fine
    torch_named = TWO_KERNELS.replace("c[i] = a[i] + b[i];", "c[i] = (float)at::Half(a[i] + b[i]);")
    reports = await _check(service, path, torch_named, 3, DEVICE_ONLY)
    assert _composed(reports) is None
    preliminary = [f for r in reports for f in r.findings if (f.data or {}).get("preliminary")]
    assert all(PRELIMINARY in f.message for f in preliminary)
    assert not [f for f in reports[-1].findings if f.code == "nvcc-error"], reports[-1].findings


@pytest.mark.slow
@no_nvcc
@no_torch
async def test_a_kernel_template_instantiated_by_its_wrapper_is_never_composed(tmp_path: Path):
    path = tmp_path / "candidate.py"
    service = CompileService()
    await _check(service, path, TEMPLATED, 1, DEVICE_ONLY)
    edited = _first_body_line(TEMPLATED, "relu_kernel(")
    reports = await _check(service, path, edited, 2, DEVICE_ONLY)
    assert _composed(reports) is None and service.reuse.composed == 0
    assert any(f.code == "ptxas-resources" for f in reports[-1].findings)
