"""Shared test constants. The 'nvcc' and 'gpu' markers are registered in pyproject.toml."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# real tool output recorded on an H200, in the repository (tests/paths.py)
from tests.paths import FIXTURES  # noqa: E402,F401

# what servers, workers and the CLI started by the tests cache (results, builds, charts) goes to a folder of this
# test session, removed at its end, not to the user's ~/.cache (KERNEL_LSP_CACHE_DIR set by the caller wins)
if not os.environ.get("KERNEL_LSP_CACHE_DIR"):
    _SESSION_CACHE = tempfile.mkdtemp(prefix="kernel-lsp-tests-")
    os.environ["KERNEL_LSP_CACHE_DIR"] = _SESSION_CACHE
    atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)
