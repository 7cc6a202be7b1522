"""The VerifyReport of an evaluation record, typed.

An evaluation (agent/tools.py `verify`'s answer, kept on its node) is a JSON record: the trajectory writes it, and
later passes and resumed campaigns read it back from disk. So it keeps the report encoded, and every reader in the
agent reads the report through `report_of`, which decodes it (contracts.codec) and keeps the last decodes: no
reader of the agent walks the encoded dict. A record whose report does not fit this version's contract (one written
by another version) reads as having none, as a record without a report does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from kernel_lsp.contracts.codec import ContractError, decode_verify_report
from kernel_lsp.contracts.verify_report import Timing, VerifyReport

KEPT = 512  # decoded reports kept, by the encoded dict's identity (a pass holds tens of nodes, a campaign's at once)
_decoded: OrderedDict[int, tuple[object, VerifyReport | None]] = OrderedDict()


def report_of(evaluation: Mapping[str, Any] | None) -> VerifyReport | None:
    """The evaluation's VerifyReport; None when it has none (a compile error, an unavailable verdict) or it is in
    a form this version does not read."""
    wire = (evaluation or {}).get("report")
    if not isinstance(wire, Mapping):
        return None
    kept = _decoded.get(id(wire))
    if kept is not None and kept[0] is wire:
        _decoded.move_to_end(id(wire))
        return kept[1]
    try:
        report = decode_verify_report(wire)
    except ContractError:
        report = None
    typed = report if isinstance(report, VerifyReport) else None
    _decoded[id(wire)] = (wire, typed)  # the dict is held too: its id is not reused while it is kept
    if len(_decoded) > KEPT:
        _decoded.popitem(last=False)
    return typed


def candidate_timing(evaluation: Mapping[str, Any] | None) -> Timing | None:
    """The candidate's timing by the judge's clock, where it was timed."""
    report = report_of(evaluation)
    return report.timing.candidate if report is not None and report.timing is not None else None


def eager_speedup(evaluation: Mapping[str, Any] | None) -> float | None:
    report = report_of(evaluation)
    return report.speedup.get("eager") if report is not None else None


def device_of(evaluation: Mapping[str, Any] | None) -> str | None:
    """Where the candidate ran (cuda, cpu), or None without a report."""
    report = report_of(evaluation)
    return report.device if report is not None else None
