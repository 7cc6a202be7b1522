"""Shared test constants. The 'nvcc' and 'gpu' markers are registered in pyproject.toml."""

from __future__ import annotations

import os
from pathlib import Path

# real tool output recorded on an H200, kept in the project's shared folder beside the repository
# (KERNEL_LSP_FIXTURES names a copy elsewhere, e.g. one carried to the GPU machine)
FIXTURES = Path(os.environ.get("KERNEL_LSP_FIXTURES",
                              Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "h200"))
