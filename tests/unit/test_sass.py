"""SASS parsing (cuobjdump --dump-sass, nvdisasm -c -gi) into per-kernel statistics, on recorded output and on
cubins built here with nvcc and disassembled with the PyPI cuobjdump / nvdisasm."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from profilers import sass
from profilers.sass import (SassStats, SassToolFailed, SassToolMissing, find_sass_tool, is_cubin, parse_sass,
                            parse_sass_stats, sass_for_cubin, sass_stats_for_cubin)
from tests.conftest import FIXTURES

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.fixture(scope="module")
def fixture_stats() -> dict[str, SassStats]:
    return {s.base_name: s for s in parse_sass_stats((FIXTURES / "cuobjdump_sass.txt").read_text())}


def test_fixture_functions_names_and_arch(fixture_stats):
    assert sorted(fixture_stats) == sorted(["matmul_naive", "tiny_grid", "spills", "divergent", "smem_conflict",
                                            "transpose_read_uncoalesced", "vec_add"])
    vec_add = fixture_stats["vec_add"]
    assert (vec_add.mangled, vec_add.name, vec_add.arch) == (
        "_Z7vec_addPKfS0_Pfi", "vec_add(float const*, float const*, float*, int)", "sm_90")
    assert not vec_add.has_line_info  # cuobjdump prints no line markers


def test_fixture_global_access_widths(fixture_stats):
    vec_add = fixture_stats["vec_add"]
    assert (vec_add.global_loads, vec_add.global_stores, vec_add.global_accesses) == ({32: 2}, {32: 1}, 3)
    assert vec_add.widest_global_bits == 32
    assert vec_add.instruction_count == 21  # the NOP padding after the final trap is not counted
    assert fixture_stats["matmul_naive"].global_loads == {32: 58}


def test_fixture_local_and_shared_traffic(fixture_stats):
    spills = fixture_stats["spills"]
    assert (spills.local_loads, spills.local_stores) == (1, 4)
    assert {s.mnemonic for s in spills.sites if s.kind == "local-store"} == {"STL.128"}
    assert {s.bits for s in spills.sites if s.kind == "local-store"} == {128}
    smem = fixture_stats["smem_conflict"]
    assert (smem.shared_loads, smem.shared_stores) == (8, 32)
    assert all(s.local_loads == s.local_stores == 0 for name, s in fixture_stats.items() if name != "spills")


def test_fixture_fmas_loops_and_no_tensor_cores(fixture_stats):
    matmul = fixture_stats["matmul_naive"]
    assert (matmul.fma_count, matmul.loop_count, matmul.tensor_core) == (29, 3, {})
    assert fixture_stats["tiny_grid"].fma_count == 0  # its HFMA2.MMA is a register move
    divergent = fixture_stats["divergent"]
    assert (divergent.fma_count, divergent.loop_count) == (200, 0)  # fully unrolled; the trap is no loop
    assert all(s.max_fma_in_shared_loop == 0 for s in fixture_stats.values())


# nvdisasm -c -gi style: labels for branch targets, line markers (one inlined), and sm_90 instructions
NVDISASM_SAMPLE = """\
\t.target\tsm_90a
//--------------------- .text._Z4tileP6__halfPf --------------------------
_Z4tileP6__halfPf:
\t//## File "/src/tile.cu", line 10
        /*0000*/                   LDG.E.U8 R2, desc[UR4][R2.64] ;
        /*0010*/                   LDG.E.64.CONSTANT R4, desc[UR4][R4.64] ;
.L_x_3:
\t//## File "/src/tile.cu", line 12
        /*0020*/                   LDGSTS.E.BYPASS.LTC128B.128 [R7], desc[UR4][R8.64] ;
        /*0030*/                   LDSM.16.M88.4 R12, [R7] ;
\t//## File "/cuda/include/crt/mma.hpp", line 91 inlined at "/src/tile.cu", line 14
        /*0040*/                   HMMA.16816.F32 R16, R12, R14, R16 ;
        /*0050*/                   FFMA R20, R21, R22, R20 ;
        /*0060*/               @P0 BRA `(.L_x_3) ;
        /*0070*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0080*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0090*/                   STG.E.128 desc[UR4][R2.64], R16 ;
        /*00a0*/                   EXIT ;
.L_x_4:
        /*00b0*/                   BRA `(.L_x_4);
        /*00c0*/                   NOP;
