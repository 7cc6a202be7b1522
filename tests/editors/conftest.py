"""Real editors for the end-to-end tests: Neovim and tmux from PATH (the README's test command installs them)."""

from __future__ import annotations

import shutil

import pytest

from tests.editors.missing import missing

def _executable(name: str, hint: str) -> str:
    """`name` on PATH. Missing: a failure in CI (env CI set), else a skip that says what to install (the README's
    test command installs it with tools/test-tools.sh; the tests themselves install nothing)."""
    found = shutil.which(name)
    if found is None:
        missing(f"{name} is not on PATH: install {hint} (tools/test-tools.sh does it with apt-get as root)")
    return found


@pytest.fixture(scope="session")
def nvim() -> str:
    """The nvim executable. In CI (env CI set) no Neovim is a failure."""
    return _executable("nvim", "Neovim 0.7 or later (Debian: neovim)")


@pytest.fixture(scope="session")
def tmux() -> str:
    """The tmux executable (the screen tests run a real Neovim in it), as for nvim."""
    return _executable("tmux", "tmux")
