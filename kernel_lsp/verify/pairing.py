"""What a candidate is checked against: its reference file, found in one of four ways.

In order of precedence:
  header       a `# kernel-lsp: reference=PATH` comment (or `// ...` outside .py files) in the first 10 lines;
               PATH is relative to the candidate's folder, absolute, or starts with `~`.
  settings     the `references` setting: candidate path or fnmatch pattern -> reference path, both relative to
               the workspace; `{stem}` in the reference is the candidate's stem without a trailing `_new`.
  same-file    the file defines both `Model` and `ModelNew`.
  kernelbench  a `.py` defining `ModelNew`, named like a KernelBench problem `<root>/level<N>/<id>_<Name>.py`.

Stdlib only, and no torch: the server imports this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from kernel_lsp.jobs.files import load_sources
from kernel_lsp.sources import parse_python

HEADER_LINES = 10  # the reference comment must sit in the first lines, where a reader looks for it
_HASH_HEADER = re.compile(r"^\s*#\s*kernel-lsp:\s*reference\s*=\s*(.*?)\s*$")
_SLASH_HEADER = re.compile(r"^\s*(?:#|//)\s*kernel-lsp:\s*reference\s*=\s*(.*?)\s*$")
_PROBLEM_FILE = re.compile(r"^(\d+)_(.+)\.py$")
_CANDIDATE_STEM = re.compile(r"^(?:level(\d+)_)?(\d+)_(.+)$")
_LEVEL_FOLDER = re.compile(r"^level(\d+)$")
_NEW_SUFFIX = "_new"


@dataclass(frozen=True)
class Pairing:
    candidate: Path
    reference: Path
    how: str  # 'same-file' | 'header' | 'settings' | 'kernelbench'
    detail: str  # for a hover or log line: where the pairing came from


@dataclass(frozen=True)
class ReferenceProblem:
    message: str
    line: int  # 0-based line of the candidate the diagnostic belongs on


@dataclass(frozen=True)
class _ProblemName:
    level: int | None
    id: int
    names: tuple[str, ...]  # the stem's name part, and the same without a trailing `_new`


def find_reference(candidate: Path, text: str, workspace: Path | None, settings_pairs: dict[str, str],
                   kernelbench_roots: list[Path]) -> Pairing | ReferenceProblem | None:
    """The candidate's reference by the first way that names one; a named reference that is missing is a problem."""
    found = _from_header(candidate, text)
    if found is None and workspace is not None:
        found = _from_settings(candidate, workspace, settings_pairs)
    if found is None and candidate.suffix == ".py":
        found = _from_python(candidate, text, kernelbench_roots)
    return found


def is_reference(path: Path, text: str) -> bool:
    """The file is a problem's reference (Model and no ModelNew): one passed as a candidate is told what it is, not
    asked to define the Model it has."""
    if path.suffix != ".py":
        return False
    parts = parse_python(text).kernelbench
    return parts.model is not None and parts.model_new is None


def _from_header(candidate: Path, text: str) -> Pairing | ReferenceProblem | None:
    header = _HASH_HEADER if candidate.suffix == ".py" else _SLASH_HEADER  # `//` is not a comment in Python
    for line, content in enumerate(text.splitlines()[:HEADER_LINES]):
        match = header.match(content)
        if match is None:
            continue
        if not match.group(1):
            return ReferenceProblem("kernel-lsp: reference= names no file", line)
        reference = candidate.parent / Path(match.group(1)).expanduser()  # an absolute PATH replaces the folder
        if not reference.is_file():
            return ReferenceProblem(f"reference file not found: {reference}", line)
        return Pairing(candidate, reference, "header", f"line {line + 1}: {match.group(0).strip()}")
    return None