"""


def test_nvdisasm_widths_sites_and_lines():
    (stats,) = parse_sass_stats(NVDISASM_SAMPLE)
    assert (stats.base_name, stats.arch, stats.instruction_count) == ("tile", "sm_90a", 12)
    assert stats.global_loads == {8: 1, 64: 1, 128: 1} and stats.global_stores == {128: 1}
    assert (stats.shared_loads, stats.bulk_copies) == (1, 1)
    assert stats.tensor_core == {"HMMA": 1, "HGMMA": 1} and stats.tensor_core_count == 2
    assert stats.has_line_info
    assert stats.lines("global-load", 32) == [("/src/tile.cu", 10)]  # only the 8-bit load is that narrow
    assert stats.lines("global-load") == [("/src/tile.cu", 10), ("/src/tile.cu", 12)]
    assert stats.lines("tensor-core")[0] == ("/src/tile.cu", 14)  # the call site, not the header's line
    ldsm = next(s for s in stats.sites if s.mnemonic.startswith("LDSM"))
    assert ldsm.bits == 128  # four 8x8 matrices


def test_nvdisasm_labels_make_loops():
    (function,) = parse_sass(NVDISASM_SAMPLE)
    branch = next(i for i in function.instructions if i.opcode == "BRA")
    assert (branch.branch_target, branch.predicate) == (0x20, "@P0")
    (body,) = sass.loop_bodies(function)  # the trap at 0xb0 branches to itself: no loop
    assert [i.address for i in body] == [0x20, 0x30, 0x40, 0x50, 0x60]
    (stats,) = parse_sass_stats(NVDISASM_SAMPLE)
    assert (stats.loop_count, stats.max_fma_in_shared_loop) == (1, 1)


def test_missing_tool_says_how_to_install(monkeypatch):
    monkeypatch.setattr(sass, "_tool_candidates", lambda tool: [None, "/nonexistent/bin/nvdisasm"])
    with pytest.raises(SassToolMissing, match="pip install nvidia-cuda-nvdisasm"):
        find_sass_tool("nvdisasm")


def test_pypi_tools_are_found():
    for tool in ("cuobjdump", "nvdisasm"):
        assert Path(find_sass_tool(tool)).name == tool


def test_not_a_binary_is_a_tool_failure(tmp_path):
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a CUDA binary\n")
    assert not is_cubin(text_file)
    with pytest.raises(SassToolFailed, match="cuobjdump failed"):
        sass_for_cubin(text_file)


LIVE_SOURCE = """\
#include <mma.h>
using namespace nvcuda;
__global__ void copy_float4(const float4* in, float4* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
__global__ void copy_float(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
__global__ void wmma_tile(const half* a, const half* b, float* c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.f);
    wmma::load_matrix_sync(fa, a, 16); wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"""


def _nvcc(tmp_path: Path, kind: str) -> Path:
    source = tmp_path / "live.cu"
    source.write_text(LIVE_SOURCE)
    output = tmp_path / f"live.{kind}"
    subprocess.run(["nvcc", "-arch=sm_90", "-lineinfo", f"-{kind}", "-o", str(output), str(source)],
                   check=True, capture_output=True, timeout=300)
    return output


def _line_of(text: str) -> int:
    return next(n for n, line in enumerate(LIVE_SOURCE.splitlines(), 1) if text in line)


@pytest.mark.nvcc
@needs_nvcc
def test_live_cubin_widths_tensor_cores_and_lines(tmp_path):
    cubin = _nvcc(tmp_path, "cubin")
    assert is_cubin(cubin)
    stats = {s.base_name: s for s in sass_stats_for_cubin(cubin)}
    source = str(tmp_path / "live.cu")
    copy4, copy1, wmma_tile = stats["copy_float4"], stats["copy_float"], stats["wmma_tile"]
    assert copy4.global_loads == {128: 1} and copy4.global_stores == {128: 1}
    assert copy1.global_loads == {32: 1} and copy1.global_stores == {32: 1}
    assert copy4.lines("global-load") == [(source, _line_of("if (i < n) out[i] = in[i];"))]
    assert wmma_tile.tensor_core == {"HMMA": 2}  # m16n16k16 is two m16n8k16 HMMAs on sm_90
    assert wmma_tile.lines("tensor-core") == [(source, _line_of("wmma::mma_sync"))]


@pytest.mark.nvcc
@needs_nvcc
def test_live_fatbin_through_cuobjdump_matches_nvdisasm(tmp_path):
    from_cubin = {s.mangled: s for s in sass_stats_for_cubin(_nvcc(tmp_path, "cubin"))}
    from_fatbin = {s.mangled: s for s in sass_stats_for_cubin(_nvcc(tmp_path, "fatbin"))}
    assert set(from_fatbin) == set(from_cubin)
    for mangled, stats in from_fatbin.items():
        assert not stats.has_line_info and from_cubin[mangled].has_line_info
        assert (stats.global_loads, stats.tensor_core, stats.instruction_count) == (
            from_cubin[mangled].global_loads, from_cubin[mangled].tensor_core, from_cubin[mangled].instruction_count)
