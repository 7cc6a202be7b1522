"""ProfileReports (the profiling contract's plain dicts) turned back into the roofline types the hover card and the
chart need. (An `ncu --csv` export becomes a ProfileReport in kernel_lsp.profile.report, with the CLI's import.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from profilers.roofline import Ceilings, KernelPoint

def ceilings_from(report: dict[str, Any]) -> Ceilings | None:
    return _from_dict(Ceilings, report.get("ceilings"))


def point_from(profile: dict[str, Any]) -> KernelPoint | None:
    return _from_dict(KernelPoint, profile.get("point"))


def _from_dict(cls: type, data: dict[str, Any] | None):
    """A frozen dataclass from its to_dict() output, which adds derived keys the constructor does not take."""
    if not data:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError:  # a report from another version with fields missing: no chart rather than a failed hover
        return None
