"""The two models of a verification: files imported as modules, and the reference's weights given to the candidate.

Both models get the same weights: the reference's state_dict where names and shapes match, else the same seed
for both constructions.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

WEIGHTS_SEED = 1234
INSTALLED_MARKERS = ("site-packages", "dist-packages")
SYSTEM_PREFIXES = ("/usr/", "/lib", "/opt/", "/etc/")


def load_module(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, Path(path).resolve())
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def installed_file(path: str) -> bool:
    """A file of Python's, of an installed package or of the system: never a build of the candidate's own (its
    load_inline or load extensions live in the build caches or beside it)."""
    pythons = tuple(f"{prefix}/" for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    return path.startswith(SYSTEM_PREFIXES + pythons) or any(marker in path for marker in INSTALLED_MARKERS)


def load_weights(ref_state: dict[str, torch.Tensor], candidate: torch.nn.Module) -> str:
    """Loads the reference's weights (its state_dict) into the candidate where names and shapes match."""
    cand_state = candidate.state_dict()
    shared = {k: v for k, v in ref_state.items() if k in cand_state and cand_state[k].shape == v.shape}
    if not ref_state:
        return "no weights"
    if shared:
        candidate.load_state_dict(shared, strict=False)
        return f"state_dict: {len(shared)} of {len(ref_state)} tensors loaded"
    return "same seed for both constructions (no state_dict names matched)"
