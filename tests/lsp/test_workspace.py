"""The whole workspace through a real LSP client and the real nvcc: closed files checked and published, a header
changed on disk re-checks its includers, a deleted file loses its diagnostics, a burst of changes is one batch, the
on-disk cache survives corruption and brings diagnostics back after a restart without compiling."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from kernel_lsp.findings import path_to_uri
from kernel_lsp.jobs.disk_cache import DiskCache
from tests.lsp.conftest import FIGURES_AS_DIAGNOSTICS
from tests.lsp.helpers import (
    SERVER,
    codes,
    initialize_params,
    needs_nvcc,
    open_document,
    recording_client,
    wait_for_publish,
)
from tests.nvcc_log import compiles, nvcc_wrapper

pytestmark = needs_nvcc

HEADER_OK = "#pragma once\n#define SCALE 2.0f\n"
HEADER_BROKEN = "#pragma once\n#define SCALE undefined_scale\n"
KERNEL = '#include "scale.cuh"\n__global__ void scale(float* p) { p[threadIdx.x] *= SCALE; }\n'


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.workspace = tmp_path / "ws"
        self.workspace.mkdir()
        self.cache = tmp_path / "cache"
        tools = tmp_path / "tools"
        tools.mkdir()
        self.nvcc, self.log = nvcc_wrapper(tools)

    def options(self, **more) -> dict:
        return {"debounceMs": 50, "nvccPath": str(self.nvcc), "watch": "watchdog", **FIGURES_AS_DIAGNOSTICS, **more}


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


async def start(setup: Setup, **options) -> LanguageClient:
    config = ClientServerConfig(server_command=SERVER, client_factory=recording_client,
                                server_env={**os.environ, "KERNEL_LSP_CACHE_DIR": str(setup.cache)})
    client = await _start(config)
    params = initialize_params(setup.workspace, setup.options(**options))
    await client.initialize_session(params)
    return client


async def _start(config: ClientServerConfig) -> LanguageClient:
    return await config.start()


async def summary(client: LanguageClient) -> dict:
    return await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="kernel-lsp.workspaceSummary"))


async def wait_idle(client: LanguageClient, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = await summary(client)
        if state["ready"] and state["queued"] == 0 and all(f["compile"] != "checking" for f in state["files"]):
            return state
        await asyncio.sleep(0.1)
    raise AssertionError(f"the workspace did not settle within {timeout} s: {state}")


def published_for(client: LanguageClient, uri: str, after: int = 0) -> list[types.PublishDiagnosticsParams]:
    return [p for _, p in client.published[after:] if p.uri == uri]


async def test_closed_file_is_checked_and_its_header_change_on_disk_rechecks_it(setup: Setup) -> None:
    (setup.workspace / "scale.cuh").write_text(HEADER_OK)
    kernel = setup.workspace / "scale.cu"
    kernel.write_text(KERNEL)
    (setup.workspace / ".gitignore").write_text("generated/\n")
    (setup.workspace / "generated").mkdir()
    (setup.workspace / "generated" / "skip.cu").write_text("__global__ void broken( {\n")
    client = await start(setup)
    try:
        uri = path_to_uri(kernel)
        first = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))  # never opened
        assert codes(first) == ["ptxas-resources"] and first.version is None
        state = await wait_idle(client)
        assert state["watching"] == "watchdog"
        assert [f["path"] for f in state["files"]] == [str(kernel.resolve())]  # generated/ is ignored
        assert state["files"][0]["kernels"] == ["scale"] and state["files"][0]["compile"] == "compiles"
        assert not published_for(client, path_to_uri(setup.workspace / "generated" / "skip.cu"))

        mark = len(client.published)
        (setup.workspace / "scale.cuh").write_text(HEADER_BROKEN)  # outside the editor
        broken = await wait_for_publish(client, uri, lambda p: "nvcc-error" in codes(p), after=mark, timeout=60)
        message = next(d for d in broken.diagnostics if d.code == "nvcc-error")
        assert "undefined_scale" in message.message and message.range.start.line == 1  # where SCALE expands
        state = await wait_idle(client)
        assert state["files"][0]["compile"] == "errors"

        mark = len(client.published)
        kernel.unlink()
        cleared = await wait_for_publish(client, uri, lambda p: True, after=mark, timeout=30)
        assert list(cleared.diagnostics) == []
        state = await wait_idle(client)
        assert str(kernel.resolve()) not in [f["path"] for f in state["files"]]
    finally:
        await client.shutdown_session()


async def test_open_includer_is_rechecked_with_its_buffer_when_a_header_changes_on_disk(setup: Setup) -> None:
    (setup.workspace / "scale.cuh").write_text(HEADER_OK)
    kernel = setup.workspace / "scale.cu"
    kernel.write_text(KERNEL)
    client = await start(setup)
    try:
        buffer = "// unsaved line\n" + KERNEL  # the buffer, not the disk, is what an open file is checked as
        uri = open_document(client, kernel, buffer, version=3)
        await wait_for_publish(client, uri, lambda p: p.version == 3 and bool(p.diagnostics))
        await wait_idle(client)
        mark = len(client.published)
        (setup.workspace / "scale.cuh").write_text(HEADER_BROKEN)
        broken = await wait_for_publish(client, uri, lambda p: "nvcc-error" in codes(p), after=mark, timeout=60)
        assert broken.version == 3
        assert next(d for d in broken.diagnostics if d.code == "nvcc-error").range.start.line == 2
    finally:
        await client.shutdown_session()


async def test_a_burst_of_500_changes_is_one_batch_with_one_check_per_dependent(setup: Setup) -> None:
    headers = [f"h{i:03d}.h" for i in range(500)]
    for name in headers:
        (setup.workspace / name).write_text(f"#define V_{name[1:4]} 1\n")
    kernels = []
    for k in range(5):  # each kernel includes 100 of the headers
        includes = "".join(f'#include "{name}"\n' for name in headers[k * 100:(k + 1) * 100])
        path = setup.workspace / f"k{k}.cu"
        path.write_text(includes + f"__global__ void k{k}(int* p) {{ p[0] = V_{k * 100:03d}; }}\n")
        kernels.append(path)
    client = await start(setup)
    try:
        state = await wait_idle(client)
        assert state["scanned"] == 505 and state["kernelFiles"] == 5
        assert len(compiles(setup.log)) == 5
        for path in kernels:
            assert codes(published_for(client, path_to_uri(path))[-1]) == ["ptxas-resources"]
        mark, batches = len(client.published), state["batches"]
        for name in headers:  # like a checkout: every header rewritten at once
            (setup.workspace / name).write_text(f"#define V_{name[1:4]} 2\n")
        for path in kernels:
            await wait_for_publish(client, path_to_uri(path), after=mark, timeout=90)
        await asyncio.sleep(1.0)  # anything more that was going to come
        state = await wait_idle(client)
        after = [p for _, p in client.published[mark:]]
        assert sorted(p.uri for p in after) == sorted(path_to_uri(p) for p in kernels)  # one refresh per file
        assert len(compiles(setup.log)) == 10  # each includer compiled once more: 5, not 500
        assert state["batches"] - batches <= 2, state  # 1000+ disk events -> one or two batches
    finally:
        await client.shutdown_session()


async def test_restart_republishes_from_the_disk_cache_without_compiling(setup: Setup) -> None:
    (setup.workspace / "scale.cuh").write_text(HEADER_OK)
    closed = setup.workspace / "scale.cu"
    closed.write_text(KERNEL)
    opened = setup.workspace / "other.cu"
    opened.write_text("__global__ void other(int* p) { p[0] = missing; }\n")
    client = await start(setup)
    try:
        await wait_for_publish(client, path_to_uri(closed), lambda p: bool(p.diagnostics))
        uri = open_document(client, opened, opened.read_text())
        first = await wait_for_publish(client, uri, lambda p: "nvcc-error" in codes(p))
        await wait_idle(client)
    finally:
        await client.shutdown_session()  # writes the cache
    ran = len(compiles(setup.log))
    assert ran >= 2  # (3 when the open document cancelled its closed check mid-compile)
    files = list((setup.cache / "results").glob("*.msgpack"))
    assert len(files) == 1 and DiskCache(files[0]).load().entries >= 2

    client = await start(setup)
    try:
        again = await wait_for_publish(client, path_to_uri(closed), lambda p: bool(p.diagnostics))
        assert codes(again) == ["ptxas-resources"]
        uri = open_document(client, opened, opened.read_text())
        reopened = await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
        assert [d.message for d in reopened.diagnostics] == [d.message for d in first.diagnostics]
        state = await wait_idle(client)
        assert state["cacheProblem"] is None and "results from" in state["cache"]
    finally:
        await client.shutdown_session()
    assert len(compiles(setup.log)) == ran, compiles(setup.log)[ran:]  # nothing compiled after the restart


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
async def test_a_damaged_cache_file_is_rebuilt_and_nothing_breaks(setup: Setup, damage: str) -> None:
    kernel = setup.workspace / "scale.cu"
    (setup.workspace / "scale.cuh").write_text(HEADER_OK)
    kernel.write_text(KERNEL)
    client = await start(setup)
    try:
        await wait_for_publish(client, path_to_uri(kernel), lambda p: bool(p.diagnostics))
        await wait_idle(client)
    finally:
        await client.shutdown_session()
    (cache_file,) = (setup.cache / "results").glob("*.msgpack")
    data = cache_file.read_bytes()
    cache_file.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x93not msgpack at all" * 50)
    kernel.write_text(KERNEL.replace("*=", "+="))  # a new text: a check must run, and be cached again

    client = await start(setup)
    try:
        params = await wait_for_publish(client, path_to_uri(kernel), lambda p: bool(p.diagnostics))
        assert codes(params) == ["ptxas-resources"]
        state = await wait_idle(client)
        assert state["cacheProblem"], state  # said, not hidden
    finally:
        await client.shutdown_session()
    report = DiskCache(cache_file).load()
    assert report.problem is None and report.entries >= 1  # rewritten whole


async def test_the_clients_file_watching_is_used_when_offered(setup: Setup) -> None:
    (setup.workspace / "scale.cuh").write_text(HEADER_OK)
    kernel = setup.workspace / "scale.cu"
    kernel.write_text(KERNEL)
    config = ClientServerConfig(server_command=SERVER, client_factory=recording_client,
                                server_env={**os.environ, "KERNEL_LSP_CACHE_DIR": str(setup.cache)})
    client = await _start(config)
    await client.initialize_session(initialize_params(setup.workspace, setup.options(watch="auto")))
    try:
        uri = path_to_uri(kernel)
        await wait_for_publish(client, uri, lambda p: bool(p.diagnostics))
        state = await wait_idle(client)
        assert state["watching"] == "client"
        (watched,) = [r for r in client.registrations if r.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES]
        globs = [w["globPattern"] for w in watched.register_options["watchers"]]
        assert "**/.gitignore" in globs and any("cuh" in g and "cu," in g for g in globs), globs
        mark = len(client.published)
        (setup.workspace / "scale.cuh").write_text(HEADER_BROKEN)
        await asyncio.sleep(1.0)
        assert not published_for(client, uri, mark)  # the server does not watch on its own: the client does
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[types.FileEvent(
            uri=path_to_uri(setup.workspace / "scale.cuh"), type=types.FileChangeType.Changed)]))
        broken = await wait_for_publish(client, uri, lambda p: "nvcc-error" in codes(p), after=mark, timeout=60)
        assert broken.version is None
    finally:
        await client.shutdown_session()


async def test_the_background_queue_is_bounded_and_says_so(setup: Setup) -> None:
    for k in range(6):
        (setup.workspace / f"k{k}.cu").write_text(f"__global__ void k{k}(int* p) {{ p[0] = {k}; }}\n")
    client = await start(setup, maxQueuedChecks=2, maxParallelCompiles=1)
    try:
        state = await wait_idle(client)
        # one check starts at once (taken off the queue), two wait, three do not fit
        assert state["dropped"] == 3, state
        assert len(compiles(setup.log)) == 3
        assert any("maxQueuedChecks" in m.message for m in client.messages), [m.message for m in client.messages]
    finally:
        await client.shutdown_session()


async def test_with_workspace_check_off_closed_files_are_listed_not_compiled(setup: Setup) -> None:
    (setup.workspace / "scale.cuh").write_text(HEADER_OK)
    kernel = setup.workspace / "scale.cu"
    kernel.write_text(KERNEL)
    client = await start(setup, workspaceCheck=False)
    try:
        state = await wait_idle(client)
        assert [(f["path"], f["compile"], f["kernels"]) for f in state["files"]] == \
            [(str(kernel.resolve()), "not checked", ["scale"])]
        (setup.workspace / "scale.cuh").write_text(HEADER_BROKEN)
        await asyncio.sleep(2.0)  # past the coalescing window: the change was seen, and nothing compiled
        state = await wait_idle(client)
        assert state["batches"] >= 1 and state["closedChecks"] == 0
        assert compiles(setup.log) == [] and not published_for(client, path_to_uri(kernel))
    finally:
        await client.shutdown_session()


def inotify_watches(pid: int) -> int:
    """The inotify watches a process holds, as the kernel counts them (/proc/PID/fdinfo of its inotify descriptors)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) == "anon_inode:inotify":
                info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
                count += sum(line.startswith("inotify wd:") for line in info.splitlines())
        except OSError:  # a descriptor closed meanwhile
            continue
    return count


