"""What to compile for a document: one unit per translation unit nvcc or the host compiler sees.

A `.cu`/`.cuh` buffer is one device-side unit. A `.py` file gives, for each `load_inline` call,
the `cuda.cu` and `main.cpp` that torch would write, with source maps back into the `.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kernel_lsp.findings import Range
from kernel_lsp.sources import CudaKernel, SourceMap, assemble_load_inline, find_kernels

CUDA_SUFFIXES = (".cu", ".cuh")
PYTHON_SUFFIXES = (".py",)

# torch.utils.cpp_extension.COMMON_NVCC_FLAGS
TORCH_NVCC_FLAGS = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                    "--expt-relaxed-constexpr")


@dataclass
class CompileUnit:
    stage: str  # "device" (nvcc, ptxas resources) or "host" (C++ syntax check of load_inline's main.cpp)
    file_name: str  # name inside the scratch directory; what the compiler prints
    text: str
    include_dirs: tuple[str, ...]  # -I, searched after the file's own directory
    system_include_dirs: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    extra_flags: tuple[str, ...] = ()
    torch_flags: bool = False  # compiled the way load_inline compiles (torch's flags and -std)
    source_map: SourceMap | None = None  # generated file -> document; None: positions are the document's
    fallback_range: Range = field(default_factory=lambda: Range.line(0))
    kernels: list[tuple[CudaKernel, Range]] = field(default_factory=list)  # with name ranges in the document
    label: str = ""

    @cached_property
    def lines(self) -> list[str]:  # split once: every compiler message looks its line up here
        return self.text.split("\n")


def is_cuda_document(path: Path) -> bool:
    return path.suffix in CUDA_SUFFIXES


def is_python_document(path: Path) -> bool:
    return path.suffix in PYTHON_SUFFIXES


def cuda_unit(path: Path, text: str, include_dirs: tuple[str, ...], extra_flags: tuple[str, ...],
              system_include_dirs: tuple[str, ...] = ()) -> CompileUnit:
    """`system_include_dirs`: -isystem folders (the CUTLASS/CuTe headers: their warnings are not the user's)."""
    kernels = [(k, k.name_range) for k in find_kernels(text) if k.has_body]  # not prototypes or instantiations
    name = path.name if path.suffix == ".cu" else path.stem + ".cu"
    return CompileUnit("device", name, text, (str(path.parent),) + include_dirs, extra_flags=extra_flags,
                       system_include_dirs=system_include_dirs, kernels=kernels, label=path.name)


def load_inline_units(ext, py_path: Path, include_dirs: tuple[str, ...],
                      system_include_dirs: tuple[str, ...] = ()) -> list[CompileUnit]:
    """The cuda.cu and main.cpp load_inline would write for this call, as compile units."""
    cuda_file, cpp_file = assemble_load_inline(ext)
    name = ext.name or "extension"
    defines = (f"TORCH_EXTENSION_NAME={name}", "TORCH_API_INCLUDE_EXTENSION_H")
    user_includes = tuple(str((py_path.parent / p).resolve()) for p in ext.extra_include_paths)
    common = dict(include_dirs=(str(py_path.parent),) + user_includes + include_dirs, defines=defines,
                  system_include_dirs=system_include_dirs, torch_flags=True, fallback_range=ext.call_range)
    units = []
    if cuda_file is not None:
        kernels = []
        for kernel in find_kernels(cuda_file.text):
            if not kernel.has_body:
                continue
            mapped = cuda_file.map.range_to_original(kernel.name_range)
            if mapped is not None:
                kernels.append((kernel, mapped))
        units.append(CompileUnit("device", f"{name}_cuda.cu", cuda_file.text, source_map=cuda_file.map,
                                 extra_flags=tuple(ext.extra_cuda_cflags), kernels=kernels,
                                 label=f"cuda_sources of load_inline '{name}'", **common))
    units.append(CompileUnit("host", f"{name}_main.cpp", cpp_file.text, source_map=cpp_file.map,
                             extra_flags=tuple(ext.extra_cflags), label=f"cpp_sources of load_inline '{name}'",
                             **common))
    return units
