"""Which kernels a candidate defines and ran: source reading, name matching, and Triton's launcher on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernel_lsp.candidate.kernels import (
    KernelLaunch,
    classify,
    kernel_name_of,
    launches_off_stream,
    own_kernel_names,
)

ROOT = Path(__file__).resolve().parents[2]

CUDA_FILE = """
#include <cuda_runtime.h>
// __global__ void commented_out(float* x) {}
template <typename T>
__global__ void relu_kernel(const T* x, T* y, int n) { }
namespace fused { namespace {
__global__ void gelu_kernel(float* x) { }
} }
__global__ void declared_only(float* x);
"""

LOAD_INLINE_FILE = '''
import torch
from torch.utils.cpp_extension import load_inline

head = "namespace ops {"
body = """
__global__ void square_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * x[i];
}
}
"""
cpp = "torch::Tensor square(torch::Tensor x);"
ext = load_inline(name="square", cpp_sources=cpp, cuda_sources=[head, body], functions=["square"])
BLOCK = 256
late = load_inline(name="late", cpp_sources=cpp, cuda_sources=f"""
extern "C" __global__ void scale_kernel(float* x) {{ x[0] *= {BLOCK}; }}
""")
'''

TRITON_FILE = '''
import triton
import triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def add_kernel(x, y, n, BLOCK: tl.constexpr):
    pass

def helper():
    pass
'''


def launch(name: str, stream: int | None = None) -> KernelLaunch:
    return KernelLaunch(name, stream, "profiler")


def test_cuda_files_name_defined_kernels_with_their_namespaces() -> None:
    names = own_kernel_names({"kernels.cu": CUDA_FILE, "notes.txt": "__global__ void not_code() {}"})
    assert names == {"relu_kernel", "fused::(anonymous namespace)::gelu_kernel"}


def test_load_inline_strings_are_read_joined_and_literal_pieces_of_f_strings_count() -> None:
    names = own_kernel_names({"cand.py": LOAD_INLINE_FILE})
    assert names == {"ops::square_kernel", "scale_kernel"}


def test_triton_kernels_are_named_and_plain_functions_are_not() -> None:
    assert own_kernel_names({"cand.py": TRITON_FILE}) == {"add_kernel"}


def test_a_broken_python_file_still_names_its_kernels() -> None:
    broken = TRITON_FILE + "\ndef oops(:\n"
    assert own_kernel_names({"cand.py": broken}) == {"add_kernel"}


def test_decoys_in_pytorchs_namespaces_are_not_the_candidates() -> None:
    decoy = "namespace at { namespace native { __global__ void vectorized_elementwise_kernel() {} } }"
    assert own_kernel_names({"decoy.cu": decoy}) == set()


def test_launched_names_lose_return_type_templates_and_parameters() -> None:
    assert kernel_name_of("void relu_kernel<float>(float const*, float*, int)") == "relu_kernel"
    assert kernel_name_of("ns::relu_kernel(float*)") == "ns::relu_kernel"
    assert kernel_name_of("void (anonymous namespace)::gelu_kernel<1>(float*)") == "(anonymous namespace)::gelu_kernel"
    assert kernel_name_of("add_kernel") == "add_kernel"


def test_classify_matches_own_kernels_by_name_and_namespace() -> None:
    own = {"relu_kernel", "fused::gelu_kernel", "scale_kernel", "add_kernel"}
    launches = [
        launch("void relu_kernel<float>(float const*, float*, int)"),
        launch("void relu_kernel<double>(double const*, double*, int)"),
        launch("void fused::gelu_kernel<128>(float*)"),
        launch("void other::relu_kernel(float*)"),  # same base name, another namespace: not the candidate's
        launch("add_kernel"),
        launch("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int)"),
    ]
    use = classify(launches, own)
    assert use.custom == ["relu_kernel", "fused::gelu_kernel", "add_kernel"]
    assert use.stock == ["other::relu_kernel", "at::native::vectorized_elementwise_kernel"]
    assert use.problem() is None


def test_extern_c_kernels_match_a_namespaced_definition_by_their_plain_name() -> None:
    assert classify([launch("scale_kernel")], {"ops::scale_kernel"}).custom == ["scale_kernel"]


def test_allowed_patterns_match_short_or_launched_names() -> None:
    launches = [launch("void cutlass::Kernel<Gemm>(Gemm::Params)"), launch("ampere_sgemm_128x64_nn"),
                launch("void at::native::reduce_kernel<512, 1>(int)")]
    use = classify(launches, {"relu_kernel"}, allowed=("cutlass::*", "*sgemm*"))
    assert use.allowed == ["cutlass::Kernel", "ampere_sgemm_128x64_nn"]
    assert use.stock == ["at::native::reduce_kernel"]


def test_only_stock_kernels_is_a_problem_that_names_up_to_three() -> None:
    names = ["at::native::a", "at::native::b", "at::native::c", "at::native::d"]
    use = classify([launch(f"void {name}<1>(int)") for name in names], {"relu_kernel"})
    assert use.problem() == ("no custom kernel ran: the candidate's work was all stock kernels "
                             "(at::native::a, at::native::b, at::native::c, ...)")


def test_allowed_kernels_do_not_stand_in_for_a_custom_one() -> None:
    use = classify([launch("ampere_sgemm_128x64_nn")], {"relu_kernel"}, allowed=("*sgemm*",))
    assert use.problem() == "no custom kernel ran: the candidate's work was all stock kernels (ampere_sgemm_128x64_nn)"


def test_nothing_launched_is_a_problem() -> None:
    assert classify([], {"relu_kernel"}).problem() == "no custom kernel ran: no kernel launch was seen"


def test_launches_off_the_current_stream() -> None:
    launches = [launch("a", 7), launch("b", 13), launch("c", None)]
    assert [x.name for x in launches_off_stream(launches, 7)] == ["b"]
    assert launches_off_stream(launches, None) == []
    # only the kernels named count: PyTorch's own fill on a CUDA graph's capture stream is not the candidate's work
    assert [x.name for x in launches_off_stream([launch("relu_kernel", 13), launch("b", 13)], 7, ["relu_kernel"])] \
        == ["relu_kernel"]


def test_only_the_candidates_own_kernels_off_the_current_stream_are_rejected() -> None:
    from kernel_lsp.candidate.kernels import Window
    from kernel_lsp.verify.checks import note_kernel_use
    from kernel_lsp.verify.judge import Integrity

    fill = "void at::native::vectorized_elementwise_kernel<2, at::native::FillFunctor<long> >(int)"
    for launches, rejected in (([launch("relu_kernel", 7), launch(fill, 13)], False),
                               ([launch("relu_kernel", 13), launch(fill, 7)], True)):
        integrity = Integrity("cuda")
        window = Window(launches=launches, current_stream=7)
        note_kernel_use(integrity, classify(launches, {"relu_kernel"}), window, "trial 1")
        assert [p.code for p in integrity.problems] == (["integrity-other-stream"] if rejected else []), launches


RECORDER_SCRIPT = '''
import json
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import GridExecutor, InterpreterBuilder
from kernel_lsp.candidate.interpose import hook, install_triton
from kernel_lsp.candidate.kernels import KernelRecorder, classify, own_kernel_names
install_triton()  # as the candidate's process does before the candidate's import

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)

originals = (GridExecutor.__call__, InterpreterBuilder.set_grid_idx)
own = own_kernel_names({"cand.py": open(__file__).read()})
x = torch.zeros(100)
report = {}
with KernelRecorder("cpu") as custom:
    add_one[(2,)](x, 100, BLOCK=64)
report["custom"] = [custom.how, [vars(l) for l in custom.launches], classify(custom.launches, own).custom]
report["custom_window_s"] = custom.seconds
report["written"] = x.sum().item()
with KernelRecorder("cpu") as stock:
    torch.relu(x)
    add_one[(0,)](x, 100, BLOCK=64)  # an empty grid runs nothing
report["stock"] = [stock.how, stock.launches, classify(stock.launches, own).problem()]
try:
    with KernelRecorder("cpu"):
        raise KeyError("candidate crashed")
except KeyError:
    pass
report["restored"] = (GridExecutor.__call__, InterpreterBuilder.set_grid_idx) == originals  # the same objects
report["unhooked"] = not hook(GridExecutor, "__call__").stack and not hook(InterpreterBuilder, "set_grid_idx").stack
with KernelRecorder("cpu") as after:
    pass
add_one[(1,)](x, 100, BLOCK=64)  # outside any block: recorded nowhere
report["after"] = after.launches
print(json.dumps(report))
'''


def run_script(tmp_path: Path, script: str, interpret: bool) -> dict:
    # a file, not -c: Triton reads a kernel's source with inspect; TRITON_INTERPRET is read when triton loads
    path = tmp_path / "cand.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_recorder_sees_triton_launches_on_the_cpu_and_unhooks_after(tmp_path: Path) -> None:
    """The recordings go through candidate/interpose.py's hooks: the hooked attributes stay the same objects
    throughout, and nothing of a session is left on them once it ended (a crash in it included)."""
    report = run_script(tmp_path, RECORDER_SCRIPT, interpret=True)
    how, launches, custom = report["custom"]
    seconds = launches[0].pop("seconds")  # the interpreted launch's wall time, inside the window's
    assert (how, launches, custom) == ("triton-launcher", [{"name": "add_one", "stream": None,
                                                            "source": "triton-launcher"}], ["add_one"])
    assert 0 < seconds <= report["custom_window_s"]
    assert report["written"] == 100.0
    assert report["stock"] == ["triton-launcher", [], "no custom kernel ran: no kernel launch was seen"]
    assert report["restored"] is True and report["unhooked"] is True
    assert report["after"] == []


def test_recorder_says_why_it_sees_nothing_without_the_interpreter(tmp_path: Path) -> None:
    script = '''
    import json
    from kernel_lsp.candidate.kernels import KernelRecorder
    with KernelRecorder("cpu") as seen:
        pass
    print(json.dumps([seen.how, seen.reason, seen.launches]))
    '''
    how, reason, launches = run_script(tmp_path, script, interpret=False)
    assert (how, launches) == ("none", [])
    assert "TRITON_INTERPRET=1" in reason


def test_marker_pairs_split_launches_into_windows() -> None:
    from kernel_lsp.candidate.kernels import split_at_markers

    marker = "at::cuda::(anonymous namespace)::spin_kernel(long)"
    kernels = [("reference_gemm", 7, 1.0), (marker, 7, 1e-6), ("relu_kernel", 7, 2e-5), ("side", 9, 3e-6),
               (marker, 7, 1e-6), ("reference_relu", 7, 5.0), (marker, 13, 1e-6), (marker, 13, 1e-6)]
    windows = split_at_markers(kernels)
    assert [([(launch.name, launch.seconds) for launch in launches], stream) for launches, stream in windows] == [
        ([("relu_kernel", 2e-5), ("side", 3e-6)], 7), ([], 13)]


def test_library_kernels_and_aten_operators_fall_into_families() -> None:
    from kernel_lsp.candidate.kernels import operation_family

    for name in ("aten::mm", "mm", "addmm", "aten::bmm", "linear", "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n",
                 "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(...)", "ampere_sgemm_128x64_nn"):
        assert operation_family(name) == "matrix multiply", name
    for name in ("aten::mkldnn_convolution", "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw",
                 "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(...)"):
        assert operation_family(name) == "convolution", name
    assert operation_family("aten::relu") == "relu"
    assert operation_family("aten::summary") == "summary"  # 'mm' inside a word is no matrix multiply


def test_the_work_share_leaves_out_the_first_window_and_counts_allowed_kernels_in_the_total() -> None:
    from kernel_lsp.candidate.kernels import Window, work_share

    def window(*launches):
        return Window([KernelLaunch(name, 7, "profiler", seconds) for name, seconds in launches], 7)

    first = window(("relu_kernel", 1.0), ("ampere_sgemm_128x64_nn", 1.0))  # first calls: left out
    steady = [window(("relu_kernel", 1e-6), ("ampere_sgemm_128x64_nn", 9e-6), ("allowed_copy", 1e-5))] * 2
    share = work_share([first, *steady], {"relu_kernel"}, allowed=("allowed_*",))
    assert share.own_share == pytest.approx(0.05) and share.library == {"ampere_sgemm_128x64_nn": pytest.approx(18e-6)}
    assert work_share([window(("relu_kernel", None))], {"relu_kernel"}) is None  # nothing timed: no share
    cpu = [Window([KernelLaunch("relu_kernel", None, "triton-launcher", 0.02)], None, 0.1)] * 2
    assert work_share(cpu, {"relu_kernel"}).own_share == pytest.approx(0.2)
