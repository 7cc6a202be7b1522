"""The table every benchmark prints, and appending it to benchmarks/RESULTS.md."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import sys
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


def main(script: str, measure: Callable[..., Awaitable[list[tuple[str, str, str, str]]]], default_repeat: int,
         machine_extra: Callable[[], str] = lambda: "",
         add_options: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """--repeat N and --record for a benchmark script; prints the table, and with --record appends it. A script
    with options of its own adds them with `add_options`; its `measure` then gets the parsed namespace too."""
    parser = argparse.ArgumentParser(prog=script)
    parser.add_argument("--repeat", type=int, default=default_repeat)
    parser.add_argument("--record", action="store_true")
    if add_options is not None:
        add_options(parser)
    args = parser.parse_args()
    rows = asyncio.run(measure(args.repeat, args) if add_options is not None else measure(args.repeat))
    text = table(rows)
    print(text)
    if args.record:
        given = [word for word in sys.argv[1:] if word != "--record"]
        repeat = [] if any(word.startswith("--repeat") for word in given) else [f"--repeat {args.repeat}"]
        record(script, " ".join([f"python benchmarks/{script}", *repeat, *given, "--record"]), text,
               machine_extra())
