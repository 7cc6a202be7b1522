"""The on-disk result cache: round trips, damaged files read as far as they are whole, bounds, the merge
with another process's writes, and atomic writes that leave the old file when they fail."""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from kernel_lsp.jobs import disk_cache
from kernel_lsp.jobs.disk_cache import FORMAT, VERSION, DiskCache, LoadReport

ROOT = Path(__file__).resolve().parents[2]


def key(n: int) -> str:
    return hashlib.sha256(f"inputs {n}".encode()).hexdigest()


def value(n: int) -> dict:
    return {"findings": [{"code": "ptxas-resources", "line": n, "message": f"uses {n} registers",
                          "ratio": n / 3, "data": None, "ok": n % 2 == 0}],
            "stamps": [["/w/kernel.cuh", 1_700_000_000_000_000_000 + n, 4096]], "blob": bytes([n % 256]) * 3}


def header(entries: object, **changes: object) -> bytes:
    fields = {"format": FORMAT, "version": VERSION, "written": 1.5, "entries": entries}
    fields.update(changes)
    return msgpack.packb(fields)


def record(n: int) -> bytes:
    return msgpack.packb([key(n), value(n)])


def leftovers(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".tmp"))


def filled(path, count: int, **limits: int) -> DiskCache:
    cache = DiskCache(path, **limits)
    for n in range(count):
        cache.put(key(n), value(n))
    return cache


