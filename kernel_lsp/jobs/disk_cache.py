"""The result cache on disk: one msgpack file, loaded at start, so a restart republishes without recomputing.

The file is one msgpack stream: a header map {"format": FORMAT, "version": VERSION, "written": unix time,
"entries": N}, then N records [key, value], least recently used first. Keys are the callers' sha256 hex
digests (content-addressed: a key names everything its result depends on); values are plain msgpack dicts.
Records stand alone, so a truncated file still yields every whole record before the cut.

Loading never raises: a missing file is an empty cache; an unreadable, corrupt, truncated or foreign file
(another magic, another VERSION) keeps what could be read safely and says why in LoadReport.problem, and the
next flush rewrites it. Writing is atomic (temp file beside the cache, fsync, os.replace, fsync the folder),
so a crash mid-write leaves the old file readable. Before writing, flush merges the file another server
process on the same workspace (or `kernel-lsp check`) may have written: its entries this process neither holds
nor deleted are kept, the newer ones in memory win. The read, merge and write of a flush hold an exclusive lock
on a file beside the cache (`<name>.lock`, fcntl.flock), so two processes flushing at once cannot both merge the
same old file and lose each other's entries; where the lock cannot be taken (a file system without locks), the
flush goes ahead without it and says so once. The cache is bounded by entries (least recently used evicted on put) and by
encoded bytes (least recently used dropped on flush). Stdlib and msgpack only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
from typing import BinaryIO

import msgpack

try:
    import fcntl
except ImportError:  # not on Windows: flushes there go unlocked
    fcntl = None  # type: ignore[assignment]

FORMAT = "kernel-lsp-results"  # magic in the header
VERSION = 1  # bump when an entry's layout changes; a file of another version is ignored (rebuilt)

log = logging.getLogger(__name__)

# what decoding a damaged or foreign stream may raise (UnicodeDecodeError and the msgpack format errors are
# ValueErrors; an unhashable map key is a TypeError; BufferFull / OutOfData are UnpackExceptions)
_DECODE_ERRORS = (msgpack.UnpackException, ValueError, TypeError, OverflowError, RecursionError, MemoryError)
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)


@dataclass
class LoadReport:
    entries: int  # entries loaded
    problem: str | None  # None, or one sentence: why the file was not (fully) usable


@dataclass
class _Contents:
    """What reading the file gave: whole records in file order, and why reading stopped early (if it did)."""

    records: list[tuple[str, bytes]]
    problem: str | None = None


class DiskCache:
    """Key -> dict, LRU-bounded, persisted to one msgpack file by flush(); thread-safe (one lock).

    flush() does file I/O while holding the lock: call it off the event loop (asyncio.to_thread).
    """

    def __init__(self, path: Path, max_entries: int = 20_000, max_bytes: int = 256 * 2**20) -> None:
        self._path = Path(path)
        self._max_entries = max(0, int(max_entries))
        self._max_bytes = max(0, int(max_bytes))
        self._records: OrderedDict[str, bytes] = OrderedDict()  # key -> packed [key, value], LRU first
        self._deleted: dict[str, None] = {}  # keys deleted here: the merge must not bring them back
        self._dirty = False
        self._lock = threading.RLock()
        self._unlocked_said = False  # the file lock could not be taken, and a warning said so

    @property
    def path(self) -> Path:
        return self._path

    def __len__(self) -> int:
        return len(self._records)

    def load(self) -> LoadReport:
        """Read the file into memory (entries already held here win); never raises."""
        with self._lock:
            self._remove_stale_temp_files()
            try:
                contents = self._read()
            except Exception as error:  # a safety net: load's contract is never to raise
                log.exception("reading the results cache %s failed", self._path)
                contents = _Contents([], f"results cache {self._path} could not be read ({error!r}); rebuilding")
            loaded = self._merge_older(contents.records)
            self._evict_beyond_count()
            entries = sum(1 for key in set(loaded) if key in self._records)
            if contents.problem is not None:
                self._dirty = True  # rewrite a valid file at the next flush
                log.warning("%s", contents.problem)
            return LoadReport(entries, contents.problem)

    def get(self, key: str) -> dict | None:
        """The value stored under key (a fresh copy), marked recently used; None when absent."""
        with self._lock:
            record = self._records.get(key) if isinstance(key, str) else None
            if record is None:
                return None
            self._records.move_to_end(key)
        return msgpack.unpackb(record, raw=False)[1]

    def put(self, key: str, value: dict) -> None:
        """Store value under key as most recently used. A non-str key, a value that is not a msgpack-safe
        dict (str map keys; lists, ints, floats, str, bytes, None, bool; tuples come back as lists) or one
        too large for max_bytes is skipped with a log line, never raised."""
        if not isinstance(key, str) or not isinstance(value, dict):
            log.warning("results cache: skipped an entry with key %r and a %s value (want str and dict)",
                        type(key).__name__, type(value).__name__)
            return
        try:
            record = msgpack.packb([key, value], use_bin_type=True)
            msgpack.unpackb(record, raw=False)  # what is stored must load: e.g. no int map keys
        except _ENCODE_ERRORS + (msgpack.UnpackException,) as error:
            log.warning("results cache: skipped entry %s, its value is not msgpack-safe (%s)", key, error)
            return
        if len(record) + _header_size(1) > self._max_bytes:
            log.warning("results cache: skipped entry %s, %d bytes exceed the cache's %d", key, len(record),
                        self._max_bytes)
            return
        with self._lock:
            self._records[key] = record
            self._records.move_to_end(key)
            self._deleted.pop(key, None)
            self._evict_beyond_count()
            self._dirty = True

    def delete(self, key: str) -> None:
        """Forget key here and in the file at the next flush (the merge does not bring it back)."""
        if not isinstance(key, str):
            return
        with self._lock:
            self._records.pop(key, None)
            self._deleted[key] = None
            while len(self._deleted) > max(self._max_entries, 1):  # bounded: forget the oldest deletions
                del self._deleted[next(iter(self._deleted))]
            self._dirty = True

    def flush(self) -> bool:
        """Write the cache if anything changed since the last write; whether it wrote. Merges the file on
        disk first. An OSError is logged and returns False (still dirty, so the next flush tries again)."""
        with self._lock:
            if not self._dirty:
                return False
            with self._file_lock():
                return self._merge_and_write()

    def _merge_and_write(self) -> bool:
        try:
            contents = self._read()
        except Exception:  # a damaged file only means nothing to merge
            log.exception("reading the results cache %s before writing failed", self._path)
            contents = _Contents([])
        if contents.problem is not None:
            log.info("%s", contents.problem)
        self._merge_older(contents.records)
        self._evict_beyond_count()
        self._evict_beyond_bytes()
        header = msgpack.packb({"format": FORMAT, "version": VERSION, "written": time.time(),
                                "entries": len(self._records)}, use_bin_type=True)
        try:
            self._write_atomically([header, *self._records.values()])
        except OSError as error:
            log.warning("could not write the results cache %s: %s", self._path, error)
            return False
        self._dirty = False
        return True

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Exclusive across processes for the block: flock on `<cache>.lock` beside the cache."""
        descriptor = None
        if fcntl is not None:
            try:
                _make_folders(self._path.parent)
                descriptor = os.open(self._path.with_name(self._path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            except OSError as error:
                if descriptor is not None:
                    os.close(descriptor)
                    descriptor = None
                if not self._unlocked_said:
                    self._unlocked_said = True
                    log.warning("results cache %s: cannot lock it (%s); flushing without the lock", self._path,
                                error)
        try:
            yield
        finally:
            if descriptor is not None:
                os.close(descriptor)  # closing releases the lock

    # reading

    def _read(self) -> _Contents:
        """The whole records in the file, oldest first, and why reading stopped early if it did."""
        where = f"results cache {self._path}"
        try:
            with open(self._path, "rb") as stream:
                return self._read_stream(stream, where)
        except FileNotFoundError:
            return _Contents([])  # no file yet: an empty cache, not a problem
        except OSError as error:
            return _Contents([], f"{where} could not be read ({error.strerror or error}); rebuilding")

    def _read_stream(self, stream: BinaryIO, where: str) -> _Contents:
        unpacker = msgpack.Unpacker(stream, raw=False, max_buffer_size=max(self._max_bytes, 2**20))
        try:
            header = unpacker.unpack()
        except msgpack.OutOfData:
            empty = stream.tell() == 0
            return _Contents([], f"{where} is {'empty' if empty else 'cut inside its header'}; rebuilding")
        except _DECODE_ERRORS:
            return _Contents([], f"{where} does not start with a msgpack header; rebuilding")
        problem = _header_problem(header)
        if problem is not None:
            return _Contents([], f"{where} {problem}; rebuilding")
        expected = header["entries"]
        records: list[tuple[str, bytes]] = []
        while len(records) < expected:
            try:
                record = unpacker.unpack()
            except msgpack.OutOfData:
                return _Contents(records, f"{where} was truncated (read {len(records)} of {expected} "
                                          f"entries); rebuilding")
            except OSError as error:
                return _Contents(records, f"{where} could not be read past entry {len(records)} of "
                                          f"{expected} ({error.strerror or error}); rebuilding")
            except _DECODE_ERRORS as error:
                return _Contents(records, f"{where} is corrupt after entry {len(records)} of {expected} "
                                          f"({type(error).__name__}); kept the entries before it, rebuilding")
            if not (isinstance(record, list) and len(record) == 2 and isinstance(record[0], str)
                    and isinstance(record[1], dict)):
                return _Contents(records, f"{where} has a malformed entry after entry {len(records)} of "
                                          f"{expected}; kept the entries before it, rebuilding")
            try:
                records.append((record[0], msgpack.packb(record, use_bin_type=True)))
            except _ENCODE_ERRORS:
                return _Contents(records, f"{where} has an entry that cannot be stored again after entry "
                                          f"{len(records)} of {expected}; kept the entries before it, "
                                          f"rebuilding")
        try:
            unpacker.unpack()
        except msgpack.OutOfData:
            return _Contents(records)
        except _DECODE_ERRORS:
            pass  # undecodable trailing bytes: the same problem as decodable ones
        return _Contents(records, f"{where} has data after its {expected} entries; rebuilding")

    def _merge_older(self, records: list[tuple[str, bytes]]) -> list[str]:
        """Put records read from the file before (older than) everything in memory, except keys held or
        deleted here; the keys taken."""
        taken = OrderedDict((key, record) for key, record in records
                            if key not in self._records and key not in self._deleted)
        if taken:
            taken.update(self._records)
            self._records = taken
        return [key for key, _ in records if key in taken]

    # bounds

    def _evict_beyond_count(self) -> None:
        while len(self._records) > self._max_entries:
            self._records.popitem(last=False)

    def _evict_beyond_bytes(self) -> None:
        budget = self._max_bytes - _header_size(len(self._records))  # the header only shrinks as entries go
        size = sum(len(record) for record in self._records.values())
        while self._records and size > budget:
            size -= len(self._records.popitem(last=False)[1])

    # writing

    def _write_atomically(self, chunks: list[bytes]) -> None:
        """Write chunks to a temp file beside the cache, then rename it over the cache: readers (and a crash
        at any point) see the old file or the new one, never half of one."""
        folder = self._path.parent
        _make_folders(folder)
        temp = folder / f".{self._path.name}.{os.getpid()}.tmp"
        descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(descriptor, view):]
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            os.replace(temp, self._path)
        except BaseException:
            try:
                temp.unlink(missing_ok=True)
            except OSError:
                pass
            raise
        _sync_folder(folder)

    def _remove_stale_temp_files(self) -> None:
        """Remove temp files a crashed process (same cache, a pid no longer running) left beside the cache."""
        prefix, suffix = f".{self._path.name}.", ".tmp"
        try:
            names = os.listdir(self._path.parent)
        except OSError:
            return
        for name in names:
            pid = name[len(prefix):-len(suffix)] if name.startswith(prefix) and name.endswith(suffix) else ""
            if pid.isdigit() and int(pid) != os.getpid() and not _process_exists(int(pid)):
                try:
                    os.unlink(self._path.parent / name)
                except OSError:
                    pass


def _header_problem(header: object) -> str | None:
    """Why a decoded header is not this format and version (None when it is); phrased after the path."""
    if not isinstance(header, dict):
        return "does not start with a header map"
    if header.get("format") != FORMAT:
        return "is not a kernel-lsp results file"
    version = header.get("version")
    if version != VERSION or isinstance(version, bool):
        return f"has format version {version!r}, this server reads version {VERSION}"
    entries = header.get("entries")
    if not isinstance(entries, int) or isinstance(entries, bool) or entries < 0:
        return f"has an invalid entry count {entries!r} in its header"
    return None


def _header_size(entries: int) -> int:
    return len(msgpack.packb({"format": FORMAT, "version": VERSION, "written": time.time(), "entries": entries},
                             use_bin_type=True))


def _make_folders(folder: Path) -> None:
    """Create folder and its missing parents, each private (0o700); existing ones are left as they are."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for each in reversed(missing):
        try:
            os.mkdir(each, 0o700)
        except FileExistsError:
            pass


def _sync_folder(folder: Path) -> None:
    """fsync the folder so the rename itself survives a power cut; not every system allows it, and the file is
    already in place, so a failure here is only logged."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as error:
        log.debug("could not open %s to fsync it: %s", folder, error)
        return
    try:
        os.fsync(descriptor)
    except OSError as error:
        log.debug("could not fsync %s: %s", folder, error)
    finally:
        os.close(descriptor)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists but is not ours (PermissionError)
    return True
