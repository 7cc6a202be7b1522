"""An nvcc that logs each run and then runs the real one: how tests count compiles (server and CLI alike)."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path


def nvcc_wrapper(folder: Path) -> tuple[Path, Path]:
    """(the wrapper, its log): each argv one line in the log."""
    log = folder / "nvcc-calls.log"
    wrapper = folder / "nvcc"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec "{shutil.which("nvcc")}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return wrapper, log


def compiles(log: Path) -> list[str]:
    """The logged nvcc runs that compiled something (not `--version` probes)."""
    if not log.exists():
        return []
    return [line for line in log.read_text().splitlines() if line.strip() != "--version"]
