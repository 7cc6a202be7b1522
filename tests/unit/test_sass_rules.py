"""SASS rules: local memory / spills, narrow global accesses, no tensor cores; on the recorded H200 kernels and on
kernels built here."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import pytest

from profilers.hints.sass_rules import matmul_like_reason, sass_hints
from profilers.ptxas import KernelResources, parse_ptxas_verbose
from profilers.sass import SassSite, SassStats, parse_sass_stats, sass_stats_for_cubin
from tests.conftest import FIXTURES

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.fixture(scope="module")
def stats() -> dict[str, SassStats]:
    return {s.base_name: s for s in parse_sass_stats((FIXTURES / "cuobjdump_sass.txt").read_text())}


@pytest.fixture(scope="module")
def resources() -> dict[str, KernelResources]:
    return {r.base_name: r for r in parse_ptxas_verbose((FIXTURES / "ptxas_v.txt").read_text())}


def codes(hints) -> set[str]:
    return {h.code for h in hints}


def test_each_fixture_kernel_gets_exactly_its_sass_problems(stats, resources):
    expected = {"spills": {"hint-local-memory"}, "matmul_naive": {"hint-no-tensor-cores"}}
    for name, kernel in stats.items():
        assert codes(sass_hints(kernel, resources[name], memory_bound=False)) == expected.get(name, set()), name


def test_local_array_without_spills(stats, resources):
    (hint,) = sass_hints(stats["spills"], resources["spills"], memory_bound=False)
    assert (hint.code, hint.kernel, hint.severity, hint.estimated_speedup) == (
        "hint-local-memory", "spills", "warning", None)
    assert "1024 B stack frame" in hint.message and "1 LDL / 4 STL" in hint.message
    assert "no register spills" in hint.message
    assert hint.metrics["stack_frame"] == 1024


def test_local_memory_without_ptxas_figures_names_both_causes(stats):
    (hint,) = sass_hints(stats["spills"], memory_bound=False)
    assert hint.code == "hint-local-memory" and "register spills (see ptxas -v)" in hint.message


def test_ptxas_spill_bytes_make_a_spill_hint(stats, resources):
    spilling = replace(resources["spills"], spill_stores=1088, spill_loads=1232)
    (hint,) = sass_hints(stats["spills"], spilling, memory_bound=False)
    assert (hint.code, hint.severity) == ("hint-spills", "warning")
    assert "1088 B spill stores, 1232 B spill loads" in hint.message and "32 registers" in hint.message
    assert hint.metrics["spill_loads"] == 1232


def test_narrow_global_access_when_memory_bound(stats):
    (hint,) = sass_hints(stats["vec_add"], memory_bound=True)
    assert (hint.code, hint.kernel, hint.severity) == ("hint-narrow-global-access", "vec_add", "information")
    assert hint.message.startswith("This kernel is memory-bound")
    assert "all 3 global loads/stores" in hint.message and "float4" in hint.message
    assert hint.metrics["global_loads"] == {32: 2}


def test_narrow_global_access_is_conditional_when_boundness_is_unknown(stats):
    (hint,) = sass_hints(stats["vec_add"])
    assert hint.severity == "hint" and hint.message.startswith("If this kernel is memory-bound")
    assert sass_hints(stats["vec_add"], memory_bound=False) == []


def test_few_global_accesses_among_much_arithmetic_are_not_narrow_access(stats):
    assert stats["divergent"].global_accesses == 2
    assert sass_hints(stats["divergent"], memory_bound=True) == []


def test_wide_accesses_are_not_narrow(stats):
    vectorized = replace(stats["vec_add"], global_loads={128: 2}, global_stores={128: 1})
    assert sass_hints(vectorized, memory_bound=True) == []


def test_no_tensor_cores_in_a_named_matmul(stats):
    (hint,) = [h for h in sass_hints(stats["matmul_naive"]) if h.code == "hint-no-tensor-cores"]
    assert (hint.severity, hint.estimated_speedup) == ("information", None)
    assert "named 'matmul_naive'" in hint.message and "29 FMAs" in hint.message
    assert stats["divergent"].fma_count == 200 and matmul_like_reason(stats["divergent"]) is None
    for not_a_matmul in ("convert_to_half", "bilinear_resize", "summary"):
        assert matmul_like_reason(replace(stats["divergent"], base_name=not_a_matmul)) is None
    for named in ("sgemm_kernel", "conv2d_fwd", "bmm", "linear_relu", "flash_attn"):
        assert matmul_like_reason(replace(stats["divergent"], base_name=named)) == f"named '{named}'"


def test_shared_tile_loop_is_matmul_like_and_tensor_cores_silence_it(stats):
    tiled = replace(stats["divergent"], base_name="tile_product", max_fma_in_shared_loop=64)
    assert "shared-memory tiles with 64 FMAs" in matmul_like_reason(tiled)
    assert codes(sass_hints(tiled, memory_bound=False)) == {"hint-no-tensor-cores"}
    assert sass_hints(replace(tiled, tensor_core={"HMMA": 8}), memory_bound=False) == []


def test_hint_carries_the_first_source_line(stats):
    sites = [SassSite("local-store", "STL.128", 0x40, 128, "k.cu", 41), SassSite("local-load", "LDL", 0x80, 32,
                                                                                 "k.cu", 40)]
    (hint,) = sass_hints(replace(stats["spills"], sites=sites), memory_bound=False)
    assert (hint.file, hint.line) == ("k.cu", 40) and "on lines 40, 41" in hint.message
    assert hint.to_dict()["metrics"]["lines"] == [40, 41]


LIVE_SOURCE = """\
__global__ void scale_float(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.f * in[i];
}
__global__ void scale_float4(const float4* in, float4* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float4 v = in[i]; out[i] = make_float4(2.f * v.x, 2.f * v.y, 2.f * v.z, 2.f * v.w); }
}
#define T 16
__global__ void tile_product(const float* A, const float* B, float* C, int N) {
    __shared__ float As[T][T], Bs[T][T];
    int r = blockIdx.y * T + threadIdx.y, c = blockIdx.x * T + threadIdx.x;
    float s = 0.f;
    for (int k0 = 0; k0 < N; k0 += T) {
        As[threadIdx.y][threadIdx.x] = A[r * N + k0 + threadIdx.x];
        Bs[threadIdx.y][threadIdx.x] = B[(k0 + threadIdx.y) * N + c];
        __syncthreads();
        for (int k = 0; k < T; ++k) s += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    C[r * N + c] = s;
}
"""


@pytest.mark.nvcc
@needs_nvcc
def test_live_rules_on_a_cubin_built_with_lineinfo(tmp_path):
    source, cubin = tmp_path / "scale.cu", tmp_path / "scale.cubin"
    source.write_text(LIVE_SOURCE)
    subprocess.run(["nvcc", "-arch=sm_90", "-lineinfo", "-cubin", "-o", str(cubin), str(source)],
                   check=True, capture_output=True, timeout=300)
    stats = {s.base_name: s for s in sass_stats_for_cubin(cubin)}
    (narrow,) = sass_hints(stats["scale_float"], memory_bound=True)
    assert (narrow.code, narrow.file, narrow.line) == ("hint-narrow-global-access", str(source), 3)
    assert sass_hints(stats["scale_float4"], memory_bound=True) == []
    tile_hints = {h.code: h for h in sass_hints(stats["tile_product"], memory_bound=False)}
    assert set(tile_hints) == {"hint-no-tensor-cores"}  # no gemm-like name: found by its shared-tile loop
    assert tile_hints["hint-no-tensor-cores"].line == 18  # the inner product's line
