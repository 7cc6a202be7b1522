"""What a check reuses (kernel_lsp/compile/reuse.py): unit results across edits, identical to compiling from
scratch; invalidated by a flag, a torch reinstall or a broken record; and preliminary kernel errors from a compile
without torch's headers, shown only once the document is calibrated and never for what the blanking breaks."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from kernel_lsp.compile.check import Document
from kernel_lsp.compile.diagnostics import parse_compiler_output
from kernel_lsp.compile.process import ProcessResult
from kernel_lsp.compile.reuse import PRELIMINARY, Reuse, header_stamps
from kernel_lsp.compile.split import split_text
from kernel_lsp.compile.service import CompileService
from kernel_lsp.compile.units import load_inline_units
from kernel_lsp.config import Settings
from kernel_lsp.findings import Severity, path_to_uri
from kernel_lsp.jobs.cache import ResultCache
from kernel_lsp.jobs.disk_cache import DiskCache
from kernel_lsp.sources import parse_python

pytestmark = pytest.mark.timeout(1800)  # nvcc over torch's headers, on a loaded 2-core machine

no_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)")
no_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (its headers)")

# load_inline's prologue includes torch/types.h (cheaper for nvcc than torch/extension.h, the same mechanism)
SOURCE = '''\
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
__global__ void relu_kernel(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    relu_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), (int)x.numel());
    return out;
}
"""

ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu_cuda(torch::Tensor x);",
                  cuda_sources=cuda_src, functions=["relu_cuda"])
