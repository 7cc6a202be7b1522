"""Per-document job scheduling: a newer request replaces (and cancels) the older one for the same document.

At most one job per document runs at a time: a new job waits for the cancelled one to finish unwinding
(its compiler process killed) before it starts. A semaphore bounds jobs across documents.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

log = logging.getLogger(__name__)


class DocumentScheduler:
    def __init__(self, max_parallel: int) -> None:
        self._slots = asyncio.Semaphore(max(1, max_parallel))
        self._tasks: dict[str, asyncio.Task] = {}
        self._latest: dict[str, int | None] = {}
        self._started: dict[str, int | None] = {}  # key -> version whose job is past its debounce

    def latest_version(self, key: str) -> int | None:
        return self._latest.get(key)

    def is_current(self, key: str, version: int | None) -> bool:
        return key in self._latest and self._latest[key] == version

    def is_started(self, key: str, version: int | None) -> bool:
        """A job for exactly this version is past its debounce and still running."""
        return self.is_current(key, version) and key in self._tasks and self._started.get(key, object()) == version

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
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        self._started[key] = self._latest.get(key)
        async with self._slots:
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception:  # a checker's bug must not take the server down
                log.exception("job for %s failed", key)

    def _forget(self, key: str, task: asyncio.Task) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
