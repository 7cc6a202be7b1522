"""The files a job carries to the worker, gathered once for every job kind (verify and profile alike).

A candidate's job carries its own text, its reference's, the local modules it imports (`import helpers`,
`from kernels.relu import ...`), the sources it builds with `cpp_extension.load(sources=[...])` and the headers
those include with quotes, each named relative to the candidate's folder (the reference under `reference/` when it
lives elsewhere). Texts come from disk or from `texts`, which wins: an editor's unsaved buffer, an agent's candidate
that is never written to disk (its path is where it would live, so that its relative imports resolve).

Stdlib and kernel_lsp.sources only: the server, the CLI and the agent build jobs without torch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.sources import find_includes, parse_python

log = logging.getLogger(__name__)
REFERENCE_FOLDER = "reference/"  # where a reference from outside the candidate's folder goes in the job
JOB_KEYS = frozenset({"candidate", "reference", "origins"})  # what a job's config holds of its files, beside options


@dataclass(frozen=True)
class CarriedFiles:
    texts: dict[str, str]  # name in the job -> text
    origins: dict[str, str]  # name in the job -> its path on the client's machine (findings point there)
    candidate: str  # the candidate's name in the job
    reference: str | None  # the reference's, None when the job has none

    def config(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """A job's config: the options' entries, the candidate's name, the origins, and the reference's name
        where there is one (a profile or sanitize job may have none)."""
        config: dict[str, Any] = {**options, "candidate": self.candidate, "origins": self.origins}
        if self.reference is not None:
            config["reference"] = self.reference
        return config


class Texts:
    """Reads a path from the overlay (unsaved or never-saved texts, by resolved path) or else from disk."""

    def __init__(self, overlay: Mapping[Path, str] | None = None) -> None:
        self._overlay = {Path(path).resolve(): text for path, text in (overlay or {}).items()}

    def exists(self, path: Path) -> bool:
        return path.resolve() in self._overlay or path.is_file()

    def read(self, path: Path) -> str:
        """The text (undecodable bytes replaced); OSError when it is neither in the overlay nor on disk."""
        found = self._overlay.get(path.resolve())
        return found if found is not None else path.read_bytes().decode("utf-8", errors="replace")


def gather_files(candidate: Path, reference: Path | None, texts: Mapping[Path, str] | None = None) -> CarriedFiles:
    """Everything the candidate's job carries (see the module's docstring). A loaded source outside the candidate's
    folder is not carried (the worker reads it at its path, which works only for a local worker): logged."""
    source = Texts(texts)
    candidate = candidate.resolve()
    folder = candidate.parent
    text = source.read(candidate)
    names = {candidate: candidate.name}
    if reference is not None:
        names.setdefault(reference.resolve(), _inside(reference.resolve(), folder)
                         or f"{REFERENCE_FOLDER}{reference.name}")
    if candidate.suffix == ".py":
        for module in sorted(local_imports(candidate, text, source)):
            names.setdefault(module, _inside(module, folder))
        for loaded in sorted(load_sources(candidate, text)):
            name = _inside(loaded, folder)
            if name is None:
                log.warning("%s loads %s from outside its folder: the worker reads it at that path", candidate, loaded)
            elif source.exists(loaded):
                names.setdefault(loaded, name)
                for header in sorted(local_headers(loaded, folder, source)):
                    names.setdefault(header, _inside(header, folder))
    elif candidate.suffix in (".cu", ".cuh"):  # a standalone program: its own headers build with it
        for header in sorted(local_headers(candidate, folder, source)):
            names.setdefault(header, _inside(header, folder))
    return CarriedFiles(texts={name: source.read(path) for path, name in names.items()},
                        origins={name: str(path) for path, name in names.items()},
                        candidate=names[candidate],
                        reference=names[reference.resolve()] if reference is not None else None)


def load_sources(candidate: Path, text: str) -> set[Path]:
    """The resolved files of every cpp_extension.load(sources=[...]) call; relative names are from the candidate's
    folder."""
    return {(candidate.parent / Path(name).expanduser()).resolve()
            for extension in parse_python(text).extensions if extension.kind == "load"
            for name in extension.source_files}


def local_imports(candidate: Path, text: str, source: Texts | None = None) -> set[Path]:
    """The .py files of modules and packages beside the candidate that it imports: the job must carry them, or
    the candidate fails to import on the worker."""
    source = source or Texts()
    folder = candidate.resolve().parent
    found: set[Path] = set()
    for top in sorted(parse_python(text).imported):  # the parse the other parts use (kept; a big one elsewhere)
        if source.exists(folder / f"{top}.py"):
            found.add((folder / f"{top}.py").resolve())
        elif source.exists(folder / top / "__init__.py"):
            found.update(path.resolve() for path in (folder / top).rglob("*.py"))
    found.discard(candidate.resolve())
    return found


def local_headers(loaded: Path, folder: Path, source: Texts | None = None) -> set[Path]:
    """Quoted #includes of a CUDA/C++ source, followed through the headers, that resolve inside `folder`."""
    source = source or Texts()
    found: set[Path] = set()
    pending = [loaded.resolve()]
    while pending:
        current = pending.pop()
        try:
            text = source.read(current)
        except OSError:
            continue
        for include in find_includes(text):
            header = (current.parent / include.path).resolve()
            if include.quoted and header.is_relative_to(folder) and source.exists(header) and header not in found:
                found.add(header)
                pending.append(header)
    return found


def _inside(path: Path, folder: Path) -> str | None:
    return path.relative_to(folder).as_posix() if path.is_relative_to(folder) else None
