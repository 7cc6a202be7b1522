"""The per-document scheduler: newer versions cancel older ones, one job per document at a time."""

from __future__ import annotations

import asyncio
import gc
import weakref

from kernel_lsp.jobs.cache import ResultCache, cache_key
from kernel_lsp.jobs.scheduler import DocumentScheduler, Priority


async def test_newer_version_cancels_older_and_waits_for_it():
    scheduler = DocumentScheduler(max_parallel=4)
    events: list[str] = []
    running = asyncio.Event()

    async def slow(version: int):
        events.append(f"start {version}")
        running.set()
        try:
            await asyncio.sleep(10)
            events.append(f"done {version}")
        finally:
            await asyncio.sleep(0.05)  # unwinding takes time, like killing nvcc
            events.append(f"unwound {version}")

    async def fast(version: int):
        events.append(f"start {version}")

    scheduler.submit("a", 1, 0, lambda: slow(1))
    await running.wait()
    assert scheduler.is_started("a", 1)
    scheduler.submit("a", 2, 0, lambda: fast(2))
    assert not scheduler.is_current("a", 1) and scheduler.is_current("a", 2)
    await scheduler.drain()
    assert events == ["start 1", "unwound 1", "start 2"]


async def test_debounce_coalesces_a_burst():
    scheduler = DocumentScheduler(max_parallel=1)
    ran: list[int] = []
    for version in range(1, 6):
        scheduler.submit("doc", version, 0.05, lambda v=version: asyncio.sleep(0, result=ran.append(v)))
        await asyncio.sleep(0.005)
    await scheduler.drain()
    assert ran == [5]


async def test_a_failing_job_does_not_escape():
    scheduler = DocumentScheduler(max_parallel=1)

    async def broken():
        raise RuntimeError("checker bug")

    scheduler.submit("x", 1, 0, broken)
    await scheduler.drain()
    ran = []
    scheduler.submit("x", 2, 0, lambda: asyncio.sleep(0, result=ran.append(2)))
    await scheduler.drain()
    assert ran == [2]


def test_cache_entry_goes_stale_when_a_dependency_changes(tmp_path):
    header = tmp_path / "h.cuh"
    header.write_text("#define A 1\n")
    cache = ResultCache(max_entries=2)
    key = cache_key("text", ("sm_90",))
    cache.put(key, [], [header])
    assert cache.get(key) == []
    header.write_text("#define A 22\n")
    assert cache.get(key) is None
    cache.put("k1", [], [])
    cache.put("k2", [], [])
    cache.put("k3", [], [])
    assert cache.get("k1") is None and cache.get("k3") == []


async def test_a_free_slot_goes_to_the_most_important_waiting_document() -> None:
    priorities = {"closed-1": Priority.CLOSED, "closed-2": Priority.CLOSED, "open": Priority.OPEN,
                  "active": Priority.CLOSED}
    scheduler = DocumentScheduler(max_parallel=1, priority_of=lambda key: priorities[key])
    gate = asyncio.Event()
    ran: list[str] = []

    async def job(key: str) -> None:
        ran.append(key)
        if key == "closed-1":
            await gate.wait()

    for key in ("closed-1", "closed-2", "open", "active"):
        scheduler.submit(key, 1, 0, lambda k=key: job(k))
    await asyncio.sleep(0.01)
    assert ran == ["closed-1"]  # holds the only slot; three wait
    priorities["active"] = Priority.ACTIVE  # the user switched to it while it waited
    gate.set()
    await scheduler.drain()
    assert ran == ["closed-1", "active", "open", "closed-2"]


async def test_a_cancelled_waiter_gives_no_slot_away() -> None:
    scheduler = DocumentScheduler(max_parallel=1)
    gate = asyncio.Event()
    ran: list[str] = []

    async def job(key: str) -> None:
        ran.append(key)
        await gate.wait()

    scheduler.submit("a", 1, 0, lambda: job("a"))
    scheduler.submit("b", 1, 0, lambda: job("b"))
    await asyncio.sleep(0.01)
    scheduler.cancel("b")  # waiting for the slot
    scheduler.submit("c", 1, 0, lambda: job("c"))
    gate.set()
    await scheduler.drain()
    assert ran == ["a", "c"]
    assert scheduler.pending == 0


class _Text:
    """Stands in for a version's text (a weak reference tells whether anything still holds it)."""


async def test_the_versions_superseded_while_typing_are_let_go():
    """Each keystroke supersedes the job of the version before, which is cancelled; a cancelled task keeps its
    CancelledError, whose traceback holds the task's frame. The next job held on to it, so every superseded version
    stayed alive with its text, chained one to the other (issue 43: 2 KiB a change and more as the text grew)."""
    scheduler = DocumentScheduler(max_parallel=1)
    texts = []
    for version in range(40):
        text = _Text()
        texts.append(weakref.ref(text))

        async def job(text: _Text = text) -> None:
            await asyncio.sleep(0)

        scheduler.submit("file:///k.cu", version, 30.0, job)
        await asyncio.sleep(0.002)  # between keystrokes: the cancel reaches the job before, the new one waits
        del text, job
    gc.collect()
    alive = [number for number, ref in enumerate(texts) if ref() is not None]
    assert alive[:-2] == [], alive  # the newest (and the one it may still be waiting for) only
    scheduler.cancel("file:///k.cu")
