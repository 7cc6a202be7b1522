"""nvcc stderr parsing: EDG, gcc, ptxas and nvcc messages, against recorded output and fresh nvcc runs."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_lsp.compile.diagnostics import CompilerMessage, RelatedLocation, parse_compiler_output, source_column
from tests.conftest import FIXTURES

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

BAD_CU = "__global__ void f(int* p){ int x = ; p[0] = y; }"

# Printed by `g++ -fsyntax-only -fdiagnostics-show-option -Wall e.cpp` (g++ 12.2): notes, include chain,
# template instantiation context, echo and caret lines.
GCC_SAMPLE = """\
e.cpp: In member function \u2018void A::m(int)\u2019:
e.cpp:3:31: error: expected primary-expression before \u2018;\u2019 token
    3 | void A::m(int x) { int q = x +; }
      |                               ^
e.cpp:3:24: warning: unused variable \u2018q\u2019 [-Wunused-variable]
    3 | void A::m(int x) { int q = x +; }
      |                        ^
e.cpp: In function \u2018int main()\u2019:
e.cpp:4:17: error: too many arguments to function \u2018void foo(int)\u2019
    4 | int main() { foo(1, 2); }
      |              ~~~^~~~~~
In file included from e.cpp:1:
e.h:1:6: note: declared here
    1 | void foo(int);
      |      ^~~
e.h: In instantiation of \u2018void tt(T) [with T = int]\u2019:
e.h:3:21:   required from here
e.h:2:37: error: request for member \u2018nope\u2019 in \u2018t\u2019, which is of non-class type \u2018int\u2019
    2 | template <class T> void tt(T t) { t.nope(); }
      |                                   ~~^~~~
"""

# Printed by g++ 12.2 (and the host passes of nvcc): an error in a header two includes deep, and driver errors
GCC_INCLUDE_SAMPLE = """\
In file included from outer.h:1,
                 from m.cpp:1:
inner.h: In function \u2018int bad_in_header()\u2019:
inner.h:1:30: error: \u2018undefined_y\u2019 was not declared in this scope
    1 | int bad_in_header() { return undefined_y; }
      |                              ^~~~~~~~~~~
gcc: error: unrecognized command-line option \u2018-Wnotaflag\u2019
cc1plus: fatal error: nonexist.cu: No such file or directory
compilation terminated.
"""

# Printed by nvcc 13.0 for an `asm("bogus.instr %0;" ...)` statement: ptxas names the PTX file and line.
PTXAS_LOCATED = """\
ptxas /tmp/tmpxft_000012c5_00000000-6_longpath.ptx, line 28; error   : Unknown modifier '.instr'
ptxas /tmp/tmpxft_000012c5_00000000-6_longpath.ptx, line 28; error   : Not a name of any known instruction: 'bogus'
ptxas fatal   : Ptx assembly aborted due to errors
"""

# Printed by nvcc 13.0: -G with -lineinfo; an undefined extern __device__ function under -rdc; -Xcudafe --preinclude
TOOL_SAMPLE = """\
nvcc warning : '--device-debug (-G)' overrides '--generate-line-info (-lineinfo)'
ptxas warning : Conflicting options --device-debug and --generate-line-info specified, ignoring --generate-line-info option
nvlink error   : Undefined reference to '_Z7helper2f' in '/tmp/tmpxft_00001500_00000000-11_link.o'
Command-line error: cannot open source file "nothere.h"

1 catastrophic error detected in the compilation of "ok.cu".
Compilation terminated.
"""

# EDG's form for an unopenable #include (as nvrtc prints it; nvcc's own gcc preprocessing reports it gcc-style)
CATASTROPHIC = """\
default_program(1): catastrophic error: cannot open source file "cuda_runtime.h"
  #include <cuda_runtime.h>
                           ^