def test_entries_put_and_flushed_load_back_in_a_new_instance(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    cache = filled(path, 5)
    assert cache.path == path and len(cache) == 5
    assert cache.flush() is True
    assert cache.flush() is False  # nothing changed since
    assert leftovers(tmp_path) == []

    again = DiskCache(path)
    assert again.load() == LoadReport(entries=5, problem=None)
    assert len(again) == 5
    assert [again.get(key(n)) for n in range(5)] == [value(n) for n in range(5)]
    assert again.get(key(99)) is None


def test_get_returns_a_copy_that_the_caller_may_change(tmp_path) -> None:
    cache = filled(tmp_path / "results.msgpack", 1)
    got = cache.get(key(0))
    got["findings"].clear()
    assert cache.get(key(0)) == value(0)


def test_a_missing_file_is_an_empty_cache_without_a_problem(tmp_path) -> None:
    cache = DiskCache(tmp_path / "not" / "yet" / "results.msgpack")
    assert cache.load() == LoadReport(entries=0, problem=None)
    assert len(cache) == 0
    assert cache.flush() is False  # nothing to write, and no folder made for nothing
    assert not (tmp_path / "not").exists()


def test_missing_folders_are_created_private(tmp_path) -> None:
    path = tmp_path / "cache" / "kernel-lsp" / "results.msgpack"
    assert filled(path, 1).flush() is True
    assert (os.stat(tmp_path / "cache").st_mode & 0o777) == 0o700
    assert (os.stat(tmp_path / "cache" / "kernel-lsp").st_mode & 0o777) == 0o700
    assert DiskCache(path).load().entries == 1


def test_non_str_keys_and_unsafe_values_are_skipped_without_a_crash(tmp_path, caplog) -> None:
    path = tmp_path / "results.msgpack"
    cache = DiskCache(path)
    with caplog.at_level(logging.WARNING, logger=disk_cache.__name__):
        cache.put(b"\x00" * 32, value(1))  # type: ignore[arg-type]
        cache.put(7, value(1))  # type: ignore[arg-type]
        cache.put(key(2), ["not", "a", "dict"])  # type: ignore[arg-type]
        cache.put(key(3), {"x": object()})
        cache.put(key(4), {"nested": {5: "int map key"}})  # packs, but would not load back
        cache.get(7)  # type: ignore[arg-type]
        cache.delete(None)  # type: ignore[arg-type]
    assert len(cache) == 0 and len(caplog.records) == 5
    cache.put(key(6), {"tuple": (1, 2)})
    assert cache.flush() is True
    again = DiskCache(path)
    assert again.load() == LoadReport(entries=1, problem=None)
    assert again.get(key(6)) == {"tuple": [1, 2]}


def test_a_truncated_file_keeps_every_whole_entry_before_the_cut(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    filled(path, 4).flush()
    whole = path.read_bytes()
    head = len(header(4))
    sizes = [len(record(n)) for n in range(4)]
    ends = [head + sum(sizes[:i + 1]) for i in range(4)]  # where record i ends
    assert ends[-1] == len(whole)
    cuts = {1: 0, head - 1: 0, head: 0, head + 1: 0, head + sizes[0] // 2: 0, ends[0]: 1, ends[0] + 3: 1,
            ends[1] + sizes[2] // 2: 2, ends[2]: 3, len(whole) - 1: 3}
    for cut, whole_entries in cuts.items():
        path.write_bytes(whole[:cut])
        cache = DiskCache(path)
        report = cache.load()
        assert report.entries == whole_entries, cut
        assert report.problem is not None and str(path) in report.problem, cut
        if cut >= head:
            assert f"read {whole_entries} of 4 entries" in report.problem
        else:
            assert "header" in report.problem
        assert [cache.get(key(n)) for n in range(whole_entries)] == [value(n) for n in range(whole_entries)]
        assert cache.get(key(whole_entries)) is None
        assert cache.flush() is True  # the problem makes the next flush rewrite a whole file
        assert DiskCache(path).load() == LoadReport(entries=whole_entries, problem=None)


@pytest.mark.parametrize(("contents", "words"), [
    (b"", "is empty"),
    (b"\xc1\xc1\xc1 not msgpack at all", "does not start with a msgpack header"),
    (b"\xff" * 64, "header map"),  # -1, -1, ...
    (msgpack.packb(["format", FORMAT, "version", VERSION]) + record(1), "header map"),
    (msgpack.packb("kernel-lsp-results"), "header map"),
    (header(1, format="someone-else") + record(1), "not a kernel-lsp results file"),
    (header(1, version=VERSION + 1) + record(1), f"format version {VERSION + 1}"),
    (header(1, version=True) + record(1), "format version True"),
    (header(1, version=str(VERSION)) + record(1), "format version"),
    (header(-1), "invalid entry count"),
    (header("1") + record(1), "invalid entry count"),
])
def test_a_file_that_is_not_this_format_is_reported_and_rewritten(tmp_path, contents, words) -> None:
    path = tmp_path / "results.msgpack"
    path.write_bytes(contents)
    cache = DiskCache(path)
    report = cache.load()
    assert report.entries == 0 and len(cache) == 0
    assert report.problem is not None and words in report.problem and str(path) in report.problem
    assert cache.flush() is True
    assert DiskCache(path).load() == LoadReport(entries=0, problem=None)
    assert next(msgpack.Unpacker(io.BytesIO(path.read_bytes())))["format"] == FORMAT


@pytest.mark.parametrize(("bad", "words"), [
    (msgpack.packb([key(9), ["findings"]]), "malformed entry after entry 2 of 4"),
    (msgpack.packb([9, value(9)]), "malformed entry"),
    (msgpack.packb({"key": key(9), "value": value(9)}), "malformed entry"),
    (msgpack.packb([key(9), value(9), "extra"]), "malformed entry"),
    (msgpack.packb([key(9), {1: "int map key"}]), "corrupt after entry 2 of 4"),
    (b"\xc1", "corrupt after entry 2 of 4"),
    (b"\x92\xd9\x03\xff\xfe\xfd\x80", "corrupt"),  # [invalid utf-8 str, {}]
])
def test_a_malformed_entry_ends_loading_and_keeps_the_entries_before_it(tmp_path, bad, words) -> None:
    path = tmp_path / "results.msgpack"
    path.write_bytes(header(4) + record(0) + record(1) + bad + record(3))
    cache = DiskCache(path)
    report = cache.load()
    assert report.entries == 2 and words in report.problem
    assert cache.get(key(0)) == value(0) and cache.get(key(1)) == value(1) and cache.get(key(3)) is None
    assert cache.flush() is True
    assert DiskCache(path).load() == LoadReport(entries=2, problem=None)


def test_data_after_the_last_entry_is_a_problem_but_the_entries_stay(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    path.write_bytes(header(2) + record(0) + record(1) + record(2))
    cache = DiskCache(path)
    report = cache.load()
    assert report.entries == 2 and "data after its 2 entries" in report.problem
    assert cache.get(key(2)) is None
    assert cache.flush() is True
    assert DiskCache(path).load() == LoadReport(entries=2, problem=None)


def test_a_folder_where_the_file_should_be_is_a_problem_not_a_crash(tmp_path, caplog) -> None:
    path = tmp_path / "results.msgpack"
    path.mkdir()
    cache = DiskCache(path)
    report = cache.load()
    assert report.entries == 0 and "could not be read" in report.problem
    cache.put(key(1), value(1))
    with caplog.at_level(logging.WARNING, logger=disk_cache.__name__):
        assert cache.flush() is False
    assert "could not write the results cache" in caplog.text
    assert leftovers(tmp_path) == []


def test_the_least_recently_used_entries_go_beyond_max_entries(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    cache = filled(path, 3, max_entries=3)
    assert cache.get(key(0)) == value(0)  # 0 is now the most recently used; 1 the least
    cache.put(key(3), value(3))
    assert len(cache) == 3
    assert cache.get(key(1)) is None
    assert all(cache.get(key(n)) == value(n) for n in (2, 0, 3))  # least recently used now: 2
    assert cache.flush() is True
    assert DiskCache(path).load().entries == 3

    small = DiskCache(path, max_entries=2)  # a smaller bound keeps the most recent entries of the file
    assert small.load().entries == 2
    assert small.get(key(2)) is None and small.get(key(0)) == value(0) and small.get(key(3)) == value(3)  # written in LRU order


def test_the_least_recently_used_entries_go_when_the_file_would_exceed_max_bytes(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    each = len(record(0))
    assert all(len(record(n)) == each for n in range(6))
    limit = len(header(6)) + 4 * each + each // 2  # room for four entries and a half
    cache = filled(path, 6, max_bytes=limit)
    assert len(cache) == 6  # the byte bound applies when writing
    cache.get(key(0))
    assert cache.flush() is True
    assert os.path.getsize(path) <= limit
    assert len(cache) == 4
    assert [n for n in range(6) if cache.get(key(n)) is not None] == [0, 3, 4, 5]
    again = DiskCache(path)
    assert again.load() == LoadReport(entries=4, problem=None)
    assert again.get(key(1)) is None and again.get(key(0)) == value(0)


def test_an_entry_larger_than_max_bytes_is_not_kept(tmp_path) -> None:
    cache = DiskCache(tmp_path / "results.msgpack", max_bytes=200)
    cache.put(key(0), {"big": "x" * 500})
    cache.put(key(1), {"small": 1})
    assert len(cache) == 1 and cache.get(key(0)) is None


def test_flush_merges_what_another_process_wrote_and_memory_wins(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    first, second = DiskCache(path), DiskCache(path)
    assert first.load() == second.load() == LoadReport(entries=0, problem=None)
    first.put(key(0), value(0))
    first.put(key(1), value(1))
    assert first.flush() is True
    second.put(key(1), {"newer": True})
    second.put(key(2), value(2))
    assert second.flush() is True
    assert second.get(key(0)) == value(0)  # merged from the file into memory too

    third = DiskCache(path)
    assert third.load() == LoadReport(entries=3, problem=None)
    assert third.get(key(0)) == value(0)
    assert third.get(key(1)) == {"newer": True}
    assert third.get(key(2)) == value(2)

    first.put(key(3), value(3))  # first still holds its older key(1); its memory wins for what it holds
    assert first.flush() is True
    assert DiskCache(path).load().entries == 4


def test_a_deleted_entry_does_not_come_back_from_the_file(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    writer = filled(path, 3)
    assert writer.flush() is True

    cache = DiskCache(path)
    assert cache.load().entries == 3
    cache.delete(key(1))
    assert cache.get(key(1)) is None
    assert cache.flush() is True
    assert DiskCache(path).load().entries == 2

    writer.put(key(5), value(5))  # another process, still holding key(1), writes it back
    assert writer.flush() is True
    cache.put(key(6), value(6))
    assert cache.flush() is True  # this process deleted key(1): its merge leaves it out
    assert cache.get(key(1)) is None
    reread = DiskCache(path)
    reread.load()
    assert reread.get(key(1)) is None and reread.get(key(5)) == value(5) and reread.get(key(6)) == value(6)

    cache.put(key(1), {"recomputed": True})  # putting it again undoes the deletion
    assert cache.flush() is True
    reread = DiskCache(path)
    reread.load()
    assert reread.get(key(1)) == {"recomputed": True}


def test_delete_before_load_keeps_the_entry_out(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    filled(path, 2).flush()
    cache = DiskCache(path)
    cache.delete(key(0))
    assert cache.load().entries == 1 and cache.get(key(0)) is None


def test_a_write_that_fails_half_way_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch, caplog) -> None:
    path = tmp_path / "results.msgpack"
    filled(path, 2).flush()
    old = path.read_bytes()

    cache = DiskCache(path)
    cache.load()
    for n in range(2, 40):
        cache.put(key(n), value(n))
    real_write = os.write
    calls = []
    temp_sizes = []

    def disk_full_half_way(descriptor: int, data) -> int:
        calls.append(len(data))
        if len(calls) <= 10:  # the header and nine entries
            return real_write(descriptor, data)
        if len(calls) == 11:
            return real_write(descriptor, bytes(data)[:len(data) // 2])  # a short write, then the disk is full
        temp_sizes.append(os.fstat(descriptor).st_size)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full_half_way)
    with caplog.at_level(logging.WARNING, logger=disk_cache.__name__):
        assert cache.flush() is False
    monkeypatch.undo()
    assert len(calls) == 12 and temp_sizes and temp_sizes[0] > len(old)  # the temp file was partly written
    assert "No space left on device" in caplog.text
    assert path.read_bytes() == old
    assert leftovers(tmp_path) == []
    assert DiskCache(path).load() == LoadReport(entries=2, problem=None)

    assert cache.flush() is True  # still dirty: the next flush tries again
    assert DiskCache(path).load() == LoadReport(entries=40, problem=None)


def test_a_failed_rename_is_logged_returns_false_and_is_retried(tmp_path, monkeypatch, caplog) -> None:
    path = tmp_path / "results.msgpack"
    cache = filled(path, 3)

    def refuse(*arguments: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with caplog.at_level(logging.WARNING, logger=disk_cache.__name__):
        assert cache.flush() is False
    monkeypatch.undo()
    assert "Permission denied" in caplog.text
    assert not path.exists() and leftovers(tmp_path) == []
    assert cache.flush() is True
    assert DiskCache(path).load().entries == 3


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores permissions")
def test_flush_into_a_read_only_folder_returns_false_and_logs(tmp_path, caplog) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    path = folder / "results.msgpack"
    filled(path, 1).flush()
    old = path.read_bytes()
    cache = filled(path, 3)
    folder.chmod(0o500)
    try:
        with caplog.at_level(logging.WARNING, logger=disk_cache.__name__):
            assert cache.flush() is False
            assert cache.flush() is False  # still dirty: it tries again
        assert caplog.text.count("could not write the results cache") == 2
        assert path.read_bytes() == old and leftovers(folder) == []
    finally:
        folder.chmod(0o700)
    assert cache.flush() is True


def test_load_removes_temp_files_that_a_crashed_process_left(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    filled(path, 1).flush()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    stale = tmp_path / f".results.msgpack.{finished.pid}.tmp"
    stale.write_bytes(header(5) + record(0))  # a crash mid-write: half a file under the temp name
    running = tmp_path / f".results.msgpack.{os.getppid()}.tmp"  # a live process's write in progress
    running.write_bytes(b"")
    other = tmp_path / ".other.msgpack.1.tmp"
    other.write_bytes(b"")
    assert DiskCache(path).load() == LoadReport(entries=1, problem=None)
    assert not stale.exists() and running.exists() and other.exists()


WRITER = """
import sys
from kernel_lsp.jobs import disk_cache
from tests.unit.test_disk_cache import key, value

path, writer, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if len(sys.argv) > 4:
    disk_cache.fcntl = None  # the flushes without the file lock, to see that the test can fail
cache = disk_cache.DiskCache(path)
for n in range(rounds):
    cache.put(key(writer * 1000 + n), value(n))
    assert cache.flush()
"""


def concurrent_writers(path, writers: int, rounds: int, *extra: str) -> None:
    processes = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(w), str(rounds), *extra],
                                  cwd=ROOT) for w in range(writers)]
    assert [p.wait(timeout=120) for p in processes] == [0] * writers


@pytest.mark.slow
def test_processes_flushing_at_once_lose_nothing_and_corrupt_nothing(tmp_path) -> None:
    path = tmp_path / "results.msgpack"
    concurrent_writers(path, writers=4, rounds=60)
    cache = DiskCache(path)
    report = cache.load()
    assert report.problem is None
    missing = [(w, n) for w in range(4) for n in range(60) if cache.get(key(w * 1000 + n)) != value(n)]
    assert missing == []
    assert leftovers(tmp_path) == []
