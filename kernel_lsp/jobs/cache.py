"""Content-addressed result cache: key = hash of everything that determines a result.

Files a result depends on besides the buffer (headers included with quotes) are stamped
(mtime, size) when the result is stored; a changed stamp makes the entry stale. With a DiskCache attached, every
entry is also kept on disk (jobs/disk_cache.py), so a restarted server answers from it without compiling.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_lsp.findings import Finding

if TYPE_CHECKING:
    from kernel_lsp.jobs.disk_cache import DiskCache


def cache_key(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str).encode("utf-8", "surrogatepass")
    return hashlib.sha256(blob).hexdigest()


def stamp(path: Path) -> tuple[str, int, int] | tuple[str, None, None]:
    try:
        st = os.stat(path)
        return (str(path), st.st_mtime_ns, st.st_size)
    except OSError:
        return (str(path), None, None)


@dataclass
class _Entry:
    findings: list[Finding]
    stamps: list[tuple]


class ResultCache:
    def __init__(self, max_entries: int = 512, disk: "DiskCache | None" = None) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._max = max_entries
        self.disk = disk
        self.hits = 0
        self.disk_hits = 0
        self.misses = 0

    def get(self, key: str) -> list[Finding] | None:
        entry = self._entries.get(key)
        if entry is None and self.disk is not None:
            entry = _from_disk(self.disk.get(key))
            if entry is not None:
                self.disk_hits += 1
                self._remember(key, entry)
        if entry is None or any(stamp(Path(s[0])) != tuple(s) for s in entry.stamps):
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry.findings

    def put(self, key: str, findings: list[Finding], depends_on: list[Path]) -> None:
        entry = _Entry(list(findings), [stamp(p) for p in depends_on])
        self._remember(key, entry)
        if self.disk is not None:
            self.disk.put(key, {"findings": [f.to_dict() for f in entry.findings],
                                "stamps": [list(s) for s in entry.stamps]})

    def _remember(self, key: str, entry: _Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)


def _from_disk(value: dict[str, Any] | None) -> _Entry | None:
    """An entry read back from the disk cache; one that does not have the expected shape is a miss."""
    if value is None:
        return None
    try:
        return _Entry([Finding.from_dict(f) for f in value["findings"]],
                      [(str(s[0]), s[1], s[2]) for s in value["stamps"]])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
