"""Real editors for the end-to-end tests. Neovim comes from apt when it is missing (CI machines start bare)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

APT_TIMEOUT_S = 600


def _apt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, timeout=APT_TIMEOUT_S,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def _install_neovim() -> str | None:
    """Installs Debian's neovim package; None when it worked, else why not."""
    if shutil.which("apt-get") is None:
        return "there is no apt-get here; install Neovim (0.7 or later) yourself"
    if os.geteuid() != 0:
        return "installing it needs root: run `apt-get install -y neovim` as root"
    try:
        done = _apt("install", "-y", "neovim")
        if done.returncode != 0:  # a fresh machine's package lists may be empty or stale
            _apt("update")
            done = _apt("install", "-y", "neovim")
    except subprocess.TimeoutExpired:
        return f"apt-get took longer than {APT_TIMEOUT_S} s"
    if done.returncode != 0:
        return f"apt-get install -y neovim failed ({done.returncode}): {done.stderr.strip()[-800:]}"
    return None


@pytest.fixture(scope="session")
def nvim() -> str:
    """The nvim executable; installed with apt-get when missing. In CI (env CI set) no Neovim is a failure."""
    found = shutil.which("nvim")
    if found is None:
        problem = _install_neovim()
        found = shutil.which("nvim")
        if found is None:
            message = f"nvim is not on PATH and could not be installed: {problem or 'apt-get installed no nvim'}"
            if os.environ.get("CI"):
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
    return found
