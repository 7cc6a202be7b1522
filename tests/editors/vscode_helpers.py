"""Builds the VS Code extension once per test session (npm ci, lint, test, build, vsce package) on a fresh copy:
once for all of the session's pytest-xdist workers, which share the session's cache folder (tests/conftest.py sets
KERNEL_LSP_CACHE_DIR before the workers start, and removes it at the end)."""

from __future__ import annotations

import atexit
import fcntl
import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.editors.missing import missing

REPO = Path(__file__).resolve().parents[2]
EXTENSION = REPO / "editor_clients" / "vscode"
NOT_COPIED = shutil.ignore_patterns("node_modules", "dist", "out", "*.vsix", "e2e-artifacts")
STEP_TIMEOUT_S = 600
STEPS = [
    ("ci", ["ci", "--no-audit", "--no-fund"]),
    ("lint", ["run", "lint"]),
    ("test", ["test"]),
    ("build", ["run", "build"]),
    ("package", ["exec", "--", "vsce", "package", "--no-dependencies", "--out", "kernel-lsp.vsix"]),
]


@dataclass
class BuiltExtension:
    vsix: Path
    names: set[str]
    manifest: dict[str, Any]
    bundle: str
    outputs: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


def need(tool: str, why: str) -> str:
    """The tool's path; a skip outside CI, a failure in CI (env CI set), when it is missing."""
    found = shutil.which(tool)
    if found is None:
        missing(f"{tool} is not on PATH: {why}")
    return found


def run_step(command: list[str], cwd: Path, timeout_s: float = STEP_TIMEOUT_S,
             env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False,
                          env={**os.environ, "npm_config_fund": "false", "npm_config_audit": "false", **(env or {})})
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} failed ({done.returncode}):\n{output[-6000:]}"
    return output


@functools.cache
def built_extension() -> BuiltExtension:
    npm = need("npm", "install Node.js 20 or later (with npm) to build the VS Code extension")
    shared = os.environ.get("KERNEL_LSP_CACHE_DIR")
    if not shared:  # outside the test session's folder: a build of this process's own
        return _build(npm, Path(tempfile.mkdtemp(prefix="kernel-lsp-vscode-")), remove_at_exit=True)
    folder = Path(shared) / "vscode-extension-build"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker builds; the others wait, then read what it recorded
        record = folder / "built.json"
        if record.is_file():
            done = json.loads(record.read_text())
            return _opened(Path(done["vsix"]), done["outputs"], done["timings"])
        built = _build(npm, Path(tempfile.mkdtemp(prefix="build-", dir=folder)), remove_at_exit=False)
        record.write_text(json.dumps({"vsix": str(built.vsix), "outputs": built.outputs, "timings": built.timings}))
        return built


def _build(npm: str, parent: Path, remove_at_exit: bool) -> BuiltExtension:
    work = parent / "vscode"
    if remove_at_exit:
        atexit.register(shutil.rmtree, parent, True)
    shutil.copytree(EXTENSION, work, ignore=NOT_COPIED)
    outputs, timings = {}, {}
    for name, args in STEPS:
        started = time.monotonic()
        outputs[name] = run_step([npm, *args], work)
        timings[name] = time.monotonic() - started
    return _opened(work / "kernel-lsp.vsix", outputs, timings)


def _opened(vsix: Path, outputs: dict[str, str], timings: dict[str, float]) -> BuiltExtension:
    assert vsix.is_file(), f"vsce package wrote no {vsix.name}:\n{outputs['package'][-3000:]}"
    with zipfile.ZipFile(vsix) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("extension/package.json"))
        bundle_name = "extension/dist/extension.js"
        bundle = archive.read(bundle_name).decode() if bundle_name in names else ""
    return BuiltExtension(vsix, names, manifest, bundle, outputs, timings)
