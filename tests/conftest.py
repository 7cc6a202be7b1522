"""Shared test constants, and the markers given by folder: `editors` for tests/editors, `slow` for the folders whose
tests start servers, workers, sandboxes or builds (markers registered in pyproject.toml)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# real tool output recorded on an H200, in the repository (tests/paths.py)
from tests.paths import FIXTURES  # noqa: E402,F401

# what servers, workers and the CLI started by the tests cache (results, builds, charts) goes to a folder of this
# test session, removed at its end, not to the user's ~/.cache (KERNEL_LSP_CACHE_DIR set by the caller wins)
if not os.environ.get("KERNEL_LSP_CACHE_DIR"):
    _SESSION_CACHE = tempfile.mkdtemp(prefix="kernel-lsp-tests-")
    os.environ["KERNEL_LSP_CACHE_DIR"] = _SESSION_CACHE
    atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)

TESTS = Path(__file__).resolve().parent
SLOW_FOLDERS = {"lsp", "cli", "pipeline", "worker", "agent", "gpu"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path)).resolve()
        folder = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""
        if folder == "editors":
            item.add_marker(pytest.mark.editors)
        elif folder in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def without_sandbox(monkeypatch: pytest.MonkeyPatch):
    """No candidate's sandbox (as on a machine without bubblewrap): for tests whose stand-in tools (a fake ncu or
    compute-sanitizer, a shell script) write what they saw into the test's folder, which a sandbox hides."""
    from kernel_lsp.process import namespaces

    monkeypatch.setenv(namespaces.BWRAP_ENV, "/nonexistent/bwrap")
    namespaces.isolation_status.cache_clear()
    yield
    namespaces.isolation_status.cache_clear()


@pytest.fixture
def sandbox_available() -> None:
    """The candidate's sandbox starts here (bubblewrap, namespaces), else the test skips saying what is missing."""
    from kernel_lsp.process.namespaces import isolation_status
    from tests.editors.missing import missing

    status = isolation_status()
    if not status.startswith("isolated"):
        missing(f"the candidate's sandbox cannot start here: {status}")
