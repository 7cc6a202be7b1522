"""Python documents: load_inline / load sources with exact positions, the files load_inline writes, Triton kernels,
KernelBench parts, and recovery from syntax errors."""

from __future__ import annotations

import textwrap

import pytest

from kernel_lsp.findings import Range
from kernel_lsp.sources import SyntaxErrorInfo, assemble_load_inline, find_kernels, parse_python

from tests.paths import KERNELBENCH

CANDIDATE = '''\
import torch
from torch.utils.cpp_extension import load_inline

cuda_src = """
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu(torch::Tensor x) { return x; }
"""
cpp_src = "torch::Tensor relu(torch::Tensor x);"

relu_ext = load_inline(
    name="relu_ext",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["relu"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
    extra_cflags=["-O2"],
    extra_include_paths=["include"],
    verbose=True,
)
'''

CUDA_SRC = """
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu(torch::Tensor x) { return x; }
"""


def only_extension(text: str):
    extensions = parse_python(text).extensions
    assert len(extensions) == 1
    return extensions[0]


def torch_cuda_file(cuda_sources: list[str], no_implicit_headers: bool = False) -> str:
    """cuda.cu as torch.utils.cpp_extension.load_inline (2.13) builds it."""
    headers = [] if no_implicit_headers else ["#include <torch/types.h>", "#include <cuda.h>",
                                              "#include <cuda_runtime.h>"]
    return "\n".join(headers + cuda_sources)


def torch_cpp_file(cpp_sources: list[str], functions: dict[str, str] | None, error_handling: bool = True,
                   no_implicit_headers: bool = False) -> str:
    """main.cpp as torch.utils.cpp_extension.load_inline (2.13) builds it."""
    parts = ([] if no_implicit_headers else ["#include <torch/extension.h>"]) + cpp_sources
    if functions is not None:
        parts.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for name, doc in functions.items():
            wrapped = f"torch::wrap_pybind_function({name})" if error_handling else name
            parts.append(f'm.def("{name}", {wrapped}, "{doc}");')
        parts.append("}")
    return "\n".join(parts)


def test_named_triple_quoted_source_and_keyword_arguments():
    ext = only_extension(CANDIDATE)
    assert ext.kind == "load_inline"
    assert ext.name == "relu_ext"
    assert ext.call_range == Range.of(12, 11, 21, 1)
    assert [s.text for s in ext.cuda_sources] == [CUDA_SRC]
    assert ext.cuda_sources[0].origin_range == Range.of(3, 11, 9, 3)
    assert [s.text for s in ext.cpp_sources] == ["torch::Tensor relu(torch::Tensor x);"]
    assert ext.functions == ["relu"]
    assert ext.extra_cuda_cflags == ["-O3", "--use_fast_math"]
    assert ext.extra_cflags == ["-O2"]
    assert ext.extra_include_paths == ["include"]
    assert ext.with_pytorch_error_handling is True and ext.no_implicit_headers is False
    assert ext.problems == []


def test_assembled_files_match_torch_and_map_back_to_the_py():
    ext = only_extension(CANDIDATE)
    cuda, cpp = assemble_load_inline(ext)
    assert cuda.text == torch_cuda_file([CUDA_SRC])
    assert cpp.text == torch_cpp_file(["torch::Tensor relu(torch::Tensor x);"], {"relu": "relu"})

    kernel = find_kernels(cuda.text)[0]
    assert kernel.name_range == Range.of(4, 16, 4, 27)  # three header lines, then the string's leading newline
    assert cuda.map.range_to_original(kernel.name_range) == Range.of(4, 16, 4, 27)
    assert cuda.map.to_original(6, 15) == (6, 15)  # `y[i]` in the .py
    assert cuda.map.to_original(0, 0) is None  # torch's #include lines come from nowhere in the .py
    assert cpp.map.to_original(1, 14) == (10, 25)  # `relu` in cpp_src = "torch::Tensor relu(...)"
    assert cpp.map.to_original(2, 0) is None  # PYBIND11_MODULE block


