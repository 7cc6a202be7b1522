"""Finding the tools a compile needs (nvcc, the host C++ compiler, torch's headers) without importing torch."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from kernel_lsp.compile.process import run_process
from kernel_lsp.config import Settings

VERSION_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Tool:
    path: str
    version: str


class ToolProblem(Exception):
    """A tool is missing or broken; the message says what and which setting points to it."""


def nvcc_candidates(settings: Settings) -> list[str]:
    if settings.compile.nvcc_path:
        return [settings.compile.nvcc_path]
    found = [shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found.append(str(Path(home) / "bin" / "nvcc"))
    return [p for p in dict.fromkeys(found) if p]


_tool_cache: dict[tuple[str, float], Tool | ToolProblem] = {}  # a broken tool is probed once, not per compile


async def find_nvcc(settings: Settings) -> Tool:
    """The first nvcc that runs, with its version; ToolProblem says what is wrong otherwise."""
    candidates = [p for p in nvcc_candidates(settings) if Path(p).is_file()]
    if not candidates:
        nvcc = settings.compile.nvcc_path
        where = f"nvccPath is set to '{nvcc}', which does not exist" if nvcc \
            else "nvcc is not on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin"
        raise ToolProblem(f"CUDA compiler not found: {where}. Install the CUDA toolkit or set the "
                          "'nvccPath' setting ([tool.kernel-lsp] nvcc-path) to the nvcc executable.")
    return await _probe(candidates[0], r"release [\d.]+, V([\d.]+)", "nvccPath")


async def find_host_compiler(settings: Settings) -> Tool:
    chosen = settings.compile.host_compiler
    names = [chosen] if chosen else [os.environ.get("CXX", ""), "c++", "g++"]
    for name in filter(None, names):
        path = shutil.which(name) or (name if Path(name).is_file() else None)
        if path:
            return await _probe(path, r"(\d+\.\d+(?:\.\d+)?)", "hostCompiler")
    raise ToolProblem("host C++ compiler not found (tried $CXX, c++, g++): install g++ or set the "
                      "'hostCompiler' setting.")


async def _probe(path: str, version_pattern: str, setting: str) -> Tool:
    try:
        key = (path, os.stat(path).st_mtime)
    except OSError as exc:
        raise ToolProblem(f"{path} cannot be read ({exc}); check the '{setting}' setting.") from exc
    if key not in _tool_cache:  # keyed by mtime: a reinstalled tool is probed again
        _tool_cache[key] = await _run_version(path, version_pattern, setting)
    outcome = _tool_cache[key]
    if isinstance(outcome, ToolProblem):
        raise ToolProblem(str(outcome))
    return outcome


async def _run_version(path: str, version_pattern: str, setting: str) -> Tool | ToolProblem:
    try:
        result = await run_process([path, "--version"], timeout_s=VERSION_TIMEOUT_S)
    except OSError as exc:
        return ToolProblem(f"{path} does not run ({exc}); check the '{setting}' setting.")
    text = result.stdout + result.stderr
    match = re.search(version_pattern, text)
    if result.timed_out or result.returncode != 0 or not match:
        why = "timed out" if result.timed_out else f"exit status {result.returncode}: {text.strip()[:200]!r}"
        return ToolProblem(f"{path} --version failed ({why}); check the '{setting}' setting.")
    return Tool(path, match.group(1))


@dataclass(frozen=True)
class TorchHeaders:
    include_dirs: tuple[str, ...]  # torch's own and Python's, in the order load_inline passes them
    cxx_std: str


_torch_cache: dict[tuple, TorchHeaders] = {}


async def find_torch_headers(settings: Settings) -> TorchHeaders:
    """torch's include directories as load_inline passes them, found without importing torch."""
    key = (settings.compile.python_path, settings.compile.torch_include_dirs)
    if key in _torch_cache:
        return _torch_cache[key]
    if settings.compile.torch_include_dirs:
        headers = TorchHeaders(settings.compile.torch_include_dirs, "c++17")
    else:
        torch_dir, python_include = await _locate_torch(settings.compile.python_path)
        headers = TorchHeaders(
            (str(torch_dir / "include"), str(torch_dir / "include" / "torch" / "csrc" / "api" / "include"),
             python_include),
            _cxx_standard(torch_dir),
        )
    _torch_cache[key] = headers
    return headers


