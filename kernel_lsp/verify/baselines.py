"""Cached reference timings (eager and torch.compile) and the GPU state recorded with every timing.

A baseline is keyed by everything that changes its number: the reference's text, the device, the torch
version and the timing settings (timed calls, warm-up, input seed and shapes, L2 flush). Each one is a JSON
file written atomically, so a crash mid-write never leaves a half file; an unreadable or corrupt file is a
miss, never an error. Imports stay light: this runs in the sandbox child before torch may be needed.

A baseline is cached only when the judge was fit to measure it (verify/schedule.py): a miss is where the caller
starts timing, so `get` puts the judge's scheduling back as it started and checks it; `put` checks it again and
writes nothing when either check found it disturbed (reniced, pinned to fewer CPUs, its CPU-time limits lowered).
The timing is still the caller's to report for this verification; `schedule[kind]` says why it was not cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from kernel_lsp.verify.schedule import judge_schedule, restore_schedule

BASELINE_KINDS = ("eager", "compile")


def write_json_atomically(path: Path, value: object) -> None:
    """Write to a temp file beside path, then rename over it: readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as temp_file:
            json.dump(value, temp_file, sort_keys=True)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object stored at path, or None when the file is missing, unreadable or not a JSON object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class BaselineCache:
    """Reference timings under directory/baselines, one JSON file per (key, kind)."""

    def __init__(self, directory: Path) -> None:
        self.folder = Path(directory) / "baselines"
        self.before: dict[str, str | None] = {}  # kind -> the judge's scheduling when a miss started timing it
        self.schedule: dict[str, str] = {}  # kind -> why its fresh timing was not cached (the judge was disturbed)

    @staticmethod
    def key(reference_text: str, device_name: str, torch_version: str, settings: dict) -> str:
        identity = {"reference": reference_text, "device": device_name, "torch": torch_version,
                    "settings": settings}
        # sorted keys make the digest independent of dict order; repr keeps odd setting values hashable
        canonical = json.dumps(identity, sort_keys=True, default=repr)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def get(self, key: str, kind: str) -> dict | None:
        """The stored timing, or None: a miss, after which the caller times the baseline, so the judge's
        scheduling is put back as it started and checked here (put checks it again)."""
        timing = self.stored(key, kind)
        if timing is None:
            self.before[kind] = fit_to_measure()
        return timing

    def stored(self, key: str, kind: str) -> dict | None:
        stored = read_json_object(self.path(key, kind))
        if stored is None or stored.get("key") != key or stored.get("kind") != kind:
            return None
        timing = stored.get("timing")
        return timing if isinstance(timing, dict) else None

    def put(self, key: str, kind: str, timing_dict: dict) -> None:
        """Store a fresh timing, unless the judge was not fit to measure when its miss was read (`get`) or is
        not now: then nothing is written and `schedule[kind]` says why."""
        self.path(key, kind)  # a bad key or kind is a programming error, whatever the schedule
        problem = self.before.pop(kind, None) or judge_schedule()
        if problem is not None:
            self.schedule[kind] = problem
            return
        try:
            write_json_atomically(self.path(key, kind), {"key": key, "kind": kind, "timing": timing_dict})
        except OSError:
            return  # a cache that cannot be written only costs timing the baseline again next time

    def path(self, key: str, kind: str) -> Path:
        if kind not in BASELINE_KINDS:
            raise ValueError(f"baseline kind must be one of {', '.join(BASELINE_KINDS)}, got {kind!r}")
        if not key.isalnum():
            raise ValueError(f"baseline key must be a hex digest from BaselineCache.key, got {key!r}")
        return self.folder / f"{key}-{kind}.json"


def fit_to_measure() -> str | None:
    """Before a measurement that may be cached: put the judge's scheduling back as it started, then None when
    it is fit to measure, else why not (what could not be put back)."""
    restore_schedule()
    return judge_schedule()


def gpu_state(device: object) -> dict[str, Any]:
    """NVML facts (clocks, power, temperature, clock-event reasons, other processes) for a CUDA device."""
    device_type, _, index_text = str(device).partition(":")
    if device_type != "cuda":
        return {"unavailable": f"timed on {device_type}, which has no GPU state"}
    cuda_index = int(index_text) if index_text else current_cuda_index()
    nvml_index = nvml_index_of(cuda_index)
    if nvml_index is None:
        return {"unavailable": "CUDA_VISIBLE_DEVICES names GPUs by UUID, so the NVML index is unknown"}
    try:
        from profilers.nvml import device_facts

        facts = device_facts(nvml_index)
    except Exception as exc:  # the state is a record beside the numbers: reading it must never fail a run
        return {"unavailable": str(exc) or type(exc).__name__}
    return without_this_process(facts)


def current_cuda_index() -> int:
    import torch

    return torch.cuda.current_device()


def nvml_index_of(cuda_index: int) -> int | None:
    """NVML counts every GPU; CUDA counts only those CUDA_VISIBLE_DEVICES lists, in its order."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return cuda_index
    entries = [entry.strip() for entry in visible.split(",")]
    if not all(entry.isdigit() for entry in entries) or cuda_index >= len(entries):
        return None
    return int(entries[cuda_index])


def without_this_process(facts: dict[str, Any]) -> dict[str, Any]:
    """The verifier itself is on the GPU; only other processes can disturb the timing."""
    processes = facts.get("otherProcesses")
    if isinstance(processes, list):
        facts = {**facts, "otherProcesses": [p for p in processes if p.get("pid") != os.getpid()]}
    return facts
