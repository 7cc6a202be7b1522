"""`$/progress` for one long-running task: create the token, begin (cancellable), report, end.

The client's cancel button cancels the task that began the progress.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Callable

from lsprotocol import types

log = logging.getLogger(__name__)


class WorkProgress:
    def __init__(self, progress: Any, supported: Callable[[], bool]) -> None:
        self._progress = progress  # pygls Progress (window/workDoneProgress/create, $/progress)
        self._supported = supported

    async def begin(self, kind: str, title: str, message: str) -> str | None:
        """A token for the current task's progress, or None when the client shows none."""
        if not self._supported():
            return None
        token = f"kernel-lsp/{kind}/{uuid.uuid4().hex}"
        try:
            await asyncio.shield(self._progress.create_async(token))  # a cancelled task still takes the reply
        except Exception as exc:  # a client that refuses the token still gets the result
            log.info("window/workDoneProgress/create failed: %s", exc)
            return None
        self._progress.begin(token, types.WorkDoneProgressBegin(title=title, message=message, cancellable=True))
        task = asyncio.current_task()
        future = self._progress.tokens.get(token)
        if future is not None and task is not None:
            future.add_done_callback(lambda f: f.cancelled() and task.get_loop().call_soon_threadsafe(task.cancel))
        return token

    def report(self, token: str | None, message: str, fraction: float | None) -> None:
        if token is not None:
            percentage = None if fraction is None else max(0, min(100, int(fraction * 100)))
            self._progress.report(token, types.WorkDoneProgressReport(message=message, percentage=percentage))

    def end(self, token: str | None, message: str) -> None:
        if token is not None:
            self._progress.end(token, types.WorkDoneProgressEnd(message=message))
            self._progress.tokens.pop(token, None)
