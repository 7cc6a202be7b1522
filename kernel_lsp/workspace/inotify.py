"""Watching workspace folders with Linux's inotify directly: one watch per folder that is not ignored, none below
`.git`, `node_modules`, build folders or what a `.gitignore` names.

inotify watches one folder per watch, and every watch is a kernel object counted against
`fs.inotify.max_user_watches`. watchdog's recursive observer adds one to every folder below a root, ignored ones
too (2,000 of 2,073 in one workspace); here the ignore rules that prune the scan prune the watches: a folder is
watched when it is not ignored, a new folder as it appears, and after the rules change (`refresh`) the set is made
to match them again.

One thread reads the descriptor and keeps the table of watches (by watch descriptor, the folder's path); events on
ignored paths are dropped there, the others handed to the asyncio loop with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from kernel_lsp.workspace.watch import CHANGED, CREATED, DELETED

log = logging.getLogger(__name__)

_IN_MODIFY, _IN_CLOSE_WRITE = 0x2, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_Q_OVERFLOW, _IN_IGNORED, _IN_ISDIR = 0x4000, 0x8000, 0x40000000
_IN_ONLYDIR, _IN_DONT_FOLLOW, _IN_EXCL_UNLINK = 0x01000000, 0x02000000, 0x04000000
_MASK = (_IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
         | _IN_ONLYDIR | _IN_DONT_FOLLOW | _IN_EXCL_UNLINK)
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
_READ_SIZE = 64 * 1024
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.EACCES)  # a folder removed or closed to us meanwhile: not watched


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "inotify_init1") and hasattr(libc, "inotify_add_watch") else None


_LIBC = _libc()


def available() -> bool:
    """Whether inotify can be used here (Linux with a C library that offers it)."""
    return _LIBC is not None


class InotifyWatcher:
    """Watches `roots` and the folders below them that `ignored(path, True)` keeps; `on_event(path, kind,
    is_directory)` is called on `loop` for each change to a path that is not ignored."""

    def __init__(self, roots: Sequence[Path], ignored: Callable[[Path, bool], bool],
                 on_event: Callable[[Path, str, bool], None], loop: asyncio.AbstractEventLoop) -> None:
        self._roots = list(roots)
        self._ignored = ignored
        self._on_event = on_event
        self._loop = loop
        self._fd = -1
        self._wake: tuple[int, int] | None = None  # a pipe whose write end stops the reading thread
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the table: the reading thread and refresh() both change it
        self._refreshing = threading.Lock()  # one refresh at a time, each with the rules as they are when it runs
        self._folders: dict[int, Path] = {}  # watch descriptor -> the folder it watches
        self._full = False  # the watch limit was met after the start (said once)

    @property
    def watches(self) -> int:
        return len(self._folders)

    def start(self) -> str | None:
        """Starts watching; returns why it could not (None when it watches)."""
        assert _LIBC is not None, "inotify is not available (see available())"
        fd = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            return (f"cannot watch the workspace (inotify: {os.strerror(code)}; see fs.inotify.max_user_instances); "
                    "files changed outside the editor are not seen")
        self._fd = fd
        try:
            for root in self._roots:
                self._watch_tree(root, strict=True)
        except OSError as exc:  # e.g. the watch limit (fs.inotify.max_user_watches)
            self._close()
            return f"cannot watch the workspace ({exc}); files changed outside the editor are not seen"
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._read_loop, name="kernel-lsp-inotify", daemon=True)
        self._thread.start()
        return None

    def stop(self) -> None:
        if self._thread is not None and self._wake is not None:
            os.write(self._wake[1], b"x")
            self._thread.join(timeout=5)
            self._thread = None
        self._close()

    def refresh(self) -> None:
        """The ignore rules changed: folders they now keep are watched, those they now ignore no longer (a walk of
        the kept folders, as the scan's; call it from a worker thread)."""
        with self._refreshing:  # a .gitignore saved twice: the second walk must not end before the first
            if self._fd < 0:
                return
            kept = set(self._watch_tree_each(self._roots))
            with self._lock:
                dropped = [wd for wd, folder in self._folders.items() if folder not in kept]
                for wd in dropped:
                    _LIBC.inotify_rm_watch(self._fd, wd)
                    del self._folders[wd]

    # --- the table ------------------------------------------------------------------------------------------

    def _watch_tree(self, top: Path, strict: bool = False) -> None:
        for _ in self._watch_tree_each([top], strict):
            pass

    def _watch_tree_each(self, tops: Sequence[Path], strict: bool = False) -> Iterator[Path]:
        """Watches each top and the folders below it that are not ignored (links to folders not followed),
        yielding each folder watched. A folder gone meanwhile is skipped; other failures (the watch limit) raise
        when `strict`, else are said once and end the walk."""
        stack = list(reversed(tops))
        while stack:
            folder = stack.pop()
            try:
                if not self._add(folder):
                    continue
            except OSError as exc:
                if strict:
                    raise
                if not self._full:
                    self._full = True
                    log.warning("not watching %s and folders made later: %s", folder, exc)
                return
            yield folder
            try:
                with os.scandir(folder) as listing:
                    below = sorted(Path(entry.path) for entry in listing if _is_folder(entry))
            except OSError:
                continue
            stack.extend(reversed([path for path in below if not self._is_ignored(path, True)]))

    def _add(self, folder: Path) -> bool:
        wd = _LIBC.inotify_add_watch(self._fd, os.fsencode(folder), _MASK)
        if wd < 0:
            code = ctypes.get_errno()
            if code in _GONE:
                return False
            raise OSError(code, f"inotify_add_watch: {os.strerror(code)}", str(folder))
        with self._lock:
            self._folders[wd] = folder  # the same folder again (refresh) gives the same descriptor
        return True

    def _forget_tree(self, top: Path) -> None:
        """A folder moved away: its watches (and those below it) would report under its old path."""
        with self._lock:
            for wd, folder in list(self._folders.items()):
                if folder == top or folder.is_relative_to(top):
                    _LIBC.inotify_rm_watch(self._fd, wd)
                    del self._folders[wd]

    def _close(self) -> None:
        for fd in (self._fd, *(self._wake or ())):
            if fd >= 0:
                os.close(fd)
        self._fd, self._wake = -1, None
        self._folders.clear()

    # --- the reading thread -----------------------------------------------------------------------------------

    def _read_loop(self) -> None:
        assert self._wake is not None
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake[0], select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake[0] in ready:
                return
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                continue
            except OSError as exc:
                log.warning("inotify stopped: %s; files changed outside the editor are no longer seen", exc)
                return
            for wd, mask, name in _events(data):
                try:
                    self._handle(wd, mask, name)
                except Exception:  # an odd path must not end the watching
                    log.exception("handling an inotify event failed")

    def _handle(self, wd: int, mask: int, name: str) -> None:
        if mask & _IN_Q_OVERFLOW:
            log.warning("inotify's queue overflowed: changes made just now may be missed until the files change again")
            return
        if mask & _IN_IGNORED:  # the watch is gone (its folder deleted, or removed here)
            with self._lock:
                self._folders.pop(wd, None)
            return
        folder = self._folders.get(wd)
        if folder is None or not name:
            return  # a watch already dropped, or an event on the folder itself (its parent reports it)
        path = folder / name
        is_dir = bool(mask & _IN_ISDIR)
        if mask & (_IN_CREATE | _IN_MOVED_TO):
            kind = CREATED
        elif mask & (_IN_DELETE | _IN_MOVED_FROM):
            kind = DELETED
        elif is_dir:
            return  # a folder's own change: its files report themselves
        else:
            kind = CHANGED
        if self._is_ignored(path, is_dir):
            return
        if is_dir and kind == CREATED:
            self._watch_tree(path)  # before the loop scans it, so nothing written after that scan is missed
        elif is_dir and mask & _IN_MOVED_FROM:
            self._forget_tree(path)
        try:
            self._loop.call_soon_threadsafe(self._on_event, path, kind, is_dir)
        except RuntimeError:  # the loop is closed: the server is going away
            pass

    def _is_ignored(self, path: Path, is_dir: bool) -> bool:
        try:
            return self._ignored(path, is_dir)
        except Exception:  # an odd path: not watched, not reported
            log.debug("ignore check failed for %s", path, exc_info=True)
            return True


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _events(data: bytes) -> Iterator[tuple[int, int, str]]:
    """(watch descriptor, mask, name) of each event in one read; the name as os.fsdecode gives it."""
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
        offset += _EVENT.size
        name = data[offset:offset + size].split(b"\0", 1)[0]
        offset += size
        yield wd, mask, os.fsdecode(name)
