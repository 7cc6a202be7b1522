"""`ptxas -v` resource parsing and demangling, against recorded output and fresh nvcc runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from profilers import ptxas
from profilers.ptxas import KernelResources, base_name_of, demangle, fallback_demangle, parse_ptxas_verbose
from tests.conftest import FIXTURES

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
needs_cxxfilt = pytest.mark.skipif(shutil.which("c++filt") is None and shutil.which("cu++filt") is None,
                                   reason="neither c++filt nor cu++filt is on PATH")

FIXTURE_NAMES = {
    "_Z12matmul_naivePKfS0_Pfi": "matmul_naive(float const*, float const*, float*, int)",
    "_Z9tiny_gridPKfPfi": "tiny_grid(float const*, float*, int)",
    "_Z6spillsPKfPfii": "spills(float const*, float*, int, int)",
    "_Z9divergentPKfPfi": "divergent(float const*, float*, int)",
    "_Z13smem_conflictPKfPfi": "smem_conflict(float const*, float*, int)",
    "_Z26transpose_read_uncoalescedPKfPfii": "transpose_read_uncoalesced(float const*, float*, int, int)",
    "_Z7vec_addPKfS0_Pfi": "vec_add(float const*, float const*, float*, int)",
}

# Printed by nvcc 13.0 `-arch=sm_90a -rdc=true -Xptxas -v -c`: with -rdc a device function's block has its own
# compile time, and smem is left to the linker
RDC_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'plain_c' for 'sm_90a'
ptxas info    : Function properties for plain_c
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers
ptxas info    : Compile time = 1.393 ms
ptxas info    : Function properties for _Z6helperfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compile time = 3.458 ms
ptxas info    : Compiling entry function '_Z6spillsPKfPfii' for 'sm_90a'
ptxas info    : Function properties for _Z6spillsPKfPfii
    1024 bytes stack frame, 1088 bytes spill stores, 1232 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
ptxas info    : Compile time = 93.331 ms
"""


def test_fixture_has_the_seven_kernels_in_order():
    resources = parse_ptxas_verbose((FIXTURES / "ptxas_v.txt").read_text())
    assert [r.mangled for r in resources] == list(FIXTURE_NAMES)
    assert {r.arch for r in resources} == {"sm_90"}
    assert all(r.is_entry for r in resources)


def test_fixture_spills_and_smem_conflict_figures():
    by_name = {r.base_name: r for r in parse_ptxas_verbose((FIXTURES / "ptxas_v.txt").read_text())}
    assert by_name["spills"] == KernelResources(
        "_Z6spillsPKfPfii", "spills(float const*, float*, int, int)", "spills", "sm_90", registers=32,
        stack_frame=1024, spill_stores=0, spill_loads=0, shared_bytes=0, barriers=0, cumulative_stack=1024,
        constant_bytes=None, is_entry=True, compile_time_ms=10.583)
    smem = by_name["smem_conflict"]
    assert (smem.registers, smem.shared_bytes, smem.barriers, smem.stack_frame) == (32, 4096, 1, 0)
    assert [r.registers for r in by_name.values()] == [32, 14, 32, 8, 32, 12, 12]


@needs_cxxfilt
def test_fixture_names_demangle_with_cxxfilt():
    resources = parse_ptxas_verbose((FIXTURES / "ptxas_v.txt").read_text())
    assert {r.mangled: r.name for r in resources} == FIXTURE_NAMES


def test_fallback_demangler_agrees_with_cxxfilt_on_plain_names():
    assert {m: fallback_demangle(m) for m in FIXTURE_NAMES} == FIXTURE_NAMES
    assert fallback_demangle("_Z3barv") == "bar()"
    assert fallback_demangle("_Z3refRKdPPc") == "ref(double const&, char**)"


def test_fallback_demangler_limits():
    assert fallback_demangle("_ZN2ns3fooIiLi32EEEvPT_") == "_ZN2ns3fooIiLi32EEEvPT_"
    assert fallback_demangle("_Z3fooN2ns1AE") == "foo"
    assert fallback_demangle("plain_c") == "plain_c"
    assert fallback_demangle("_Z99short") == "_Z99short"


def test_demangle_without_any_tool_uses_the_fallback(monkeypatch):
    monkeypatch.setattr(ptxas.shutil, "which", lambda name: None)
    assert demangle(["_Z6spillsPKfPfii", "plain_c", "_Z6spillsPKfPfii"]) == {
        "_Z6spillsPKfPfii": "spills(float const*, float*, int, int)", "plain_c": "plain_c"}
    assert demangle([]) == {}


@needs_cxxfilt
def test_demangle_batches_templates_and_namespaces():
    assert demangle(["_ZN2ns3fooIiLi32EEEvPT_", "_ZN12_GLOBAL__N_13fooEv"]) == {
        "_ZN2ns3fooIiLi32EEEvPT_": "void ns::foo<int, 32>(int*)",
        "_ZN12_GLOBAL__N_13fooEv": "(anonymous namespace)::foo()"}


@pytest.mark.parametrize("demangled, base", [
    ("spills(float const*, float*, int, int)", "spills"),
    ("void ns::foo<int, 32>(int*)", "foo"),
    ("ns::foo<int>(float*)", "foo"),
    ("(anonymous namespace)::foo()", "foo"),
    ("std::enable_if<true, void>::type ns::bar<float>(float*)", "bar"),
    ("void ns::Outer<int>::kernel<(int)3>(float const*) const", "kernel"),
    ("plain_c", "plain_c"),
    ("myconst()", "myconst"),
])
def test_base_name_of(demangled: str, base: str):
    assert base_name_of(demangled) == base


