"""CUDA kernels and #includes found in .cu text."""

from __future__ import annotations


import pytest

from kernel_lsp.findings import Range
from kernel_lsp.sources.cuda import Include, blank_comments_and_literals, find_includes, find_kernels

from tests.paths import FIXTURES

KERNELS_CU = FIXTURES / "kernels.cu"


def names(text: str) -> list[str]:
    return [kernel.name for kernel in find_kernels(text)]


@pytest.mark.skipif(not KERNELS_CU.is_file(), reason=f"{KERNELS_CU} (recorded H200 fixtures) is not here")
def test_fixture_kernels_have_exact_name_ranges():
    text = KERNELS_CU.read_text()
    kernels = find_kernels(text)
    assert [(k.name, k.name_range) for k in kernels] == [
        ("vec_add", Range.of(5, 16, 5, 23)),
        ("transpose_read_uncoalesced", Range.of(10, 16, 10, 42)),
        ("smem_conflict", Range.of(16, 16, 16, 29)),
        ("divergent", Range.of(27, 16, 27, 25)),
        ("spills", Range.of(36, 16, 36, 22)),
        ("tiny_grid", Range.of(43, 16, 43, 25)),
        ("matmul_naive", Range.of(50, 16, 50, 28)),
    ]
    vec_add = kernels[0]
    assert vec_add.signature_range == Range.of(5, 0, 5, 72)
    assert vec_add.body_range == Range.of(5, 73, 8, 1)
    assert vec_add.has_body and not vec_add.is_template
    assert vec_add.launch_bounds is None and vec_add.namespace == ""
    assert kernels[2].body_range == Range.of(16, 66, 25, 1)  # nested braces of the for loops inside


def test_template_launch_bounds_extern_static_and_namespaces():
    text = (
        "namespace outer { namespace inner::deep {\n"                                # 0
        "template <typename T, int N = 4>\n"                                         # 1
        "__global__ void __launch_bounds__(256, 2) scale(T* x) {\n"                  # 2
        "  auto f = [&](int i) { return x[i]; }; { f(0); }\n"                        # 3
        "}\n"                                                                        # 4
        'extern "C" __global__ void c_entry(float*);\n'                              # 5
        "} }\n"                                                                      # 6
        "static __launch_bounds__(0x80) __global__ thrust::pair<int, float>* pairs(int n) {}\n"  # 7
        "__global__ void __launch_bounds__(BLOCK) symbolic() {}\n"                   # 8
        "namespace { __global__ void hidden() {} }\n"                                # 9
        "template <> __global__ void scale<float>(float* x) {}\n"                    # 10
    )
    kernels = {k.name + ("<float>" if k.name_range.start.line == 10 else ""): k for k in find_kernels(text)}
    assert list(kernels) == ["scale", "c_entry", "pairs", "symbolic", "hidden", "scale<float>"]

    scale = kernels["scale"]
    assert scale.namespace == "outer::inner::deep"
    assert scale.is_template
    assert scale.launch_bounds == (256, 2)
    assert scale.name_range == Range.of(2, 42, 2, 47)
    assert scale.signature_range == Range.of(1, 0, 2, 53)
    assert scale.body_range == Range.of(2, 54, 4, 1)

    c_entry = kernels["c_entry"]
    assert c_entry.signature_range == Range.of(5, 0, 5, 42)  # from `extern`
    assert not c_entry.has_body and c_entry.body_range is None
    assert c_entry.namespace == "outer::inner::deep"

    pairs = kernels["pairs"]
    assert pairs.signature_range.start == Range.of(7, 0).start  # from `static`
    assert pairs.launch_bounds == (128,)
    assert pairs.namespace == ""
    assert kernels["symbolic"].launch_bounds is None  # BLOCK is not a literal
    assert kernels["hidden"].namespace == "(anonymous namespace)"
    assert kernels["scale<float>"].is_template


def test_global_in_comments_strings_and_macros_is_ignored():
    text = (
        "// __global__ void in_line_comment() {}\n"
        "/* __global__ void in_block_comment() {}\n"
        "   spanning lines */\n"
        'const char* s = "__global__ void in_string() {}";\n'
        "const char* r = R\"x(__global__ void in_raw_string() {})x\";\n"
        "char q = '\"'; int big = 1'000'000;\n"
        "#define KERNEL __global__ void in_macro() {} \\\n"
        "    __global__ void in_macro_continuation() {}\n"
        "__global__ void real(int n) { const char* t = \"}\"; }\n"
        "__global__ void after(int n) {}\n"
    )
    kernels = find_kernels(text)
    assert [k.name for k in kernels] == ["real", "after"]
    assert kernels[0].body_range == Range.of(8, 28, 8, 52)  # the '}' inside the string does not close it


def test_blanking_keeps_offsets_and_line_breaks():
    text = 'a /* x\ny */ "s\\"" // c\nb'
    assert blank_comments_and_literals(text) == "a" + " " * 5 + "\n" + " " * 15 + "\nb"


def test_crlf_line_endings_count_as_one_break():
    kernels = find_kernels("// head\r\n__global__ void k(int n)\r\n{\r\n}\r\n")
    assert kernels[0].name_range == Range.of(1, 16, 1, 17)
    assert kernels[0].body_range == Range.of(2, 0, 3, 1)


@pytest.mark.parametrize("text, expected", [
    ("__global__ void ok() {}\n/* __global__ void lost() {}", ["ok"]),  # unterminated comment at EOF
    ("__global__ void open_body(int n) { if (n) {", ["open_body"]),  # unbalanced braces
    ("__global__ void open_params(int n", []),
    ("}}} __global__ void after_extra_closers() {}", ["after_extra_closers"]),
    ('__global__ void k() { const char* s = "unterminated;\n}', ["k"]),
    ("__global__", []),
    ("__global__ void (*pointer)(int);", []),
    ("\x00\xff\ufffd __global__ \x00 void junk(\x01) {", ["junk"]),
])
def test_broken_text_still_gives_what_can_be_found(text, expected):
    assert names(text) == expected


def test_unclosed_body_runs_to_the_end():
    kernel = find_kernels("__global__ void k(int n) {\n  if (n) {\n")[0]
    assert kernel.body_range == Range.of(0, 25, 2, 0)


def test_includes_quoted_and_angled_not_in_comments():
    text = '#include "common.cuh"\n// #include "commented.h"\n  #  include <cuda_fp16.h>\n#include MACRO\n'
    assert find_includes(text) == [
        Include("common.cuh", True, Range.of(0, 10, 0, 20)),
        Include("cuda_fp16.h", False, Range.of(2, 14, 2, 25)),
    ]


def test_five_megabyte_file_is_scanned():
    kernel = ("// kernel {i}: uses a {{ brace in a comment\n"
              "template <int N> __global__ void __launch_bounds__(256) kernel_{i}(const float* x, float* y, int n) {{\n"
              "    const char* s = \"{{ not a brace\";\n"
              "    for (int k = 0; k < n; ++k) {{ if (k % 2) {{ y[k] = x[k]; }} }}\n"
              "}}\n")
    parts = []
    size = 0
    count = 0
    while size < 5_000_000:
        part = kernel.format(i=count)
        parts.append(part)
        size += len(part)
        count += 1
    kernels = find_kernels("".join(parts))
    assert len(kernels) == count
    assert kernels[-1].name == f"kernel_{count - 1}"
    assert kernels[-1].launch_bounds == (256,)
    assert kernels[-1].body_range.end.line == 5 * count - 1
