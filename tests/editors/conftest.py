"""Real editors for the end-to-end tests. Neovim and tmux come from apt when missing (CI machines start bare)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.editors.missing import missing

APT_TIMEOUT_S = 600


def _apt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def _apt_install(package: str, hint: str) -> str | None:
    """Installs a Debian package; None when it worked, else why not. `hint`: what to install by hand instead."""
    if shutil.which("apt-get") is None:
        return f"there is no apt-get here; install {hint} yourself"
    if os.geteuid() != 0:
        return f"installing it needs root: run `apt-get install -y {package}` as root"
    try:
        done = _apt("install", "-y", package)
        if done.returncode != 0:  # a fresh machine's package lists may be empty or stale
            _apt("update")
            done = _apt("install", "-y", package)
    except subprocess.TimeoutExpired:
        return f"apt-get took longer than {APT_TIMEOUT_S} s"
    if done.returncode != 0:
        return f"apt-get install -y {package} failed ({done.returncode}): {done.stderr.strip()[-800:]}"
    return None


def _executable(name: str, package: str, hint: str) -> str:
    """`name` on PATH, installed from `package` with apt-get when missing. In CI (env CI set) none is a failure."""
    found = shutil.which(name)
    if found is None:
        problem = _apt_install(package, hint)
        found = shutil.which(name)
        if found is None:
            missing(f"{name} is not on PATH and could not be installed: {problem or f'apt-get installed no {name}'}")
    return found


@pytest.fixture(scope="session")
def nvim() -> str:
    """The nvim executable; installed with apt-get when missing. In CI (env CI set) no Neovim is a failure."""
    return _executable("nvim", "neovim", "Neovim (0.7 or later)")


@pytest.fixture(scope="session")
def tmux() -> str:
    """The tmux executable (the screen tests run a real Neovim in it); apt-get when missing, as for nvim."""
    return _executable("tmux", "tmux", "tmux")