def _from_settings(candidate: Path, workspace: Path,
                   settings_pairs: dict[str, str]) -> Pairing | ReferenceProblem | None:
    try:
        relative = candidate.resolve().relative_to(workspace.resolve()).as_posix()
    except ValueError:  # a file outside the workspace is named by no setting
        return None
    for pattern, template in settings_pairs.items():
        if not fnmatchcase(relative, PurePosixPath(pattern).as_posix()):
            continue
        reference = workspace / template.replace("{stem}", _without_new(candidate.stem))
        if not reference.is_file():
            return ReferenceProblem(f"reference file not found: {reference} (setting references: "
                                    f"{pattern!r} -> {template!r})", 0)
        return Pairing(candidate, reference, "settings", f"references: {pattern!r} -> {template!r}")
    return None


def _from_python(candidate: Path, text: str, kernelbench_roots: list[Path]) -> Pairing | None:
    parts = parse_python(text).kernelbench
    if parts.model_new is None:  # not a candidate (a KernelBench problem file itself, or any other module)
        return None
    if parts.model is not None:
        return Pairing(candidate, candidate, "same-file", "Model and ModelNew in one file")
    reference = _kernelbench_problem(candidate, kernelbench_roots)
    if reference is None:
        return None
    return Pairing(candidate, reference, "kernelbench", f"KernelBench {reference.parent.name}/{reference.name}")


def _kernelbench_problem(candidate: Path, roots: list[Path]) -> Path | None:
    """The one problem file the candidate's name points at; None when none does, or several do without a level."""
    wanted = _problem_name(candidate)
    if wanted is None:
        return None
    matches = [problem for level, problem_id, name, problem in _problem_files(roots)
               if problem_id == wanted.id and name in wanted.names and wanted.level in (None, level)]
    return matches[0] if len(matches) == 1 else None


def _problem_name(candidate: Path) -> _ProblemName | None:
    match = _CANDIDATE_STEM.match(candidate.stem)
    if match is None:
        return None
    level_prefix, problem_id, name = match.groups()
    folder = _LEVEL_FOLDER.match(candidate.parent.name)
    level = level_prefix or (folder.group(1) if folder else None)
    names = tuple(dict.fromkeys((name, _without_new(name))))  # a problem's own name might end in `_new`
    return _ProblemName(int(level) if level else None, int(problem_id), names)


def _problem_files(roots: list[Path]) -> list[tuple[int, int, str, Path]]:
    """(level, id, name, path) of every `<root>/level<N>/<id>_<Name>.py`."""
    found = []
    for root in roots:
        for folder in sorted(root.glob("level*")):
            level = _LEVEL_FOLDER.match(folder.name)
            if level is None or not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.py")):
                problem = _PROBLEM_FILE.match(path.name)
                if problem is not None:
                    found.append((int(level.group(1)), int(problem.group(1)), problem.group(2), path))
    return found


def _without_new(stem: str) -> str:
    return stem.removesuffix(_NEW_SUFFIX)


def files_to_reverify(saved: Path, candidates: dict[Path, str], *, workspace: Path | None = None,
                      settings_pairs: dict[str, str] | None = None,
                      kernelbench_roots: list[Path] | None = None) -> list[Path]:
    """The candidates (other than `saved`) that build `saved` with cpp_extension.load(sources=[...]) or whose
    reference is `saved`; the keyword arguments are find_reference's, for references not named in the file."""
    saved = saved.resolve()
    stale = []
    for candidate, text in candidates.items():
        if candidate.resolve() == saved:
            continue  # saving a candidate verifies it already
        if saved in load_sources(candidate, text) or _reference_of(
                candidate, text, workspace, settings_pairs or {}, kernelbench_roots or []) == saved:
            stale.append(candidate)
    return stale


def _reference_of(candidate: Path, text: str, workspace: Path | None, settings_pairs: dict[str, str],
                  kernelbench_roots: list[Path]) -> Path | None:
    found = find_reference(candidate, text, workspace, settings_pairs, kernelbench_roots)
    return found.reference.resolve() if isinstance(found, Pairing) else None
