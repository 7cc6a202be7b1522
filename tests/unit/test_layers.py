"""The import layers of pyproject.toml's [tool.importlinter] contracts hold (docs/ARCHITECTURE.md, "Layers")."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def lint_imports() -> str | None:
    beside = Path(sys.executable).with_name("lint-imports")
    return str(beside) if beside.exists() else shutil.which("lint-imports")


def test_the_import_contracts_hold() -> None:
    command = lint_imports()
    if command is None:
        pytest.skip("lint-imports (import-linter, in the test extras) is not installed")
    result = subprocess.run([command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout and "4 kept" in result.stdout, result.stdout[-2000:]