1 catastrophic error detected in the compilation of "default_program".
Compilation terminated.
"""


def test_fixture_errors_have_file_line_echo_and_caret():
    messages = parse_compiler_output((FIXTURES / "nvcc_error.txt").read_text())
    assert [(m.file, m.line, m.column, m.severity, m.tool, m.code) for m in messages] == [
        ("bad.cu", 1, None, "error", "nvcc-frontend", None)] * 2
    assert [m.message for m in messages] == ["expected an expression", 'identifier "y" is undefined']
    echo = "__attribute__((global)) void f(int* p){ int x = ; p[0] = y; }"
    assert [(m.echo, m.echo_column) for m in messages] == [(echo, 49), (echo, 58)]


def test_fixture_carets_map_onto_the_real_source_columns():
    messages = parse_compiler_output((FIXTURES / "nvcc_error.txt").read_text())
    columns = [source_column(m.echo, m.echo_column, BAD_CU) for m in messages]
    assert columns == [36, 45]
    assert (BAD_CU[35], BAD_CU[44]) == (";", "y")


def test_fixture_with_crlf_line_ends_parses_the_same():
    text = (FIXTURES / "nvcc_error.txt").read_text()
    assert parse_compiler_output(text.replace("\n", "\r\n")) == parse_compiler_output(text)


@pytest.mark.parametrize("echo, caret_text, source, expected", [
    # each echo/caret pair printed by nvcc 13.0; expected: the column of the same token in the source
    ("__attribute__((global)) int bad_ret() { return 0; }", "global", "__global__ int bad_ret() { return 0; }", 1),
    ("__attribute__((device)) __attribute__((shared)) __attribute__((constant)) int both;", "constant",
     "__device__ __shared__ __constant__ int both;", 23),
    ("__attribute__((global)) void __attribute__((launch_bounds(NOPE))) lb(float* p) { p[0] = 1.f; }", "NOPE",
     "__global__ void __launch_bounds__(NOPE) lb(float* p) { p[0] = 1.f; }", 35),
    ("__attribute__((global)) void m(float* p) { do { if (!(p[0] > 0)) undefined_fn(); } while (0); }",
     "undefined_fn", "__global__ void m(float* p) { CHECK(p[0] > 0); }", 31),
    ("  const int c = 2;", "c =", "  const int c = 2;", 13),
])
def test_source_column_through_preprocessing(echo: str, caret_text: str, source: str, expected: int):
    column = source_column(echo, echo.index(caret_text) + 1, source)
    assert column == expected


def test_source_column_stays_inside_the_line():
    assert source_column("abc", 40, "ab") == 3
    assert source_column("", 1, "") == 1


def test_gcc_messages_notes_and_instantiation_context():
    messages = parse_compiler_output(GCC_SAMPLE)
    assert [(m.file, m.line, m.column, m.severity, m.code) for m in messages] == [
        ("e.cpp", 3, 31, "error", None),
        ("e.cpp", 3, 24, "warning", "-Wunused-variable"),
        ("e.cpp", 4, 17, "error", None),
        ("e.h", 2, 37, "error", None),
    ]
    assert all(m.tool == "host-compiler" and m.echo is None for m in messages)
    assert messages[1].message == "unused variable \u2018q\u2019"
    assert messages[2].related == [RelatedLocation("e.h", 1, 6, "declared here")]
    assert messages[3].related == [RelatedLocation(
        "e.h", 3, 21, "In instantiation of \u2018void tt(T) [with T = int]\u2019: required from here")]


def test_gcc_include_chain_becomes_related_and_driver_errors_have_no_file():
    messages = parse_compiler_output(GCC_INCLUDE_SAMPLE)
    assert [(m.file, m.line, m.column, m.severity, m.message) for m in messages] == [
        ("inner.h", 1, 30, "error", "\u2018undefined_y\u2019 was not declared in this scope"),
        (None, None, None, "error", "gcc: unrecognized command-line option \u2018-Wnotaflag\u2019"),
        (None, None, None, "error", "cc1plus: nonexist.cu: No such file or directory"),
    ]
    assert messages[0].related == [RelatedLocation("outer.h", 1, None, "included from here"),
                                   RelatedLocation("m.cpp", 1, None, "included from here")]
    assert messages[2].related == []


def test_ptxas_messages_with_a_ptx_location():
    messages = parse_compiler_output(PTXAS_LOCATED)
    assert [(m.file, m.line, m.severity, m.tool) for m in messages] == [
        ("/tmp/tmpxft_000012c5_00000000-6_longpath.ptx", 28, "error", "ptxas"),
        ("/tmp/tmpxft_000012c5_00000000-6_longpath.ptx", 28, "error", "ptxas"),
        (None, None, "fatal", "ptxas"),
    ]
    assert messages[0].message == "Unknown modifier '.instr'"


def test_nvcc_nvlink_and_command_line_messages():
    messages = parse_compiler_output(TOOL_SAMPLE)
    assert [(m.file, m.severity, m.tool, m.symbol) for m in messages] == [
        (None, "warning", "nvcc", None),
        (None, "warning", "ptxas", None),
        (None, "error", "nvcc", "_Z7helper2f"),
        (None, "error", "nvcc-frontend", None),
    ]
    assert messages[3].message == 'cannot open source file "nothere.h"'


def test_catastrophic_error_is_an_error_with_its_echo():
    [msg] = parse_compiler_output(CATASTROPHIC)
    assert (msg.file, msg.line, msg.severity, msg.message) == (
        "default_program", 1, "error", 'cannot open source file "cuda_runtime.h"')
    assert (msg.echo, msg.echo_column) == ("#include <cuda_runtime.h>", 26)


def test_ptxas_info_and_summaries_are_not_messages():
    text = (FIXTURES / "ptxas_v.txt").read_text() + "\nRemark: The warnings can be suppressed with " \
        '"-diag-suppress <warning-number>"\n\nError limit reached.\n100 errors detected in the compilation ' \
        'of "many.cu".\nCompilation terminated.\ncompilation terminated.\n'
    assert parse_compiler_output(text) == []


def test_garbage_and_truncated_output_never_raise():
    samples = [(FIXTURES / "nvcc_error.txt").read_text(), GCC_SAMPLE, GCC_INCLUDE_SAMPLE, PTXAS_LOCATED, TOOL_SAMPLE,
               CATASTROPHIC]
    everything = "".join(samples)
    for cut in range(0, len(everything), 7):
        assert isinstance(parse_compiler_output(everything[:cut]), list)
    rng = random.Random(7)
    alphabet = "ab(1):^ |\n\r\t#-'\"x.cu:2:3: error warning note ptxas nvcc \x1b[31m \u2018"
    for _ in range(300):
        junk = "".join(rng.choice(alphabet) for _ in range(rng.randrange(200)))
        for m in parse_compiler_output(junk):
            assert isinstance(m, CompilerMessage)


# ---- fresh nvcc runs ----------------------------------------------------------------------------------------

def _nvcc(tmp: Path, name: str, source: str, *flags: str) -> str:
    (tmp / name).write_text(source)
    done = subprocess.run(["nvcc", "-arch=sm_90", *flags, name], cwd=tmp, capture_output=True, text=True,
                          timeout=120)
    return done.stderr + done.stdout


FRONT_END_CU = """\
#define CHECK(x) do { if (!(x)) undefined_fn(); } while (0)
void ov(int, int);
void ov(float);
__global__ void calls(float* p) { ov("a"); }
__global__ void checks(float* p) { CHECK(p[0] > 0); }
#include "load.h"
template <typename T> __global__ void kern(T* p) { p[0] = load(p); }
void launch(int* p) { kern<int><<<1, 1>>>(p); }
__global__ void unused(int* p) { int never; p[0] = 1; }
"""
LOAD_H = "template <typename T> __device__ T load(const T* p) { return p->x; }\n"


@pytest.fixture(scope="module")
def front_end(tmp_path_factory) -> tuple[list[CompilerMessage], list[str]]:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    tmp = tmp_path_factory.mktemp("front_end")
    (tmp / "load.h").write_text(LOAD_H)
    out = _nvcc(tmp, "front.cu", FRONT_END_CU, "-cubin", "-o", "front.cubin")
    return parse_compiler_output(out), FRONT_END_CU.splitlines()


@pytest.mark.nvcc
def test_real_overload_error_keeps_continuation_and_folds_edg_notes(front_end):
    messages, _ = front_end
    [msg] = [m for m in messages if m.line == 4 and m.file == "front.cu"]
    assert msg.message == ('no instance of overloaded function "ov" matches the argument list\n'
                           "argument types are: (const char [2])")
    assert [(r.file, r.line, r.message.split(" ")[0]) for r in msg.related] == [
        ("front.cu", 3, "function"), ("front.cu", 2, "number")]
    assert not any(m.severity == "note" for m in messages)


@pytest.mark.nvcc
def test_real_error_inside_a_macro_lands_on_the_macro_name(front_end):
    messages, lines = front_end
    [msg] = [m for m in messages if m.line == 5 and m.file == "front.cu"]
    assert msg.message == 'identifier "undefined_fn" is undefined'
    assert source_column(msg.echo, msg.echo_column, lines[4]) == lines[4].index("CHECK") + 1


@pytest.mark.nvcc
def test_real_instantiation_context_becomes_related(front_end):
    messages, _ = front_end
    [msg] = [m for m in messages if m.file == "load.h"]
    assert msg.line == 1
    assert [(r.file, r.line) for r in msg.related] == [("front.cu", 7), ("front.cu", 8)]
    assert "detected during" in msg.message
    assert source_column(msg.echo, msg.echo_column, LOAD_H.rstrip("\n")) == LOAD_H.index("p->x") + 1


@pytest.mark.nvcc
def test_real_warning_carries_its_edg_number(front_end):
    messages, lines = front_end
    [msg] = [m for m in messages if m.severity == "warning"]
    assert (msg.line, msg.code) == (9, "177-D")
    assert source_column(msg.echo, msg.echo_column, lines[8]) == lines[8].index("never") + 1


@pytest.mark.nvcc
@needs_nvcc
def test_real_host_compiler_warnings_and_note_and_no_duplicates(tmp_path: Path):
    source = ("#include <cstdio>\n"
              "int g(int n) { unsigned u = 3; return n < u; }\n"
              "int h() { int a; return a; }\n")
    messages = parse_compiler_output(_nvcc(tmp_path, "host.cu", source, "-c", "-o", "host.o",
                                           "-Xcompiler", "-Wall,-Wextra", "-O2"))
    host = {m.code: m for m in messages if m.tool == "host-compiler"}
    assert set(host) == {"-Wsign-compare", "-Wuninitialized"}
    assert (host["-Wuninitialized"].line, host["-Wuninitialized"].column) == (3, 25)
    assert host["-Wuninitialized"].related == [RelatedLocation("host.cu", 3, 15, "\u2018a\u2019 was declared here")]
    # EDG's own 'used before its value is set' is printed by both the device and the host pass: kept once
    assert [(m.line, m.code) for m in messages if m.tool == "nvcc-frontend"] == [(3, "549-D")]


@pytest.mark.nvcc
@needs_nvcc
def test_real_ptxas_shared_memory_error_names_the_kernel(tmp_path: Path):
    source = ("__global__ void big(float* p) { __shared__ float s[20000]; s[threadIdx.x] = p[threadIdx.x];"
              " __syncthreads(); p[threadIdx.x] = s[threadIdx.x ^ 1]; }\n")
    [msg] = parse_compiler_output(_nvcc(tmp_path, "smem.cu", source, "-Xptxas", "-v", "-cubin", "-o", "s.cubin"))
    assert (msg.tool, msg.severity, msg.file, msg.symbol) == ("ptxas", "error", None, "_Z3bigPf")
    assert msg.message == "Entry function '_Z3bigPf' uses too much shared data (0x13880 bytes, 0xc000 max)"


@pytest.mark.nvcc
@needs_nvcc
def test_real_nvcc_fatal_has_no_file(tmp_path: Path):
    (tmp_path / "ok.cu").write_text("__global__ void f() {}\n")
    done = subprocess.run(["nvcc", "-arch=sm_50", "-c", "ok.cu"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert parse_compiler_output(done.stderr) == [
        CompilerMessage(None, None, None, "fatal", "Unsupported gpu architecture 'sm_50'", tool="nvcc")]
