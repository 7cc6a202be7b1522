"""The generated references (docs/reference/) match the code, every setting and finding code is documented,
and the documentation site builds with `mkdocs build --strict`."""

from __future__ import annotations

import ast
import os
import importlib.util
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from kernel_lsp.findings import CODES
from kernel_lsp.worker.sandbox import SandboxStatus

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "tools" / "gen_reference.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

# String literals that look like finding codes but name other things (job kinds, statuses, producers, targets).
NOT_CODES = {"compile-error", "cute-dsl", "cute-dsl-check", "nvcc-frontend", "host-compiler", "python-exception",
             "run-python", "verify-verdict", "cute-dsl-dump"}
FAMILIES = ("nvcc", "host", "ptxas", "python", "extension", "torch", "compile", "internal", "run", "verify",
            "integrity", "hint", "ncu", "cute-dsl")
CODE_RE = re.compile(rf"^(?:{'|'.join(re.escape(f) for f in FAMILIES)})-[a-z0-9-]+$")


def test_generated_references_are_current():
    for path, text in gen.generate().items():
        assert path.exists(), f"{path} missing: run python tools/gen_reference.py"
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run python tools/gen_reference.py"


def test_every_setting_has_a_meaning():
    missing = [key for key, _, meaning, _ in gen.setting_rows() if not meaning.strip()]
    assert not missing, f"settings without a description in editor_clients/vscode/package.json: {missing}"


def test_every_finding_code_says_what_to_do():
    for code, doc in CODES.items():
        assert doc.severity in {"error", "warning", "information", "hint"}, code
        assert doc.meaning.strip() and doc.action.strip(), f"{code}: meaning and what to do needed"


def _documented(code: str) -> bool:
    return code in CODES or any(k.endswith("*") and code.startswith(k[:-1]) for k in CODES)


def test_codes_in_the_source_are_documented():
    found: set[str] = set()
    for path in [*(ROOT / "kernel_lsp").rglob("*.py"), *(ROOT / "profilers").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE_RE.match(node.value):
                found.add(node.value)
    # Codes built at run time: run-<sandbox status>, hint-<bound>-bound, <tool>-<severity>.
    found |= {f"run-{s}" for s in typing.get_args(SandboxStatus) if s != "ok"}
    found |= {f"hint-{b}-bound" for b in ("memory", "compute", "latency")}
    found |= {f"{t}-{s}" for t in ("nvcc", "host") for s in ("error", "warning")} | {"ptxas-error", "ptxas-warning"}
    undocumented = sorted(c for c in found - NOT_CODES if not _documented(c))
    assert not undocumented, f"add these to kernel_lsp/findings.py CODES: {undocumented}"


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (it comes with the test extra)")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]


def test_the_site_carries_developers_md():
    assert (ROOT / "docs" / "developers.md").read_text() == (ROOT / "DEVELOPERS.md").read_text(), \
        "copy DEVELOPERS.md to docs/developers.md"


def test_every_cli_option_has_help():
    lines = [line for line in gen.cli_md().splitlines() if line.startswith("| `")]
    assert lines and all(not line.endswith("|  |") for line in lines), [l for l in lines if l.endswith("|  |")]
