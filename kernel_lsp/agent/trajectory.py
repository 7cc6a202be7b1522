"""Trajectories: every optimization pass as JSON lines, one event a line, for replay and as training data.

An event is {"t": seconds since the writer opened, "kind": one of KINDS, ...fields}. Each line is flushed as it is
written, so a pass that is killed keeps every event before the kill. An "evaluation" event carries the candidate's
"source" (what --replay re-verifies). API keys never reach the file: every string has anything shaped like an
Anthropic key replaced, and the value of any field named like a credential (x-api-key, authorization, api_key) is
replaced whole.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

KINDS = ("start", "environment", "plan", "message", "compaction", "tool_call", "tool_result", "evaluation", "score",
         "spend", "end")
KEY_PATTERN = re.compile(r"sk-ant-[A-Za-z0-9_\-]*")
CREDENTIAL_FIELD = re.compile(r"api[-_]?key|authorization|x-api-key|secret|token$", re.IGNORECASE)
REDACTED = "[redacted]"


def redact(value: Any) -> Any:
    """A copy of value (dicts, lists, strings) with API keys and credential fields replaced by REDACTED."""
    if isinstance(value, str):
        return KEY_PATTERN.sub(REDACTED, value)
    if isinstance(value, dict):
        return {key: REDACTED if is_credential_field(key, item) else redact(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact(item) for item in value]
    return value


def is_credential_field(key: Any, item: Any) -> bool:
    # counters such as input_tokens are numbers; only a string under a credential-like name can be a key
    return isinstance(key, str) and isinstance(item, str) and bool(CREDENTIAL_FIELD.search(key))


def new_pass_id() -> str:
    """'20250102T030405Z-1a2b3c': sorts by start time, unique across passes started in the same second."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


class TrajectoryWriter:
    """Appends one pass's events to DIRECTORY/PASS_ID.jsonl (the directory is created)."""

    def __init__(self, directory: str | Path, pass_id: str | None = None) -> None:
        self.pass_id = pass_id or new_pass_id()
        self.path = Path(directory) / f"{self.pass_id}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._opened = time.monotonic()

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Write and flush one event; returns it as written (redacted)."""
        if kind not in KINDS:
            raise ValueError(f"unknown trajectory event kind {kind!r}; expected one of {', '.join(KINDS)}")
        if kind == "evaluation" and "source" not in fields:
            raise ValueError("an evaluation event needs the candidate's source (replay re-verifies it)")
        event = redact({"t": round(time.monotonic() - self._opened, 3), "kind": kind, **fields})
        self._file.write(json.dumps(event, ensure_ascii=False, default=str) + "\n")
        self._file.flush()
        return event

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_trajectory(path: str | Path) -> list[dict[str, Any]]:
    """The events of a trajectory file; a cut-off last line (the pass was killed mid-write) is left out."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    events = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a trajectory event: {exc}") from exc
    return events


def candidates_of(path: str | Path) -> list[str]:
    """The distinct candidate sources a recorded pass evaluated, in the order it first evaluated them."""
    evaluated = (event["source"] for event in read_trajectory(path) if event.get("kind") == "evaluation")
    return list(dict.fromkeys(evaluated))