'''
KERNEL_LINE = "    if (i < n) out[i] = x[i] > 0.f ? x[i] : 0.f;"
TYPO = SOURCE.replace(KERNEL_LINE, "    if (i < n) out[i] = xx[i] > 0.f ? x[i] : 0.f;")
# the wrapper changes too: the split result cannot stand for the exact one (compile/split.py), its errors are
# preliminary
TYPO_AND_WRAPPER = TYPO.replace("torch::empty_like(x)", "torch::zeros_like(x)")
# a kernel that names a torch type: without torch's headers it fails, which is the blanking's doing
TORCH_TYPED = SOURCE.replace(KERNEL_LINE, "    if (i < n) out[i] = (float)c10::Half(x[i] > 0.f ? x[i] : 0.f);")


def _units(text: str, tmp_path: Path):
    ext = parse_python(text).extensions[0]
    return load_inline_units(ext, tmp_path / "candidate.py", ())


def _doc(path: Path, text: str, version: int) -> Document:
    return Document(path_to_uri(path), path, text, version)


async def _reports(service: CompileService, path: Path, text: str, version: int):
    return [r async for r in service.run(_doc(path, text, version), Settings.of(compile_timeout_s=900.0))]


def _shown(findings) -> list[tuple]:
    return sorted((f.range.start.line, f.range.start.character, f.code, f.message) for f in findings)


def test_the_split_text_blanks_torch_includes_and_keeps_every_line(tmp_path: Path):
    text = SOURCE.replace('cuda_src = r"""\n', 'cuda_src = r"""\n#include <torch/extension.h>\n#include "mine.cuh"\n'
                          '#include <ATen/cuda/CUDAContext.h>\n#include <cuda_fp16.h>\n')
    device = next(u for u in _units(text, tmp_path) if u.stage == "device")
    split = split_text(device)
    assert split is not None and split.count("\n") == device.text.count("\n")
    assert "torch/" not in split and "ATen/" not in split
    assert '#include "mine.cuh"' in split and "#include <cuda_fp16.h>" in split and "relu_kernel" in split
    host = next(u for u in _units(text, tmp_path) if u.stage == "host")
    assert split_text(host) is None  # main.cpp is the host compiler's: nothing to split


def test_a_torch_reinstall_in_place_changes_the_header_stamps(tmp_path: Path):
    version = tmp_path / "include" / "torch" / "csrc" / "api" / "include" / "torch" / "version.h"
    version.parent.mkdir(parents=True)
    version.write_text("#define TORCH_VERSION 2.13.0\n")
    before = header_stamps((str(tmp_path / "include"),))
    version.write_text("#define TORCH_VERSION 2.14.0\n")  # same folders, another torch
    os.utime(version, ns=(1, 1))
    assert header_stamps((str(tmp_path / "include"),)) != before


def test_a_unit_key_changes_with_flags_text_and_quoted_includes(tmp_path: Path):
    (tmp_path / "mine.cuh").write_text("#define SCALE 2\n")
    text = SOURCE.replace('cuda_src = r"""\n', 'cuda_src = r"""\n#include "mine.cuh"\n')
    device = next(u for u in _units(text, tmp_path) if u.stage == "device")
    argv = ["nvcc", "-x", "cu", device.file_name]
    key = Reuse.unit_key(argv, device, tmp_path / "candidate.py", ["13.0"])
    assert Reuse.unit_key(argv, device, tmp_path / "candidate.py", ["13.0"]) == key
    assert Reuse.unit_key(argv[:-1] + ["-O0", device.file_name], device, tmp_path / "candidate.py", ["13.0"]) != key
    assert Reuse.unit_key(argv, device, tmp_path / "candidate.py", ["13.1"]) != key
    (tmp_path / "mine.cuh").write_text("#define SCALE 3\n")
    os.utime(tmp_path / "mine.cuh", ns=(1, 1))
    assert Reuse.unit_key(argv, device, tmp_path / "candidate.py", ["13.0"]) != key


def test_a_broken_or_foreign_record_is_never_trusted(tmp_path: Path):
    disk = DiskCache(tmp_path / "results.msgpack")
    reuse = Reuse(ResultCache(disk=disk))
    result = ProcessResult(("nvcc",), 0, "", "ptxas info : Used 8 registers", False, 1.5)
    reuse.put("k", result)
    assert Reuse(ResultCache(disk=disk)).get("k") == result  # another process, from the file
    for broken in ({"unit": 1, "argv": ["nvcc"], "returncode": "zero?"}, {"unit": 99}, {"findings": []}, ["x"]):
        disk.put("k", broken)
        assert Reuse(ResultCache(disk=disk)).get("k") is None, broken
    reuse.put("t", ProcessResult(("nvcc",), None, "", "", True, 60.0))  # timed out: tried again next time
    assert Reuse(ResultCache(disk=disk)).get("t") is None


def test_calibration_hides_what_the_blanking_breaks_and_keeps_new_errors(tmp_path: Path):
    device = next(u for u in _units(SOURCE, tmp_path) if u.stage == "device")
    row = device.text.split("\n").index(KERNEL_LINE) + 1
    blanked = parse_compiler_output(f'{device.file_name}({row}): error: identifier "c10" is undefined\n'
                                    f'{device.file_name}({row + 2}): error: name followed by "::" must be a class '
                                    f'or namespace name\n')
    typo = parse_compiler_output(f'{device.file_name}({row}): error: identifier "xx" is undefined\n')
    reuse = Reuse()
    assert reuse.preliminary("u", device, typo) == []  # not calibrated yet: nothing shown
    reuse.calibrate("u", device, exact=typo, fast=blanked)  # the exact compile failed in the kernel: no calibration
    assert reuse.preliminary("u", device, typo) == []
    reuse.calibrate("u", device, exact=[], fast=blanked)
    assert [m.message for m in reuse.preliminary("u", device, blanked + typo)] == ['identifier "xx" is undefined']


@pytest.mark.slow
@no_nvcc
@no_torch
async def test_an_edit_in_a_kernel_and_its_wrapper_shows_its_error_first_and_ends_as_a_scratch_compile_does(tmp_path: Path):
    path = tmp_path / "candidate.py"
    service = CompileService()
    first = await _reports(service, path, SOURCE, 1)
    assert first[-1].final and [f.code for f in first[-1].findings] == ["ptxas-resources"], first[-1].findings
    assert not any((f.data or {}).get("preliminary") for r in first for f in r.findings)  # not calibrated yet

    hits = service.reuse.hits
    edited = await _reports(service, path, TYPO_AND_WRAPPER, 2)
    assert service.reuse.hits == hits + 1  # main.cpp did not change: the host compiler's result was reused
    stages = [r.stage for r in edited]
    assert "fast" in stages and stages.index("fast") < len(stages) - 1, stages
    early = next(r for r in edited if r.stage == "fast")
    preliminary = [f for f in early.findings if (f.data or {}).get("preliminary")]
    assert [f.message for f in preliminary] == [f'identifier "xx" is undefined ({PRELIMINARY})'], early.findings
    row = TYPO_AND_WRAPPER.split("\n").index("    if (i < n) out[i] = xx[i] > 0.f ? x[i] : 0.f;")
    assert preliminary[0].range.start.line == row
    final = edited[-1]
    assert final.final and not any((f.data or {}).get("preliminary") for f in final.findings)
    # the same findings as a compile from scratch (no reuse, no cache)
    scratch = await _reports(CompileService(), path, TYPO_AND_WRAPPER, 2)
    assert _shown(final.findings) == _shown(scratch[-1].findings)
    assert 'identifier "xx" is undefined' in [f.message for f in final.findings]


@pytest.mark.slow
@no_nvcc
@no_torch
async def test_a_kernel_naming_a_torch_type_gets_no_false_preliminary_error(tmp_path: Path):
    path = tmp_path / "candidate.py"
    service = CompileService()
    first = await _reports(service, path, TORCH_TYPED, 1)
    assert not any(f.severity == Severity.ERROR for f in first[-1].findings), first[-1].findings  # it compiles with torch
    again = await _reports(service, path, TORCH_TYPED.replace("> 0.f ?", ">= 0.f ?"), 2)  # calibrated now
    assert not any((f.data or {}).get("preliminary") for r in again for f in r.findings), again
    assert "fast" not in [r.stage for r in again]
