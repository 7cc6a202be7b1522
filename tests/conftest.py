"""Shared test constants. The 'nvcc' and 'gpu' markers are registered in pyproject.toml."""

from __future__ import annotations

from pathlib import Path

# real tool output recorded on an H200, kept in the project's shared folder beside the repository
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "h200"
