"""ProfileReports (the profiling contract's plain dicts) as the server reads them: made from an `ncu --csv --page
details` export on this machine, and turned back into the roofline types the hover card and the chart need.

Torch-free, like kernel_lsp.profile.report, whose KernelProfile shaping the import shares with the worker's job.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kernel_lsp.profile.report import launch_profile, ncu_ceilings, profile_report
from profilers.ncu import SPEED_OF_LIGHT, KernelLaunch, parse_details_csv, parse_raw_csv, with_raw
from profilers.roofline import Ceilings, KernelPoint

NO_LAUNCHES = "the file holds no kernel launches: export it with 'ncu --import REPORT --csv --page details'"
NO_CEILINGS = "no roofline ceilings: import the raw page too ('ncu --import REPORT --csv --page raw')"


def imported_report(details_csv: str, raw_csv: str | None = None) -> dict[str, Any]:
    """A ProfileReport (source "import-csv") from a details export, and its raw page when given (the raw page
    holds the DRAM byte counters and the device limits the roofline ceilings come from)."""
    launches = parse_details_csv(details_csv)
    if raw_csv is not None:
        launches = with_raw(launches, parse_raw_csv(raw_csv))
    ceilings = ncu_ceilings(launches, None)
    problems = [NO_LAUNCHES] if not launches else [NO_CEILINGS] if ceilings is None else []
    kernels = [launch_profile(launch, ceilings) for launch in longest_launch_per_kernel(launches)]
    return profile_report("import-csv", kernels, gpu=ceilings.gpu if ceilings else None, ceilings=ceilings,
                          problems=problems)


def longest_launch_per_kernel(launches: list[KernelLaunch]) -> list[KernelLaunch]:
    """One launch per kernel base name: the one that took longest, which is where the time goes."""
    chosen: dict[str, KernelLaunch] = {}
    for launch in launches:
        kept = chosen.get(launch.base_name)
        if kept is None or _duration(launch) > _duration(kept):
            chosen[launch.base_name] = launch
    return list(chosen.values())


def _duration(launch: KernelLaunch) -> float:
    return launch.value(SPEED_OF_LIGHT, "Duration") or 0.0


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