async def watches_become(pid: int, expected: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while inotify_watches(pid) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert inotify_watches(pid) == expected


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
async def test_ignored_folders_get_no_inotify_watch_now_later_or_after_the_rules_change(setup: Setup) -> None:
    """600 ignored folders (.git, node_modules, build, *.egg-info and one a .gitignore names) and 5 kept ones: 5
    watches. A folder made later gets one only when kept (its new file is checked); after the .gitignore stops
    naming `data/`, its 121 folders are watched, and no longer once it names it again."""
    ws = setup.workspace
    (ws / ".gitignore").write_text("data/\n")
    kept = [ws, ws / "src", ws / "src" / "a", ws / "src" / "b", ws / "include"]
    for folder in kept:
        folder.mkdir(parents=True, exist_ok=True)
    for ignored in (".git", "node_modules", "build", "data", "pkg.egg-info"):
        for i in range(60):
            (ws / ignored / f"d{i}" / "deeper").mkdir(parents=True)
    client = await start(setup)
    try:
        assert (await wait_idle(client))["watching"] == "watchdog"
        pid = client._server.pid
        assert inotify_watches(pid) == len(kept)
        (ws / "node_modules" / "new" / "deep").mkdir(parents=True)
        (ws / "src" / "fresh").mkdir()
        fresh = ws / "src" / "fresh" / "k.cu"
        fresh.write_text("__global__ void k(int* p) { p[0] = missing; }\n")
        params = await wait_for_publish(client, path_to_uri(fresh), lambda p: "nvcc-error" in codes(p), timeout=60)
        assert "missing" in params.diagnostics[0].message
        assert inotify_watches(pid) == len(kept) + 1  # src/fresh; nothing in node_modules
        (ws / ".gitignore").write_text("# data is source now\n")
        await watches_become(pid, len(kept) + 1 + 1 + 60 * 2)
        (ws / ".gitignore").write_text("data/\n")
        await watches_become(pid, len(kept) + 1)
    finally:
        await client.shutdown_session()


async def test_a_batch_is_read_and_parsed_while_the_server_answers(setup: Setup) -> None:
    """A 50,000-line candidate that builds with cpp_extension.load, written while the server watches: reading it and
    parsing it for its edges take seconds, and a summary asked for meanwhile is answered with the batch handed on
    but not applied yet (with the batch read on the loop, no answer could fall between the two). Then it is
    applied; a named pipe written beside it blocks nothing."""
    client = await start(setup)
    try:
        before = await wait_idle(client)
        lines = ["from torch.utils.cpp_extension import load", "ext = load(name='k', sources=['k.cu'])"]
        lines += [f"def f{i}(x):\n    return x + {i}\n" for i in range(17_000)]
        big = setup.workspace / "big_load.py"
        big.write_text("\n".join(lines) + "\n")
        os.mkfifo(setup.workspace / "late.cu")
        between = applied = None
        deadline = time.monotonic() + 120
        while applied is None and time.monotonic() < deadline:
            state = await summary(client)
            if state["batches"] > before["batches"] and state["scanned"] == before["scanned"]:
                between = state
            if state["scanned"] == before["scanned"] + 1:
                applied = state
            await asyncio.sleep(0.02)
        assert between is not None, "no answer came between the batch's flush and its application"
        assert applied is not None and applied["watching"] == "watchdog"
    finally:
        await asyncio.wait_for(client.shutdown_session(), 60)
