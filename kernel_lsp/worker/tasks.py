"""Entry functions a sandboxed child calls (SandboxTask.entry "kernel_lsp.worker.tasks:NAME"); CPU only."""

from __future__ import annotations

import importlib.util
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