def test_escapes_map_each_character_to_its_exact_column():
    text = 'from torch.utils.cpp_extension import load_inline\ncuda_src = "a\\tb\\n\\tint x = \\x41 + yy;"\n' \
           'load_inline("e", "", cuda_src, no_implicit_headers=True)\n'
    ext = only_extension(text)
    source = ext.cuda_sources[0]
    assert source.text == "a\tb\n\tint x = A + yy;"
    assert source.char_positions[1] == (1, 13)  # \t sits at its backslash
    assert source.char_positions[2] == (1, 15)  # b, after the two-character escape
    cuda, _ = assemble_load_inline(ext)
    assert cuda.text == "a\tb\n\tint x = A + yy;"
    assert cuda.map.to_original(1, 9) == (1, 28)  # A decoded from \x41
    assert cuda.map.to_original(1, 13) == (1, 35)  # the first y, after three escapes on the line


def test_columns_count_characters_not_utf8_bytes():
    text = 'from torch.utils.cpp_extension import load_inline\n' \
           'note = "é—"; src = "int x;"\n' \
           'load_inline("u", src)\n'
    ext = only_extension(text)
    assert ext.cpp_sources[0].origin_range == Range.of(1, 19, 1, 27)
    assert ext.cpp_sources[0].char_positions[4] == (1, 24)


def test_f_string_without_fields_is_a_plain_string():
    text = 'from torch.utils.cpp_extension import load_inline\nload_inline("f", f"int {{x}};" "}}")\n'
    ext = only_extension(text)
    assert ext.cpp_sources[0].text == "int {x};}}"
    assert ext.cpp_sources[0].char_positions[5] == (1, 25)  # x, after the doubled brace
    assert ext.problems == []


def test_raw_strings_keep_backslashes():
    text = 'import torch.utils.cpp_extension\n' \
           'src = r"printf(\\"%d\\n\\", x);"\n' \
           'torch.utils.cpp_extension.load_inline(name="r", cpp_sources=src)\n'
    ext = only_extension(text)
    assert ext.cpp_sources[0].text == 'printf(\\"%d\\n\\", x);'
    assert ext.cpp_sources[0].char_positions[19] == (1, 27)  # x: raw text maps one to one from column 8


def test_concatenation_augmented_assignment_implicit_pieces_and_positional_arguments():
    text = textwrap.dedent('''\
        from torch.utils import cpp_extension as ce
        HEAD = "#include <cuda_fp16.h>\\n"
        BODY = (
            "__global__ void k(half* x) {}\\n"  # the kernel
            "// end"
        )
        cuda_src = HEAD + BODY
        cuda_src += "\\n// more"
        ext = ce.load_inline("cat", "", cuda_src)
        ''')
    ext = only_extension(text)
    assert ext.name == "cat"
    assert [s.text for s in ext.cpp_sources] == [""]
    assert ext.cuda_sources[0].text == "#include <cuda_fp16.h>\n__global__ void k(half* x) {}\n// end\n// more"
    cuda, cpp = assemble_load_inline(ext)
    assert cpp.text == torch_cpp_file([""], None)
    kernel = find_kernels(cuda.text)[0]
    assert cuda.map.range_to_original(kernel.name_range) == Range.of(3, 21, 3, 22)
    assert cuda.map.to_original(5, 3) == (4, 8)  # `end`, second piece of the implicit concatenation
    assert cuda.map.to_original(6, 3) == (7, 18)  # `more`, from the += line


def test_list_of_sources_joined_with_newlines():
    text = textwrap.dedent('''\
        from torch.utils.cpp_extension import load_inline
        A = "int a;"
        B = "int b;"
        load_inline(name="l", cpp_sources=[A], cuda_sources=[A, B, "int c;"])
        ''')
    ext = only_extension(text)
    cuda, _ = assemble_load_inline(ext)
    assert cuda.text == torch_cuda_file(["int a;", "int b;", "int c;"])
    assert cuda.map.to_original(4, 4) == (2, 9)
    assert cuda.map.to_original(5, 4) == (3, 64)


