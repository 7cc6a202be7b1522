"""Reading the user's files without being stopped by them: a symlink loop, a named pipe or a device where a kernel
file or header is expected costs that one path (it reads as absent), never the reader. Pure, no I/O beyond the
path given."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)


def resolved(path: str | Path) -> Path:
    """The path with its links followed; a symlink loop (which has no end to follow) stays as it is written, made
    absolute: it names one file that cannot be read, and costs nothing else."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):  # RuntimeError before Python 3.13, OSError (ELOOP) after
        return Path(os.path.abspath(path))


def read_regular_text(path: str | Path) -> str | None:
    """A regular file's text (undecodable bytes replaced); None for anything else: missing, unreadable, a folder,
    a symlink loop, or a named pipe or device, which would block the reader (opened without blocking, then refused
    by its type)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            log.info("not reading %s: not a regular file", path)
            return None
        with os.fdopen(descriptor, "rb", closefd=False) as stream:
            return stream.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None
    finally:
        os.close(descriptor)
