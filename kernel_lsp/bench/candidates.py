"""The candidates of a bench run: every `.py` defining `ModelNew` under a folder, paired with its reference by
kernel_lsp.verify.pairing (header, settings, same file, KernelBench layout), and named by their KernelBench problem.
Their jobs are kernel_lsp.kinds.verify's.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from kernel_lsp.config import Settings
from kernel_lsp.sources import parse_python
from kernel_lsp.verify.pairing import Pairing, ReferenceProblem, find_reference

log = logging.getLogger(__name__)

SKIPPED_DIRS = {"__pycache__", "node_modules", "build", "dist", "venv"}  # and every folder starting with '.'
_PROBLEM_STEM = re.compile(r"^(?:level(\d+)_)?(\d+)_(.+?)(?:_new)?$")
_LEVEL_FOLDER = re.compile(r"^level(\d+)$")


@dataclass(frozen=True)
class Unpaired:
    path: Path
    reason: str


@dataclass(frozen=True)
class ProblemName:
    level: int | None
    problem_id: int | None
    name: str


def find_candidates(folder: Path) -> list[Path]:
    """Every `.py` under `folder` that defines ModelNew, sorted; hidden and build folders are skipped."""
    return [path for path in _python_files(folder) if parse_python(_read(path)).kernelbench.model_new is not None]


def find_problems(folder: Path) -> list[Path]:
    """Every `.py` under `folder` that defines Model and not ModelNew (a KernelBench problem), in KernelBench's
    order: by level folder, then problem id, then name; hidden and build folders are skipped."""
    found = []
    for path in _python_files(folder):
        parts = parse_python(_read(path)).kernelbench
        if parts.model is not None and parts.model_new is None:
            found.append(path)

    def order(path: Path) -> tuple[Any, ...]:
        named = name_of(path)
        return (str(path.parent), named.level or 0, named.problem_id if named.problem_id is not None else 1 << 30,
                named.name)
    return sorted(found, key=order)


def pair_candidates(candidates: list[Path], workspace: Path | None, settings: Settings,
                    kernelbench_roots: list[Path]) -> tuple[list[Pairing], list[Unpaired]]:
    pairs, unpaired = [], []
    for candidate in candidates:
        found = find_reference(candidate, _read(candidate), workspace, settings.verify.references, kernelbench_roots)
        if isinstance(found, Pairing):
            pairs.append(found)
        elif isinstance(found, ReferenceProblem):
            unpaired.append(Unpaired(candidate, f"line {found.line + 1}: {found.message}"))
        else:
            unpaired.append(Unpaired(candidate, "no reference found (no header line, no references setting, no Model "
                                                "in the file, no KernelBench problem of that name under the roots)"))
    return pairs, unpaired


def problem_name(pairing: Pairing) -> ProblemName:
    """Level, id and name from the reference's KernelBench name, else the candidate's, else the candidate's stem."""
    for path in (pairing.reference, pairing.candidate):
        named = name_of(path)
        if named.problem_id is not None:
            return named
    return ProblemName(None, None, pairing.candidate.stem)


def name_of(path: Path) -> ProblemName:
    """Level, id and name from a KernelBench file name ('19_ReLU.py' under level1/, 'level1_19_ReLU.py'), else the
    stem as the name."""
    match = _PROBLEM_STEM.match(path.stem)
    if match is None:
        return ProblemName(None, None, path.stem)
    folder = _LEVEL_FOLDER.match(path.parent.name)
    level = match.group(1) or (folder.group(1) if folder else None)
    return ProblemName(int(level) if level else None, int(match.group(2)), match.group(3))


def _python_files(folder: Path) -> Iterator[Path]:
    """Every `.py` under `folder`, folder by folder in sorted order; hidden and build folders are skipped."""
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(names):
            if name.endswith(".py"):
                yield Path(root) / name


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")
