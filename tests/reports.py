"""Whole VerifyReports for tests that build evaluations by hand: the recorded honest CPU report
(tests/fixtures/reports/verify_cpu_honest.json) with the figures a test cares about merged in, so the agent's
readers, which decode the report (agent/evaluation.py), read what the test set."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.paths import REPORTS

_RECORDED = json.loads((REPORTS / "verify_cpu_honest.json").read_text())


def verify_report(**changes: Any) -> dict[str, Any]:
    """The recorded report's wire dict with `changes` merged in key by key, down nested objects (`timing=
    {"candidate": {"median_ms": 2.0}}` changes that one figure); a list or a value replaces what was there."""
    return _merged(copy.deepcopy(_RECORDED), changes)


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merged(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base
