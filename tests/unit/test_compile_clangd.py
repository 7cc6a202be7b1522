"""clangd's first squiggle on plain .cu files (kernel_lsp/compile/clangd.py), with the real clangd and nvcc: shown
early, marked preliminary, only once clang and nvcc agreed on an earlier version; never for a file clang rejects
and nvcc accepts; nvcc's result has the last word; a missing or broken clangd costs nothing."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from kernel_lsp.compile.check import Document
from kernel_lsp.compile.clangd import PRELIMINARY, ClangdPass, fallback_flags, find_clangd
from kernel_lsp.compile.service import CompileService
from kernel_lsp.config import Settings
from kernel_lsp.findings import path_to_uri

CLANGD = find_clangd("")
no_clangd = pytest.mark.skipif(CLANGD is None, reason="clangd is not installed (Debian: apt-get install clangd-14; "
                                                      "tools/test-tools.sh installs it)")
no_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)")

KERNEL = """\
__device__ float helper(float v) { return v * 2.f; }
__global__ void scale(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = helper(x[i]);
}
"""
TYPO = KERNEL.replace("helper(x[i])", "helpr(x[i])")
# nvcc for sm_90 compiles it; clang, told an older GPU, has no cluster group: they disagree on this file
CLUSTER = """\
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
__global__ void __cluster_dims__(2, 1, 1) k(float* x) {
    cg::cluster_group cluster = cg::this_cluster();
    x[cluster.block_rank()] = 1.f;
}
"""


def test_find_clangd_follows_the_setting(tmp_path: Path):
    assert find_clangd("off") is None
    assert find_clangd(str(tmp_path / "no-such-clangd")) is None
    if CLANGD is not None:
        assert find_clangd(CLANGD) == CLANGD


async def _check(service: CompileService, path: Path, text: str, version: int):
    return [r async for r in service.run(Document(path_to_uri(path), path, text, version), Settings())]


async def _judged(service: CompileService, uri: str) -> bool | None:
    """Waits for clangd's answer on the version just checked to be weighed against nvcc's."""
    first_pass = service._first_pass[1] if service._first_pass else None
    for _ in range(600):
        if first_pass is not None and uri in first_pass.agreed:
            return first_pass.agreed[uri]
        await asyncio.sleep(0.05)
    return None


def _early(reports) -> list:
    return [f for r in reports if not r.final for f in r.findings if f.code == "clang-error"]


@pytest.mark.slow
@no_clangd
@no_nvcc
async def test_clangs_error_shows_first_once_clang_agreed_and_nvccs_result_replaces_it(tmp_path: Path):
    path = tmp_path / "scale.cu"
    path.write_text(KERNEL)
    service = CompileService(first_pass=True)
    try:
        first = await _check(service, path, KERNEL, 1)
        assert not _early(first)  # nothing from clang before it has agreed with nvcc on this file
        assert await _judged(service, path_to_uri(path)) is True

        edited = await _check(service, path, TYPO, 2)
        early = _early(edited)
        assert early, [(r.stage, r.findings) for r in edited]
        assert "'helpr'" in early[0].message and early[0].message.endswith(f"({PRELIMINARY})")
        assert early[0].range.start.line == 3
        assert "fix available" not in early[0].message and "\n" not in early[0].message
        final = edited[-1]
        assert final.final and not [f for f in final.findings if f.code == "clang-error"]
        assert any(f.code == "nvcc-error" and '"helpr"' in f.message for f in final.findings), final.findings
    finally:
        await service.close()


@pytest.mark.slow
@no_clangd
@no_nvcc
async def test_a_file_clang_rejects_and_nvcc_accepts_gets_nothing_early(tmp_path: Path):
    path = tmp_path / "cluster.cu"
    path.write_text(CLUSTER)
    service = CompileService(first_pass=True)
    try:
        first = await _check(service, path, CLUSTER, 1)
        assert not [f for f in first[-1].findings if f.severity == 1], first[-1].findings  # nvcc: clean
        assert await _judged(service, path_to_uri(path)) is False
        edited = await _check(service, path, CLUSTER.replace("= 1.f;", "= undefined_name;"), 2)
        assert not _early(edited), [(r.stage, r.findings) for r in edited]
        assert any('"undefined_name"' in f.message for f in edited[-1].findings)
    finally:
        await service.close()


@no_clangd
async def test_a_clangd_that_dies_is_started_once_more_then_left_off(tmp_path: Path):
    path = tmp_path / "scale.cu"
    first_pass = ClangdPass(CLANGD, fallback_flags(None, ()))
    try:
        assert await first_pass.errors(path, KERNEL) == []
        for _ in range(2):
            first_pass._process.kill()
            await first_pass._process.wait()
            answer = await first_pass.errors(path, TYPO)
        assert answer is None and first_pass._deaths == 2  # the second death turns it off, quietly
    finally:
        await first_pass.close()


async def test_a_clangd_that_cannot_start_answers_nothing(tmp_path: Path):
    first_pass = ClangdPass(str(tmp_path / "not-a-program"), [])
    assert await first_pass.errors(tmp_path / "x.cu", KERNEL) is None
    assert await first_pass.errors(tmp_path / "x.cu", KERNEL) is None


def test_the_cuda_folder_is_nvccs_own_when_it_has_the_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from kernel_lsp.compile.clangd import cuda_home_for

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\n")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert cuda_home_for(str(tmp_path / "bin" / "nvcc")) != str(tmp_path)  # a wrapper's folder has no headers
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda_runtime.h").write_text("")
    assert cuda_home_for(str(tmp_path / "bin" / "nvcc")) == str(tmp_path)