def test_function_dict_error_handling_and_no_implicit_headers():
    text = textwrap.dedent('''\
        from torch.utils.cpp_extension import load_inline
        load_inline(name="d", cpp_sources="int f();", functions={"f": "does f", "g": "does g"},
                    with_pytorch_error_handling=False, no_implicit_headers=True)
        ''')
    ext = only_extension(text)
    assert ext.functions == ["f", "g"]
    cuda, cpp = assemble_load_inline(ext)
    assert cuda is None
    assert cpp.text == torch_cpp_file(["int f();"], {"f": "does f", "g": "does g"}, error_handling=False,
                                      no_implicit_headers=True)


def test_duplicate_function_names_collapse_like_torchs_dict():
    ext = only_extension('import torch\ntorch.utils.cpp_extension.load_inline("n", "", functions=["a", "a"])\n')
    _, cpp = assemble_load_inline(ext)
    assert cpp.text.count('m.def("a"') == 1


def test_empty_cuda_string_writes_no_cuda_file():
    ext = only_extension('from torch.utils.cpp_extension import load_inline\nload_inline("n", "x", "")\n')
    assert ext.cuda_sources == []
    assert assemble_load_inline(ext)[0] is None


def test_run_time_values_become_problems():
    text = textwrap.dedent('''\
        from torch.utils.cpp_extension import load_inline
        from elsewhere import SHARED
        BLOCK = 256
        good = "int ok;"
        def build(src, **kw):
            return load_inline(name=f"ext_{BLOCK}", cpp_sources=[good, SHARED, f"#define B {BLOCK}"],
                               cuda_sources=src, extra_cuda_cflags=make_flags(), **kw)
        ''')
    ext = only_extension(text)
    assert ext.name is None
    assert [s.text for s in ext.cpp_sources] == ["int ok;"]
    assert ext.cuda_sources == []
    assert ext.problems == [
        "arguments unpacked from `**kw` are not read",
        "cpp_sources: `SHARED` is not assigned in this file",
        'cpp_sources: `f"#define B {BLOCK}"` is an f-string, filled in at run time',
        "cuda_sources: `src` is only known at run time (a parameter or an unpacked value)",
        "extra_cuda_cflags: `make_flags()` is computed at run time",
    ]


def test_names_resolve_in_scope_order():
    text = textwrap.dedent('''\
        import torch.utils.cpp_extension as cpp_ext
        src = "int first;"
        early = cpp_ext.load_inline("early", src)
        class ModelNew:
            def __init__(self):
                src = "int local;"
                self.ext = cpp_ext.load_inline("local", src)
            def later(self):
                self.ext = cpp_ext.load_inline("module", src)
        src = "int last;"
        ''')
    extensions = parse_python(text).extensions
    assert [(e.name, e.cpp_sources[0].text) for e in extensions] == [
        ("early", "int first;"), ("local", "int local;"), ("module", "int last;")]


def test_load_counts_only_when_imported_from_cpp_extension():
    text = textwrap.dedent('''\
        from json import load
        from torch.utils.cpp_extension import load as load_ext
        load(open("x.json"))
        mod = load_ext(name="files", sources=["a.cpp", "kernels/b.cu"], extra_cuda_cflags=["-lineinfo"])
        ''')
    ext = only_extension(text)
    assert ext.kind == "load"
    assert ext.source_files == ["a.cpp", "kernels/b.cu"]
    assert ext.extra_cuda_cflags == ["-lineinfo"]
    with pytest.raises(ValueError):
        assemble_load_inline(ext)


def test_files_written_by_torch_load_inline_match_the_assembly(tmp_path, monkeypatch):
    cpp_extension = pytest.importorskip("torch.utils.cpp_extension",
                                        reason="torch is not installed: cannot run its load_inline")
    text = textwrap.dedent('''\
        from torch.utils.cpp_extension import load_inline
        HEAD = "#include <cuda_fp16.h>"
        cuda_src = r"""
        __global__ void k(float* x) { printf("%d\\n", 1); }
        """ + "torch::Tensor run(torch::Tensor x) {\\n\\treturn x;\\n}"
        first = load_inline(name="first_ext", cpp_sources="torch::Tensor run(torch::Tensor x);",
                            cuda_sources=[HEAD, cuda_src], functions=["run", "run"])
        second = load_inline("second_ext", ["int a();", "int b();"], functions={"a": "doc a"},
                             with_pytorch_error_handling=False, no_implicit_headers=True)
        ''')
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "_jit_compile", lambda *args, **kwargs: object())
    exec(compile(text, "candidate.py", "exec"), {})

    first, second = parse_python(text).extensions
    first_cuda, first_cpp = assemble_load_inline(first)
    assert first_cuda.text == (tmp_path / "first_ext" / "cuda.cu").read_text()
    assert first_cpp.text == (tmp_path / "first_ext" / "main.cpp").read_text()
    second_cuda, second_cpp = assemble_load_inline(second)
    assert second_cuda is None and not (tmp_path / "second_ext" / "cuda.cu").exists()
    assert second_cpp.text == (tmp_path / "second_ext" / "main.cpp").read_text()


