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


def import_circles(package: str) -> list[list[str]]:
    """The circles of `package`'s import graph (strongly connected groups of two or more modules), each sorted;
    imports inside functions and under TYPE_CHECKING count too: a circle is a circle to the reader. import-linter's
    layers cannot see one inside a package."""
    import grimp

    graph = grimp.build_graph(package, cache_dir=None)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph.modules):  # Tarjan's algorithm, iteratively (no recursion limit to mind)
        if root in order:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.find_modules_directly_imported_by(target)))))
                elif target in on_stack:
                    low[module] = min(low[module], order[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == order[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_module_imports_another_that_imports_it_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("grimp", reason="grimp (import-linter's graph, in the test extras) is not installed")
    assert import_circles("kernel_lsp") == []
    # the check itself finds one: two modules of a package that import each other, one only for its types
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circled.b import B\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circled.a import A\n"
                                  "class B: ...\n")
    (package / "c.py").write_text("import circled.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles("circled") == [["circled.a", "circled.b"]]
