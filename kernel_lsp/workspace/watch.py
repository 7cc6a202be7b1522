"""Changes on disk: the server's own watcher of the workspace folders (inotify.py on Linux, else a watchdog
observer), and the coalescing both it and the client's workspace/didChangeWatchedFiles feed, so that a burst (a
`git checkout` of 500 files) becomes one batch.

Watching threads never touch the server's state: each event is handed to the asyncio loop with
call_soon_threadsafe, and the Coalescer there merges events per path (the last kind wins, except that a file
created and then deleted inside one batch is simply gone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

CREATED, CHANGED, DELETED = "created", "changed", "deleted"
QUIET_S = 0.2  # a batch is handed on after this long without a new event
MAX_WAIT_S = 1.5  # ... or this long after its first event, however busy the disk is


class Coalescer:
    """Merges file events per path and hands each batch to `flush` once the events pause."""

    def __init__(self, flush: Callable[[dict[Path, str]], None], quiet_s: float = QUIET_S,
                 max_wait_s: float = MAX_WAIT_S) -> None:
        self._flush = flush
        self._quiet_s = quiet_s
        self._max_wait_s = max_wait_s
        self._batch: dict[Path, str] = {}
        self._first: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.batches = 0  # handed on so far (the workspace summary shows it)

    def add(self, path: Path, kind: str) -> None:
        before = self._batch.get(path)
        if kind == DELETED and before == CREATED:
            self._batch[path] = DELETED  # created and removed again: report the removal (a no-op for unknown files)
        elif kind == CHANGED and before in (CREATED, DELETED):
            self._batch[path] = CREATED if before == CREATED else CHANGED
        else:
            self._batch[path] = kind
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._first is None:
            self._first = now
        if self._timer is not None:
            self._timer.cancel()
        delay = min(self._quiet_s, max(0.0, self._first + self._max_wait_s - now))
        self._timer = loop.call_later(delay, self.flush_now)

    def flush_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._batch, self._first = self._batch, {}, None
        if batch:
            self.batches += 1
            try:
                self._flush(batch)
            except Exception:  # a bug in the consumer must not stop watching
                log.exception("handling %d changed files failed", len(batch))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._batch.clear()


class FolderWatcher:
    """A watchdog observer over `roots` (recursive); events on ignored paths are dropped in the observer thread.

    Where watches are per folder (inotify) watchdog adds one to every folder, ignored ones too, so the server uses
    this only where inotify.py cannot run; FSEvents (macOS) and ReadDirectoryChangesW (Windows) watch a tree as
    one."""

    def __init__(self, roots: Sequence[Path], ignored: Callable[[Path, bool], bool],
                 on_event: Callable[[Path, str, bool], None], loop: asyncio.AbstractEventLoop) -> None:
        self._roots = list(roots)
        self._ignored = ignored
        self._on_event = on_event  # (path, kind, is_directory), called on the loop
        self._loop = loop
        self._observer = None

    def start(self) -> str | None:
        """Starts watching; returns why it could not (None when it watches)."""
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError as exc:
            return f"watchdog is not installed ({exc}); files changed outside the editor are not seen"
        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:  # observer thread
                watcher._event(event)

        observer = Observer()
        try:
            for root in self._roots:
                observer.schedule(Handler(), str(root), recursive=True)
            observer.daemon = True
            observer.start()
        except OSError as exc:  # e.g. the inotify watch limit (fs.inotify.max_user_watches)
            return f"cannot watch the workspace ({exc}); files changed outside the editor are not seen"
        self._observer = observer
        return None

    def refresh(self) -> None:
        """The ignore rules changed: nothing to redo, the observer watches every folder and the rules filter the
        events as they come."""

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None

    def _event(self, event) -> None:
        kind = {"created": CREATED, "modified": CHANGED, "closed": CHANGED, "deleted": DELETED,
                "moved": "moved"}.get(event.event_type)
        if kind is None:
            return  # opened, closed_no_write
        is_dir = bool(event.is_directory)
        if kind == CHANGED and is_dir:
            return  # a folder's own mtime: its files report themselves
        pairs = [(event.src_path, DELETED), (event.dest_path, CREATED)] if kind == "moved" else [(event.src_path, kind)]
        for raw, what in pairs:
            path = Path(raw if isinstance(raw, str) else raw.decode(errors="replace"))
            try:
                if self._ignored(path, is_dir):
                    continue
            except Exception:  # an odd path must not kill the observer thread
                log.debug("ignore check failed for %s", path, exc_info=True)
                continue
            try:
                self._loop.call_soon_threadsafe(self._on_event, path, what, is_dir)
            except RuntimeError:  # the loop is closed: the server is going away
                return
