"""Entry functions a sandboxed child calls (SandboxTask.entry "kernel_lsp.worker.tasks:NAME")."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def call_function(file: str, function: str, kwargs: dict[str, Any] | None = None) -> Any:
    """Imports `file` (relative to the task directory) and returns function(**kwargs), a msgpack value."""
    return getattr(_import_file(Path(file)), function)(**(kwargs or {}))


def _import_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path.resolve())
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(path.stem, module)  # lets the file's dataclasses find their module; never shadows one
    spec.loader.exec_module(module)
    return module


def build_extension(name: str, cpp_sources: list[str], cuda_sources: list[str], functions: list[str] | None,
                    extra_cflags: list[str], extra_cuda_cflags: list[str], build_directory: str) -> dict[str, Any]:
    """Builds (or, when the directory already holds this build, only loads) a load_inline extension."""
    from torch.utils.cpp_extension import load_inline

    os.makedirs(build_directory, exist_ok=True)  # here, so that it belongs to the confined child's user
    module = load_inline(name=name, cpp_sources=cpp_sources, cuda_sources=cuda_sources or None,
                         functions=functions, extra_cflags=extra_cflags, extra_cuda_cflags=extra_cuda_cflags,
                         build_directory=build_directory, verbose=False)
    return {"module": module.__file__}
