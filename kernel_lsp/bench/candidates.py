"""The candidates of a bench run and their "verify" jobs.

A candidate is a `.py` defining `ModelNew`; its reference is found by kernel_lsp.verify.pairing (header, settings,
same file, KernelBench layout). `verify_job` builds the job the worker runs (see the "verify" job kind).
"""

from __future__ import annotations

import ast
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.config import Settings
from kernel_lsp.jobs.cache import cache_key
from kernel_lsp.sources import parse_python
from kernel_lsp.sources.cuda import find_includes
from kernel_lsp.verify.pairing import Pairing, ReferenceProblem, _load_sources, find_reference
from kernel_lsp.worker.protocol import Job

log = logging.getLogger(__name__)

SKIPPED_DIRS = {"__pycache__", "node_modules", "build", "dist", "venv"}  # and every folder starting with '.'
# the config keys a caller may set; the job's own keys (candidate, reference, origins) come from the files
VERIFY_OPTIONS = frozenset({"device", "trials", "timedCalls", "warmup", "seed", "tolerances", "baselines",
                            "allowedKernels", "timing", "limits", "allowNetwork"})
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
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(names):
            path = Path(root) / name
            if name.endswith(".py") and parse_python(_read(path)).kernelbench.model_new is not None:
                found.append(path)
    return found


def pair_candidates(candidates: list[Path], workspace: Path | None, settings: Settings,
                    kernelbench_roots: list[Path]) -> tuple[list[Pairing], list[Unpaired]]:
    pairs, unpaired = [], []
    for candidate in candidates:
        found = find_reference(candidate, _read(candidate), workspace, settings.references, kernelbench_roots)
        if isinstance(found, Pairing):
            pairs.append(found)
        elif isinstance(found, ReferenceProblem):
            unpaired.append(Unpaired(candidate, f"line {found.line + 1}: {found.message}"))
        else:
            unpaired.append(Unpaired(candidate, "no reference found (no header line, no references setting, no Model "
                                                "in the file, no KernelBench problem of that name under the roots)"))
    return pairs, unpaired


def verify_options(settings: Settings) -> dict[str, Any]:
    """The "verify" config keys that come from the settings."""
    options: dict[str, Any] = {"device": settings.verify_device, "trials": settings.trials,
                               "timedCalls": settings.timed_calls, "warmup": settings.warmup_calls,
                               "baselines": list(settings.baselines), "allowedKernels": list(settings.allowed_kernels),
                               "allowNetwork": settings.verify_allow_network}
    if settings.tolerances:
        options["tolerances"] = {dtype: dict(t) for dtype, t in settings.tolerances.items()}
    return options


def verify_job(candidate: Path, reference: Path, options: dict) -> Job:
    """The "verify" job for one candidate: its text, its reference's and the files it loads from disk, named
    relative to the candidate's folder (the reference under reference/ when it lives elsewhere)."""
    unknown = set(options) - VERIFY_OPTIONS
    if unknown:
        raise ValueError(f"unknown verify options: {', '.join(sorted(unknown))}")
    folder = candidate.resolve().parent
    text = _read(candidate)
    names = {candidate.resolve(): candidate.name}
    names.setdefault(reference.resolve(), _inside(reference.resolve(), folder) or f"reference/{reference.name}")
    for module in sorted(local_imports(candidate, text)):
        names.setdefault(module, _inside(module, folder))
    for source in sorted(_load_sources(candidate, text)):
        name = _inside(source, folder)
        if name is None:
            log.warning("%s loads %s from outside its folder: the worker reads it at that path", candidate, source)
        elif source.is_file():
            names.setdefault(source, name)
            for header in sorted(local_headers(source, folder)):
                names.setdefault(header, _inside(header, folder))
    source_files = {name: _read(path) for path, name in names.items()}
    config = {**options, "candidate": names[candidate.resolve()], "reference": names[reference.resolve()],
              "origins": {name: str(path) for path, name in names.items()}}
    return Job("verify", source_files, config, cache_key("verify", source_files, config))


def local_imports(candidate: Path, text: str) -> set[Path]:
    """The .py files of modules and packages beside the candidate that it imports (`import helpers`,
    `from kernels.relu import ...`): the job must carry them, or the candidate fails to import on the worker."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    folder = candidate.resolve().parent
    found: set[Path] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops = [node.module.split(".")[0]]
        else:
            continue
        for top in tops:
            if (folder / f"{top}.py").is_file():
                found.add(folder / f"{top}.py")
            elif (folder / top / "__init__.py").is_file():
                found.update(path.resolve() for path in (folder / top).rglob("*.py"))
    found.discard(candidate.resolve())
    return found


def local_headers(source: Path, folder: Path) -> set[Path]:
    """Quoted #includes of a CUDA/C++ source, followed through the headers, that resolve inside `folder`."""
    found: set[Path] = set()
    pending = [source.resolve()]
    while pending:
        current = pending.pop()
        for include in find_includes(_read(current)):
            header = (current.parent / include.path).resolve()
            if include.quoted and header.is_file() and header.is_relative_to(folder) and header not in found:
                found.add(header)
                pending.append(header)
    return found


def problem_name(pairing: Pairing) -> ProblemName:
    """Level, id and name from the reference's KernelBench name, else the candidate's, else the candidate's stem."""
    for path in (pairing.reference, pairing.candidate):
        match = _PROBLEM_STEM.match(path.stem)
        if match is not None:
            folder = _LEVEL_FOLDER.match(path.parent.name)
            level = match.group(1) or (folder.group(1) if folder else None)
            return ProblemName(int(level) if level else None, int(match.group(2)), match.group(3))
    return ProblemName(None, None, pairing.candidate.stem)


def _inside(path: Path, folder: Path) -> str | None:
    return path.relative_to(folder).as_posix() if path.is_relative_to(folder) else None


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")
