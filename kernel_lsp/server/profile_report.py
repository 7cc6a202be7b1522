"""A ProfileReport's ceilings and a KernelProfile's roofline point as the roofline types the hover card and the
chart need. (An `ncu --csv` export becomes a ProfileReport in kernel_lsp.profile.report, with the CLI's import.)
"""

from __future__ import annotations

from kernel_lsp.contracts.profile_report import KernelProfile, ProfileReport
from kernel_lsp.profile.report import roofline_ceilings, roofline_point
from profilers.roofline import Ceilings, KernelPoint


def ceilings_from(report: ProfileReport) -> Ceilings | None:
    return roofline_ceilings(report.ceilings) if report.ceilings is not None else None


def point_from(profile: KernelProfile) -> KernelPoint | None:
    return roofline_point(profile.point) if profile.point is not None else None