TRITON = textwrap.dedent('''\
    import triton
    import triton.language as tl
    from triton import jit
    from numba import jit as numba_jit


    @triton.jit
    def plain(x_ptr, n):
        pass


    @triton.autotune(
        configs=[triton.Config({"BLOCK": 128})],
        key=["n"],
    )
    @triton.jit(do_not_specialize=["n"])
    def tuned(
        x_ptr,
        n: tl.constexpr,
    ) -> None:
        pid = tl.program_id(0)
        tl.store(x_ptr + pid, 1)


    @jit
    def imported_jit(x):
        return x


    @numba_jit
    def not_triton(x):
        return x
    ''')


def test_triton_kernels_with_stacked_and_called_decorators():
    kernels = parse_python(TRITON).triton_kernels
    assert [k.name for k in kernels] == ["plain", "tuned", "imported_jit"]
    plain, tuned, imported = kernels
    assert plain.name_range == Range.of(7, 4, 7, 9)
    assert plain.def_range == Range.of(7, 0, 7, 20)
    assert plain.body_range == Range.of(8, 4, 8, 8)
    assert plain.decorator_range == Range.of(6, 0, 6, 11)
    assert tuned.name_range == Range.of(16, 4, 16, 9)
    assert tuned.def_range == Range.of(16, 0, 19, 10)
    assert tuned.body_range == Range.of(20, 4, 21, 28)
    assert tuned.decorator_range == Range.of(11, 0, 15, 36)
    assert imported.decorator_range == Range.of(24, 0, 24, 4)


@pytest.mark.skipif(not (KERNELBENCH / "level1").is_dir(), reason=f"{KERNELBENCH} is not here")
def test_kernelbench_level1_problem():
    parts = parse_python((KERNELBENCH / "level1" / "19_ReLU.py").read_text()).kernelbench
    assert parts.model.name == "Model"
    assert parts.model.name_range == Range.of(3, 6, 3, 11)
    assert parts.model.def_range == Range.of(3, 0, 3, 23)
    assert parts.model.forward.name_range == Range.of(10, 8, 10, 15)
    assert parts.model.forward.def_range == Range.of(10, 4, 10, 55)
    assert parts.model.forward.body_range == Range.of(11, 8, 20, 28)
    assert parts.model_new is None
    assert parts.get_inputs.name_range == Range.of(25, 4, 25, 14)
    assert parts.get_init_inputs.name_range == Range.of(29, 4, 29, 19)


BROKEN = textwrap.dedent('''\
    import triton
    from torch.utils.cpp_extension import load_inline

    cuda_src = "__global__ void k() {}"
    ext = load_inline(name="e", cpp_sources="", cuda_sources=cuda_src)


    @triton.jit
    def tk(x):
        pass


    class ModelNew:
        def forward(self, x):
            return ext.k(x


    def get_inputs():
        return []
    ''')


def test_syntax_error_in_forward_keeps_the_rest():
    model = parse_python(BROKEN)
    assert model.syntax_error.message == "'(' was never closed"
    assert model.syntax_error.range == Range.of(14, 20, 14, 21)
    assert [s.text for s in model.extensions[0].cuda_sources] == ["__global__ void k() {}"]
    assert model.extensions[0].cuda_sources[0].char_positions[0] == (3, 12)
    assert [k.name for k in model.triton_kernels] == ["tk"]
    assert model.kernelbench.model_new.name_range == Range.of(12, 6, 12, 14)
    assert model.kernelbench.model_new.forward.name_range == Range.of(13, 8, 13, 15)
    assert model.kernelbench.get_inputs.name_range == Range.of(17, 4, 17, 14)


