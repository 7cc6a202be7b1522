"""Which files depend on which: #include, cpp_extension.load(sources=[...]), and a candidate's reference.

A change to a file re-checks its dependents (the transitive reverse closure). Paths are absolute and resolved. Pure
standard library plus kernel_lsp.sources. Not thread-safe, but for edges_of, which only reads (the server makes a
file's edges in a thread, which reads and parses, and sets them from its asyncio loop).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kernel_lsp.paths import resolved
from kernel_lsp.sources import find_includes, parse_python

_LOAD = re.compile(r"\bload\b")  # cpp_extension.load, or its import; not load_inline

# Files whose #include lines are followed (the C and C++ sources a .cu can pull in, and the .cu itself).
INCLUDING_SUFFIXES = frozenset((".cu", ".cuh", ".h", ".hh", ".hpp", ".hxx", ".inl", ".c", ".cc", ".cpp", ".cxx"))


@dataclass(frozen=True, order=True)
class Edge:
    source: Path  # the file that depends
    target: Path  # the file it depends on
    kind: str  # "include" | "load-source" | "reference"


class DependencyGraph:
    """Outgoing edges per file, (re)made from the file's text by update(), and the reverse index for dependents().

    include_dirs: where `#include <x.h>` is looked for, and `#include "x.h"` after the including file's folder.
    reference_of(path, text): a candidate's reference file, or None (e.g. built on verify.pairing.find_reference).
    """

    def __init__(self, include_dirs: Sequence[Path] = (),
                 reference_of: Callable[[Path, str], Path | None] | None = None) -> None:
        self.include_dirs = tuple(resolved(folder) for folder in include_dirs)
        self.reference_of = reference_of
        self._out: dict[Path, frozenset[Edge]] = {}  # only files with at least one edge
        self._in: dict[Path, set[Path]] = {}  # target -> the files with an edge to it

    def update(self, path: Path, text: str) -> set[Path]:
        """Parse one file's outgoing edges again, replacing the old ones; returns its direct dependencies."""
        return self.set_edges(path, self.edges_of(path, text))

    def edges_of(self, path: Path, text: str) -> frozenset[Edge]:
        """The file's outgoing edges as its text has them (files looked for on disk, a .py parsed); changes nothing."""
        return frozenset(self._parse(resolved(path), text))

    def set_edges(self, path: Path, edges: frozenset[Edge]) -> set[Path]:
        """The file's outgoing edges (edges_of's) in place of the old ones; returns its direct dependencies."""
        path = resolved(path)
        old = self._out.get(path, frozenset())
        if edges != old:
            old_targets = {edge.target for edge in old}
            new_targets = {edge.target for edge in edges}
            for target in old_targets - new_targets:
                self._unlink(path, target)
            for target in new_targets - old_targets:
                self._in.setdefault(target, set()).add(path)
            if edges:
                self._out[path] = edges
            else:
                self._out.pop(path, None)
        return {edge.target for edge in edges}

    def remove(self, path: Path) -> None:
        """Drop the file's outgoing edges (a deleted file). Edges to it stay: a dependent still names it, and creating
        it again re-checks that dependent."""
        path = resolved(path)
        for target in {edge.target for edge in self._out.pop(path, frozenset())}:
            self._unlink(path, target)

    def dependencies(self, path: Path) -> set[Path]:
        """The files this one depends on directly."""
        return {edge.target for edge in self._out.get(resolved(path), frozenset())}

    def dependents(self, path: Path) -> set[Path]:
        """Every file that depends on this one, directly or through others; never the file itself (cycle-safe)."""
        start = resolved(path)
        seen = {start}
        pending = [start]
        while pending:
            for source in self._in.get(pending.pop(), ()):
                if source not in seen:
                    seen.add(source)
                    pending.append(source)
        seen.discard(start)
        return seen

    def edges(self) -> list[Edge]:
        return sorted(edge for edges in self._out.values() for edge in edges)

    def __len__(self) -> int:
        """The number of files with outgoing edges."""
        return len(self._out)

    def _unlink(self, source: Path, target: Path) -> None:
        sources = self._in.get(target)
        if sources is not None:
            sources.discard(source)
            if not sources:
                del self._in[target]

    def _parse(self, path: Path, text: str) -> set[Edge]:
        edges: set[Edge] = set()
        if path.suffix in INCLUDING_SUFFIXES:
            for include in find_includes(text) if "include" in text else ():
                target = self._resolve_include(path.parent, include.path, include.quoted)
                if target is not None and target != path:
                    edges.add(Edge(path, target, "include"))
        elif path.suffix == ".py":
            if "cpp_extension" in text and _LOAD.search(text):  # parse_python is slow: only where a load() can be
                for extension in parse_python(text).extensions:
                    if extension.kind == "load":
                        for source in extension.source_files:
                            # as jobs.files.load_sources: relative names are from the candidate's folder
                            target = resolved(path.parent / Path(source).expanduser())
                            if target != path:
                                edges.add(Edge(path, target, "load-source"))
            if self.reference_of is not None:
                reference = self.reference_of(path, text)
                if reference is not None:
                    reference = resolved(reference)
                    if reference != path:  # same-file pairing: no edge
                        edges.add(Edge(path, reference, "reference"))
        return edges

    def _resolve_include(self, folder: Path, name: str, quoted: bool) -> Path | None:
        """A quoted include: the including file's folder, then the include dirs; not found -> where it would be in
        the folder (creating it there later re-checks the includer). An angle include: the include dirs only; not
        found -> None (a system header)."""
        if not name.strip():
            return None
        if quoted:
            here = folder / name
            if here.is_file():
                return resolved(here)
        for include_dir in self.include_dirs:
            there = include_dir / name
            if there.is_file():
                return resolved(there)
        return resolved(folder / name) if quoted else None
