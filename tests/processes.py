"""Finding the processes a test started, by a marker on their command line (tests/unit/test_keeper.py,
tests/worker/test_leaves_nothing.py)."""

from __future__ import annotations

import os
from pathlib import Path


def marked(marker: str) -> list[int]:
    """Living processes whose command line holds `marker`: a zombie does not count, unless other threads of it
    still run (its main thread exited)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            command = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()[0]
            alive = state != "Z" or len(os.listdir(f"/proc/{name}/task")) > 1
        except (OSError, ValueError):
            continue
        if marker.encode() in command and alive:
            found.append(int(name))
    return found