_LOCATE_SCRIPT = ("import importlib.util, json, sysconfig; s = importlib.util.find_spec('torch'); "
                  "print(json.dumps([list(s.submodule_search_locations) if s else None, "
                  "sysconfig.get_path('include', scheme='posix_prefix')]))")


async def _locate_torch(python_path: str) -> tuple[Path, str]:
    if python_path:
        try:
            result = await run_process([python_path, "-c", _LOCATE_SCRIPT], timeout_s=VERSION_TIMEOUT_S)
            locations, python_include = json.loads(result.stdout)
        except (OSError, ValueError) as exc:
            raise ToolProblem(f"the 'pythonPath' interpreter {python_path} could not be asked where torch is: "
                              f"{exc}") from exc
    else:
        spec = importlib.util.find_spec("torch")  # locates the package; does not import it
        locations = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else None
        python_include = sysconfig.get_path("include", scheme="posix_prefix")
    if not locations:
        raise ToolProblem("torch is not installed for this Python, so load_inline sources cannot be compiled "
                          "with its headers: install torch, or set 'pythonPath' to an interpreter that has it, "
                          "or 'torchIncludeDirs'.")
    return Path(locations[0]), python_include


def _cxx_standard(torch_dir: Path) -> str:
    """The -std= flag torch's cpp_extension passes (c++20 from torch 2.10 on), read from its source."""
    try:
        text = (torch_dir / "utils" / "cpp_extension.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "c++17"
    return "c++20" if "'-std=c++20'" in text else "c++17"


# --- CUTLASS and CuTe headers ----------------------------------------------------------------------------------

CUTLASS_PACKAGE = "cutlass_library"  # the nvidia-cutlass wheel's package; its headers are under source/include
CUTLASS_MARKERS = ("cute/tensor.hpp", "cutlass/cutlass.h")  # a folder holding either is an include folder


@dataclass(frozen=True)
class CutlassHeaders:
    include: str  # the folder holding cute/ and cutlass/, passed as -isystem
    origin: str  # which of the places below it came from, for doctor and messages


def cutlass_headers(setting: str) -> CutlassHeaders | None:
    """The CUTLASS/CuTe include folder: the cutlassInclude setting, else $CUTLASS_PATH/include, else the installed
    nvidia-cutlass package's (found without importing it); None when none holds the headers."""
    return _cutlass_headers(setting, os.environ.get("CUTLASS_PATH", ""))


def _cutlass_headers(setting: str, cutlass_path: str) -> CutlassHeaders | None:
    candidates = []
    if setting:
        candidates.append((Path(setting).expanduser(), "the cutlassInclude setting"))
    if cutlass_path:
        candidates.append((Path(cutlass_path).expanduser() / "include", "$CUTLASS_PATH/include"))
    package = _cutlass_package_include()
    if package is not None:
        candidates.append((package, "the nvidia-cutlass package"))
    for folder, origin in candidates:
        if any((folder / marker).is_file() for marker in CUTLASS_MARKERS):
            return CutlassHeaders(str(folder.resolve()), origin)
    return None


def _cutlass_package_include() -> Path | None:
    try:
        spec = importlib.util.find_spec(CUTLASS_PACKAGE)  # a top-level package: found, not imported
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "source" / "include"


def cutlass_problem(setting: str) -> str:
    """Why no headers were found, naming what was tried and how to fix it."""
    tried = [f"cutlassInclude {setting!r}"] if setting else []
    if os.environ.get("CUTLASS_PATH"):
        tried.append(f"$CUTLASS_PATH/include ({os.environ['CUTLASS_PATH']}/include)")
    tried.append("the nvidia-cutlass package" + ("" if _cutlass_package_include() else " (not installed)"))
    return (f"no CUTLASS/CuTe headers ({', '.join(tried)} hold none of {', '.join(CUTLASS_MARKERS)}): "
            "pip install 'kernel-lsp[cutlass]', set $CUTLASS_PATH to a CUTLASS checkout, or set cutlassInclude")
