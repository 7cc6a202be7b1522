"""The agent's search of the installed CUTLASS/CuTe sources (KernelPro's code search): the headers under the include
folder kernel_lsp.compile.toolchain.cutlass_headers finds, and the examples beside it when the package ships them.

A query is a few words; a line scores by how many distinct query words it holds (case-insensitive), a file by its
best line, with a small bonus when a word is in its path. The answer is the best MAX_SNIPPETS snippets, each the
best line of its file with CONTEXT_LINES around it, under the file's path relative to the search root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SUFFIXES = (".hpp", ".h", ".cuh", ".cu", ".inl", ".py")
MAX_SNIPPETS = 5
CONTEXT_LINES = 6
MAX_FILE_BYTES = 2_000_000
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")


@dataclass(frozen=True)
class Snippet:
    path: str  # relative to the root it was found under (include/ or examples/)
    line: int  # 1-based, the best-matching line
    text: str  # CONTEXT_LINES either side, numbered
    score: float


def search_roots(include: Path) -> list[Path]:
    """The include folder, and the package's examples/ beside it."""
    roots = [include]
    examples = include.parent / "examples"
    if examples.is_dir():
        roots.append(examples)
    return roots


def search(roots: list[Path], query: str, limit: int = MAX_SNIPPETS) -> list[Snippet]:
    words = {w.lower() for w in _WORD.findall(query) if len(w) > 1}
    if not words:
        return []
    found = []
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
            snippet = _best_in(root, path, words)
            if snippet is not None:
                found.append(snippet)
    found.sort(key=lambda s: (-s.score, s.path, s.line))
    return found[:limit]


def _best_in(root: Path, path: Path, words: set[str]) -> Snippet | None:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    except OSError:
        return None
    relative = path.relative_to(root).as_posix()
    in_path = sum(word in relative.lower() for word in words) * 0.5
    best, best_line = 0, -1
    for number, line in enumerate(lines):
        lowered = line.lower()
        if not any(word in lowered for word in words):
            continue
        tokens = {t.lower() for t in _WORD.findall(line)}
        score = sum(word in tokens for word in words) + 0.25 * sum(word in lowered for word in words)
        if score > best:
            best, best_line = score, number
    if best_line < 0:
        return None
    start, end = max(0, best_line - CONTEXT_LINES), min(len(lines), best_line + CONTEXT_LINES + 1)
    text = "\n".join(f"{n + 1:5d}| {lines[n]}" for n in range(start, end))
    prefix = f"{root.name}/"
    return Snippet(prefix + relative, best_line + 1, text, best + in_path)