def test_rdc_device_function_gets_its_own_block_and_the_run_arch():
    resources = parse_ptxas_verbose(RDC_SAMPLE)
    assert [(r.mangled, r.is_entry, r.arch, r.registers, r.compile_time_ms) for r in resources] == [
        ("plain_c", True, "sm_90a", 10, 1.393),
        ("_Z6helperfi", False, "sm_90a", None, 3.458),
        ("_Z6spillsPKfPfii", True, "sm_90a", 32, 93.331),
    ]
    assert (resources[2].spill_stores, resources[2].spill_loads) == (1088, 1232)


def test_crlf_and_truncated_output():
    text = (FIXTURES / "ptxas_v.txt").read_text()
    assert parse_ptxas_verbose(text.replace("\n", "\r\n")) == parse_ptxas_verbose(text)
    for cut in range(0, len(text), 5):
        assert isinstance(parse_ptxas_verbose(text[:cut]), list)
    assert parse_ptxas_verbose("ptxas info    : Used 3 registers\n    1 bytes stack frame\ngarbage") == []


# ---- fresh nvcc runs ----------------------------------------------------------------------------------------

RESOURCES_CU = """\
__constant__ float coeffs[64];
__device__ __noinline__ float helper(float x, int n) {
    float acc = 0.f; for (int i = 0; i < n; ++i) acc += coeffs[i & 63] * x; return acc;
}
// 64 live values under a 32-register cap (1024 threads, 2 blocks per SM): real spill stores and loads
__global__ void __launch_bounds__(1024, 2) spills(const float* in, float* out, int n, int j) {
    float buf[64];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    #pragma unroll
    for (int k = 0; k < 64; ++k) buf[k] = in[(i * 7 + k) % n];
    float s = 0.f;
    #pragma unroll
    for (int k = 0; k < 64; ++k) s += buf[k] * buf[(k * 13 + j) & 63];
    out[i % n] = s + helper(s, j);
}
namespace ns {
template <typename T, int N> __global__ void foo(T* p) {
    __shared__ T tile[N]; tile[threadIdx.x] = p[threadIdx.x]; __syncthreads();
    p[threadIdx.x] = tile[N - 1 - threadIdx.x] + coeffs[3];
}
template __global__ void foo<float, 256>(float*);
}
"""


@pytest.fixture(scope="module")
def two_arch_resources(tmp_path_factory) -> list[KernelResources]:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    tmp = tmp_path_factory.mktemp("ptxas")
    (tmp / "res.cu").write_text(RESOURCES_CU)
    done = subprocess.run(["nvcc", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                           "arch=compute_90,code=sm_90", "-Xptxas", "-v", "-fatbin", "-o", "res.fatbin", "res.cu"],
                          cwd=tmp, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return parse_ptxas_verbose(done.stderr)


@pytest.mark.nvcc
def test_real_forced_spills(two_arch_resources):
    [spills] = [r for r in two_arch_resources if r.base_name == "spills" and r.arch == "sm_90"]
    assert spills.is_entry and spills.registers is not None and spills.registers <= 32
    assert spills.spill_stores > 0 and spills.spill_loads > 0
    assert spills.stack_frame > 0 and spills.cumulative_stack == spills.stack_frame


@pytest.mark.nvcc
def test_real_two_archs_give_one_record_per_function_and_arch(two_arch_resources):
    assert sorted((r.base_name, r.arch, r.is_entry) for r in two_arch_resources) == [
        ("foo", "sm_80", True), ("foo", "sm_90", True),
        ("helper", "sm_80", False), ("helper", "sm_90", False),
        ("spills", "sm_80", True), ("spills", "sm_90", True),
    ]


@pytest.mark.nvcc
def test_real_template_kernel_static_smem_and_cmem(two_arch_resources):
    foo = {r.arch: r for r in two_arch_resources if r.base_name == "foo"}
    assert foo["sm_90"].name == "void ns::foo<float, 256>(float*)"
    assert (foo["sm_90"].shared_bytes, foo["sm_90"].barriers) == (1024, 1)
    # ptxas prints cmem[0] (the parameter bank) for sm_80 but not for sm_90
    assert foo["sm_80"].constant_bytes is not None and foo["sm_80"].constant_bytes > 0
    assert foo["sm_90"].constant_bytes is None


@pytest.mark.nvcc
def test_real_device_function_has_stack_figures_but_no_registers(two_arch_resources):
    helpers = [r for r in two_arch_resources if r.base_name == "helper"]
    assert all(r.registers is None and r.compile_time_ms is None and r.name == "helper(float, int)"
               for r in helpers)


@pytest.mark.nvcc
@needs_nvcc
def test_real_rdc_device_functions_printed_before_the_entry_take_their_run_arch(tmp_path: Path):
    (tmp_path / "rdc.cu").write_text(
        "__global__ void k1(float* p);\n"
        "__device__ __noinline__ float helper(float x) { return x * x + 1.f; }\n"
        "__device__ __noinline__ float late(float x) { return x * 3.f; }\n"
        "__global__ void k1(float* p) { p[0] = helper(p[1]) + late(p[2]); }\n")
    done = subprocess.run(["nvcc", "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
                           "-rdc=true", "-Xptxas", "-v", "-c", "-o", "rdc.o", "rdc.cu"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    resources = parse_ptxas_verbose(done.stderr)
    assert sorted((r.base_name, r.arch, r.is_entry) for r in resources) == [
        ("helper", "sm_80", False), ("helper", "sm_90", False),
        ("k1", "sm_80", True), ("k1", "sm_90", True),
        ("late", "sm_80", False), ("late", "sm_90", False),
    ]
    assert all(r.compile_time_ms is not None for r in resources)
    assert all(r.registers is None for r in resources if not r.is_entry)
