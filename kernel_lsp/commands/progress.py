"""A long command's progress for a person at a terminal: one live line on stderr (a spinner, what is under way, how
many of how many are done, the time so far: rich's progress display), gone once the work is, so the command's
output reads as before.

Only when stdout and stderr are both a terminal and the output is text: piped or redirected output and
`--format json` get no escape codes (the JSON stays parseable), and there the worker's progress stays the plain
lines on stderr it always was. A compile of a folder or a worker's start-up takes a minute; without the line, a
terminal shows nothing for that minute.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def on_terminal(fmt: str) -> bool:
    """Whether a live line is drawn: text output, stdout and stderr both a terminal."""
    return fmt == "text" and sys.stdout.isatty() and sys.stderr.isatty()


class PlainProgress:
    """No live line (not a terminal, or JSON): the worker's messages as plain lines on stderr, nothing else."""

    def say(self, message: str) -> None:
        """What is under way now; only a live line shows it."""

    def advance(self) -> None:
        """One more item done; only a live line counts them."""

    def note(self, message: str, _fraction: Any = None) -> None:
        """A progress message from the worker (the runner's progress callback)."""
        print(f"  {message}", file=sys.stderr)


class LiveProgress(PlainProgress):
    """The live line: the worker's messages become what it says is under way, rather than lines of their own."""

    def __init__(self, display: Any, task: Any) -> None:
        self._display = display  # rich.progress.Progress
        self._task = task

    def say(self, message: str) -> None:
        self._display.update(self._task, status=message)

    def advance(self) -> None:
        self._display.advance(self._task)

    def note(self, message: str, _fraction: Any = None) -> None:
        self.say(message)


@contextmanager
def command_progress(title: str, fmt: str, total: int | None = None, status: str = "") -> Iterator[PlainProgress]:
    """`title` (e.g. "kernel-lsp check: 6 files") on a live line while the block runs, with `status` until `say`
    replaces it, and "done of total" when a `total` is given; a PlainProgress where no live line is drawn."""
    if not on_terminal(fmt):
        yield PlainProgress()
        return
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False)]
    if total is not None:
        columns.append(MofNCompleteColumn())
    columns += [TimeElapsedColumn(), TextColumn("{task.fields[status]}", markup=False)]
    with Progress(*columns, console=Console(stderr=True), transient=True) as display:
        yield LiveProgress(display, display.add_task(title, total=total, status=status))
