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


def private_imports_across_packages(root: Path) -> list[str]:
    """`from kernel_lsp.<package>... import _name` written outside that package (a module's private names are its
    package's own business)."""
    import ast

    found = []
    for path in sorted((root / "kernel_lsp").rglob("*.py")):
        importer = path.relative_to(root).with_suffix("").parts
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("kernel_lsp."):
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private and node.module.split(".")[1] != importer[1]:
                found.append(f"{'/'.join(importer)}.py:{node.lineno}: {node.module} {', '.join(private)}")
    return found


def test_no_private_name_is_imported_across_packages(tmp_path: Path) -> None:
    assert private_imports_across_packages(ROOT) == []
    # the check itself sees such an import
    (tmp_path / "kernel_lsp" / "server").mkdir(parents=True)
    (tmp_path / "kernel_lsp" / "server" / "x.py").write_text("from kernel_lsp.bench.candidates import _read\n")
    assert private_imports_across_packages(tmp_path) == ["kernel_lsp/server/x.py:1: kernel_lsp.bench.candidates _read"]
