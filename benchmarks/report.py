"""The table every benchmark prints, and appending it to benchmarks/RESULTS.md."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
from pathlib import Path
from typing import Awaitable, Callable

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


def main(script: str, measure: Callable[[int], Awaitable[list[tuple[str, str, str, str]]]], default_repeat: int,
         machine_extra: Callable[[], str] = lambda: "") -> None:
    """--repeat N and --record for a benchmark script; prints the table, and with --record appends it."""
    parser = argparse.ArgumentParser(prog=script)
    parser.add_argument("--repeat", type=int, default=default_repeat)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    text = table(asyncio.run(measure(args.repeat)))
    print(text)
    if args.record:
        record(script, f"python benchmarks/{script} --repeat {args.repeat} --record", text, machine_extra())
