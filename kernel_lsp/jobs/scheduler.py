"""Per-document job scheduling: a newer request replaces (and cancels) the older one for the same document.

At most one job per document runs at a time: a new job waits for the cancelled one to finish unwinding
(its compiler process killed) before it starts. Slots bound the jobs across documents; a free slot goes to the
waiting job whose document matters most now (`Priority`: the active document, then visible, open, closed),
asked when the slot frees, so a document that becomes active while its job waits moves to the front.
Compile jobs have their own slots: GPU work (verification, profiling) never holds one, so it cannot starve them;
the static profile of a `.cu`, which runs nvcc in the server, takes one (`slot`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Awaitable, Callable

log = logging.getLogger(__name__)


class Priority(enum.IntEnum):
    ACTIVE = 0  # the document the user is editing
    VISIBLE = 1  # shown in an editor
    OPEN = 2  # open, not shown
    CLOSED = 3  # a workspace file that is not open


class PrioritySlots:
    """A semaphore whose next free slot goes to the waiter of the lowest (priority, arrival)."""

    def __init__(self, limit: int, priority_of: Callable[[str], int]) -> None:
        self._free = max(1, limit)
        self._priority_of = priority_of
        self._waiters: list[tuple[int, str, asyncio.Future]] = []
        self._arrival = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, key: str) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        waiter = (next(self._arrival), key, future)
        self._waiters.append(waiter)
        try:
            await future
        except asyncio.CancelledError:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif future.done() and not future.cancelled():
                self.release()  # granted just as it was cancelled: hand the slot on
            raise

    def release(self) -> None:
        while self._waiters:
            chosen = min(self._waiters, key=lambda w: (self._priority_of(w[1]), w[0]))
            self._waiters.remove(chosen)
            if not chosen[2].done():
                chosen[2].set_result(None)
                return
        self._free += 1


class DocumentScheduler:
    def __init__(self, max_parallel: int, priority_of: Callable[[str], int] = lambda key: Priority.OPEN) -> None:
        self._slots = PrioritySlots(max_parallel, priority_of)
        self._tasks: dict[str, asyncio.Task] = {}
        self._latest: dict[str, int | None] = {}
        self._started: dict[str, int | None] = {}  # key -> version whose job is past its debounce

    def is_current(self, key: str, version: int | None) -> bool:
        return key in self._latest and self._latest[key] == version

    def is_started(self, key: str, version: int | None) -> bool:
        """A job for exactly this version is past its debounce and still running."""
        return self.is_current(key, version) and key in self._tasks and self._started.get(key, object()) == version

    def is_pending(self, key: str) -> bool:
        """A job for this key is waiting or running."""
        return key in self._tasks

    @property
    def pending(self) -> int:
        return len(self._tasks)

    def submit(self, key: str, version: int | None, delay_s: float, job: Callable[[], Awaitable[None]]) -> asyncio.Task:
        previous = self._tasks.get(key)
        if previous is not None and not previous.done():
            previous.cancel()
        self._latest[key] = version
        self._started.pop(key, None)
        task = asyncio.ensure_future(self._run(key, previous, delay_s, job))
        self._tasks[key] = task
        task.add_done_callback(lambda t, k=key: self._forget(k, t))
        return task

    @contextlib.asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        """One of the parallel slots, queued by `key`'s priority: what each document job holds while it runs, and
        what work outside them takes (a static profile), so one limit bounds the compilers the server runs."""
        await self._slots.acquire(key)
        try:
            yield
        finally:
            self._slots.release()

    def cancel(self, key: str) -> None:
        task = self._tasks.pop(key, None)
        self._latest.pop(key, None)
        self._started.pop(key, None)
        if task is not None:
            task.cancel()

    async def drain(self) -> None:
        """Wait until no job is pending (used by the CLI and by shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def _run(self, key: str, previous: asyncio.Task | None, delay_s: float,
                   job: Callable[[], Awaitable[None]]) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
            # let go of it: a cancelled task keeps its CancelledError, whose traceback holds the task's frame and,
            # through it, the task before: held here, every version superseded while typing stayed alive with its
            # text (issue 43: 2 KiB a change, more as the text grows)
            previous = None
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        self._started[key] = self._latest.get(key)
        async with self.slot(key):
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception:  # a checker's bug must not take the server down
                log.exception("job for %s failed", key)

    def _forget(self, key: str, task: asyncio.Task) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
