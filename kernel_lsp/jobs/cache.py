"""Content-addressed result cache: key = hash of everything that determines a result.

Files a result depends on besides the buffer (headers included with quotes) are stamped
(mtime, size) when the result is stored; a changed stamp makes the entry stale.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.findings import Finding


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
    def __init__(self, max_entries: int = 512) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._max = max_entries
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> list[Finding] | None:
        entry = self._entries.get(key)
        if entry is None or any(stamp(Path(s[0])) != tuple(s) for s in entry.stamps):
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry.findings

    def put(self, key: str, findings: list[Finding], depends_on: list[Path]) -> None:
        self._entries[key] = _Entry(list(findings), [stamp(p) for p in depends_on])
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
