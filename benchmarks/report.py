"""The table every benchmark prints, and appending it to benchmarks/RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def table(rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["| measure | median | target | |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def record(script: str, command: str, text: str, machine_extra: str = "") -> None:
    head = (f"\n## {script}, {datetime.date.today()}\n\n"
            f"Machine: {platform.node()}, {platform.machine()}, {len(os.sched_getaffinity(0))} cores"
            f"{'; ' + machine_extra if machine_extra else ''}; `{command}`.\n\n")
    with open(RESULTS, "a") as f:
        f.write(head + text + "\n")
