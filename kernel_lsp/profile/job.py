"""The "profile" job for one candidate, built from paths (the same file naming as the "verify" job).

Stdlib only, and no torch: the server imports this module.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kernel_lsp.bench.candidates import _inside, _read
from kernel_lsp.jobs.cache import cache_key
from kernel_lsp.verify.pairing import _load_sources
from kernel_lsp.worker.protocol import Job

log = logging.getLogger(__name__)

# the config keys a caller may set; candidate, reference and origins come from the files
PROFILE_OPTIONS = frozenset({"kernels", "sections", "limits", "launchCount", "device", "allowNetwork"})
# device: "cpu" asks for the static profile even where the worker has a GPU; allowNetwork: the candidate's
# processes may open sockets (the verifyAllowNetwork setting, as for verification)


def profile_job(candidate: Path, reference: Path | None, options: dict[str, Any]) -> Job:
    """The "profile" job: the candidate's text, its reference's (None: the candidate defines Model itself, or
    has none) and the files it loads from disk, named relative to the candidate's folder."""
    unknown = set(options) - PROFILE_OPTIONS
    if unknown:
        raise ValueError(f"unknown profile options: {', '.join(sorted(unknown))}")
    names = _file_names(candidate, reference)
    source_files = {name: _read(path) for path, name in names.items()}
    config: dict[str, Any] = {**options, "candidate": names[candidate.resolve()],
                              "origins": {name: str(path) for path, name in names.items()}}
    if reference is not None:
        config["reference"] = names[reference.resolve()]
    return Job("profile", source_files, config, cache_key("profile", source_files, config))


def _file_names(candidate: Path, reference: Path | None) -> dict[Path, str]:
    """Path -> name in the job: the candidate by its file name, the reference under reference/ when it lives
    outside the candidate's folder, and the files the candidate loads (load(sources=[...]), open(...))."""
    folder = candidate.resolve().parent
    names = {candidate.resolve(): candidate.name}
    if reference is not None:
        names.setdefault(reference.resolve(), _inside(reference.resolve(), folder) or f"reference/{reference.name}")
    if candidate.suffix == ".py":
        for source in sorted(_load_sources(candidate, _read(candidate))):
            name = _inside(source, folder)
            if name is None:
                log.warning("%s loads %s from outside its folder: the worker reads it at that path", candidate, source)
            elif source.is_file():
                names.setdefault(source, name)
    return names
