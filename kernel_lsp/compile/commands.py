"""Command lines for a compile unit: nvcc for the device side, the host compiler for main.cpp."""

from __future__ import annotations

from kernel_lsp.compile.toolchain import TorchHeaders
from kernel_lsp.compile.units import TORCH_NVCC_FLAGS, CompileUnit
from kernel_lsp.config import Settings


def arch_flags(archs: tuple[str, ...]) -> list[str]:
    if len(archs) == 1:
        return [f"-arch={archs[0]}"]
    flags = []
    for arch in archs:
        number = arch.split("_", 1)[1]
        flags.append(f"-gencode=arch=compute_{number},code={arch}")
    return flags


def _names_arch(flags: tuple[str, ...]) -> bool:
    return any(f.startswith(("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code")) for f in flags)


def device_command(nvcc: str, unit: CompileUnit, settings: Settings, torch: TorchHeaders | None,
                   output: str) -> list[str]:
    """nvcc up to the device binary (-fatbin): front-end errors for host and device code, and ptxas -v."""
    argv = [nvcc, "-x", "cu", "-fatbin", "-o", output, "-Xptxas", "-v", "-lineinfo"]
    extra = unit.extra_flags + settings.compile.extra_flags
    if not _names_arch(extra):
        argv += arch_flags(settings.compile.arch)
    argv += _include_and_define_flags(unit, torch)
    if unit.torch_flags:
        argv += list(TORCH_NVCC_FLAGS)
        if torch is not None:
            argv.append(f"-std={torch.cxx_std}")
    argv += list(extra)
    argv.append(unit.file_name)
    return argv


def host_command(cxx: str, unit: CompileUnit, settings: Settings, torch: TorchHeaders | None) -> list[str]:
    """The host compiler with -fsyntax-only: errors of main.cpp without the cost of code generation."""
    # -fdiagnostics-show-option keeps the [-Wfoo] name, which becomes the finding's detail
    argv = [cxx, "-x", "c++", "-fsyntax-only", "-fdiagnostics-color=never", "-fdiagnostics-show-option"]
    if torch is not None:
        argv.append(f"-std={torch.cxx_std}")
    argv += _include_and_define_flags(unit, torch)
    argv += list(unit.extra_flags)
    argv.append(unit.file_name)
    return argv


def _include_and_define_flags(unit: CompileUnit, torch: TorchHeaders | None) -> list[str]:
    flags = [f"-D{d}" for d in unit.defines]
    flags += [f"-I{d}" for d in unit.include_dirs]
    system = unit.system_include_dirs + (torch.include_dirs if (unit.torch_flags and torch) else ())
    for d in system:
        flags += ["-isystem", d]
    return flags