def test_syntax_error_in_forward_keeps_load_inline_in_init():
    text = textwrap.dedent('''\
        import torch.nn as nn
        from torch.utils.cpp_extension import load_inline
        cuda = "__global__ void f() {}"
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.op = load_inline(name="x", cpp_sources="", cuda_sources=cuda, functions=["f"])
            def forward(self, x):
                y = [x,
                return self.op.f(y)
        ''')
    model = parse_python(text)
    assert model.syntax_error == SyntaxErrorInfo("'[' was never closed", Range.of(8, 12, 8, 13))
    assert [s.text for s in model.extensions[0].cuda_sources] == ["__global__ void f() {}"]
    assert model.extensions[0].functions == ["f"]
    assert model.kernelbench.model_new.forward.name_range == Range.of(7, 8, 7, 15)


def test_unterminated_string_keeps_what_comes_before():
    text = 'import triton\n@triton.jit\ndef tk(x):\n    pass\nsrc = """never closed\nmore\n'
    model = parse_python(text)
    assert model.syntax_error.message.startswith("unterminated triple-quoted string literal")
    assert model.syntax_error.range.start == Range.of(4, 6).start
    assert [k.name for k in model.triton_kernels] == ["tk"]


def test_null_byte_is_reported_where_it_is():
    model = parse_python('import triton\n@triton.jit\ndef tk(x):\n    return "a\x00b"\n')
    assert model.syntax_error.message == "source code cannot contain null bytes"
    assert model.syntax_error.range == Range.of(3, 13, 3, 14)
    assert [k.name for k in model.triton_kernels] == ["tk"]


@pytest.mark.parametrize("text", [
    "",
    "\x00\x01\x02\xff\ufffd" * 1000,
    bytes(range(256)).decode("utf-8", errors="replace") * 50,
    "(" * 5000,
    "x = [" * 300 + "]" * 300,
    "def f(:\n" * 100,
    "\tif x:\n  y\n\t\tz\n" * 50,
    '"""' + "a" * 10000,
    "a = '\ud800'\n",
    "from torch.utils.cpp_extension import load_inline\nload_inline(*args)\nload_inline()\n",
    "src = src + src\nfrom torch.utils.cpp_extension import load_inline\nload_inline('n', src)\n",
])
def test_never_raises(text):
    model = parse_python(text)
    assert model.kernelbench is not None


@pytest.mark.slow
def test_large_file_parses():
    line = "x_{0} = 'a string with some words in it' + str({0})\n"
    text = "".join(line.format(k) for k in range(90_000)) + "def get_inputs():\n    return []\n"
    assert len(text) > 4_000_000
    assert parse_python(text).kernelbench.get_inputs.name_range == Range.of(90_000, 4, 90_000, 14)


def test_builds_cuda_knows_a_cuda_extension_from_a_cpp_one():
    """verify/run.gpu_only_reason: what makes a CPU verification say "needs a GPU" up front (a CPU torch cannot
    build CUDA sources, nor run their kernels); C++-only extensions still run on the CPU."""
    from kernel_lsp.verify.run import CUDA_EXTENSION_NEEDS_A_GPU, gpu_only_reason

    def builds_cuda(text: str) -> bool:
        return gpu_only_reason(text) == CUDA_EXTENSION_NEEDS_A_GPU

    head = "from torch.utils.cpp_extension import load, load_inline\n"
    assert builds_cuda(head + 'm = load_inline(name="a", cpp_sources="", cuda_sources="__global__ void k(){}")\n')
    assert builds_cuda(head + 'SRC = "__global__ void k(){}"\nm = load_inline("a", "", cuda_sources=[SRC])\n')
    assert builds_cuda(head + 'm = load(name="a", sources=["a.cpp", "kernels.cu"])\n')
    assert not builds_cuda(head + 'm = load_inline(name="a", cpp_sources="int f() { return 1; }", functions=["f"])\n')
    assert not builds_cuda(head + 'm = load(name="a", sources=["a.cpp"])\n')
    assert not builds_cuda("")
