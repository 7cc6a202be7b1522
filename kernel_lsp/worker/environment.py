"""What the worker's machine has: package versions (without importing them) and the GPU's facts."""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_summary() -> dict[str, Any] | None:
    """The GPU's facts for the client's status line, or None where NVML sees no GPU."""
    from profilers.nvml import NvmlUnavailable, device_facts

    try:
        facts = device_facts()
    except NvmlUnavailable:
        return None
    facts["otherProcesses"] = [p for p in facts.get("otherProcesses", []) if p["pid"] != os.getpid()]
    return facts
