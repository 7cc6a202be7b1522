"""The whole workspace, not only the open buffers: the initial scan, watching, the dependency graph, background
checks of closed files, the on-disk result cache and the workspace summary.

- At `initialized`: the folders are scanned (workspace/scan.py: .gitignore and `workspaceExclude` honoured), every
  file read once into the DependencyGraph (workspace/graph.py), and each closed kernel file queued for a compile
  check at the lowest priority (`workspaceCheck`). With the on-disk cache (`persistentCache`) a restart answers
  these from disk without compiling, and shows the verdicts kept for closed candidates whose files are unchanged.
- Changes on disk come from the client's workspace/didChangeWatchedFiles where it offers dynamic registration,
  else from the server's own watcher (`watch`; inotify on Linux, one watch per folder that is not ignored, else a
  watchdog observer), never both. Either feeds one Coalescer: a burst is one batch, each path
  once. A batch updates the graph, clears the diagnostics of deleted files, and re-checks each changed kernel
  file and every dependent (transitively, open or not) once; dependents that are verification candidates are
  verified again (closed ones when `verifyClosedFiles`).
- A save in the editor goes through the same path; the disk event that follows it carries the same text and is
  dropped (`_seen`: the last text handled per file), so nothing runs twice.
- A batch's files are read (and parsed for their edges) in a thread, then applied on the loop, one batch at a time
  in the order they came; so are the closed candidates it verifies again, and a folder that appears is scanned in a
  thread too.
- Background checks wait in a bounded queue (`maxQueuedChecks`) and are fed to the compile scheduler a few at a
  time, where open documents always go first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from kernel_lsp.config import cache_dir
from kernel_lsp.findings import path_to_uri, uri_to_path
from kernel_lsp.jobs.cache import ResultCache
from kernel_lsp.jobs.disk_cache import DiskCache
from kernel_lsp.paths import read_regular_text, resolved
from kernel_lsp.server.compile_feature import PRODUCER as COMPILE
from kernel_lsp.server.compile_feature import CompileFeature
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.convert import OpenDocument
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.profile_feature import PRODUCER as PROFILE
from kernel_lsp.server.settings import SettingsManager
from kernel_lsp.server.verify_feature import VerifyFeature
from kernel_lsp.sources import parse_python
from kernel_lsp.workspace.graph import DependencyGraph, Edge
from kernel_lsp.workspace.scan import (
    DEPENDENCY_SUFFIXES,
    KERNEL_SUFFIXES,
    IgnoreRules,
    is_kernel_file,
    scan_folder,
)
from kernel_lsp.workspace.survey import (
    checked_alone,
    compile_state,
    digest,
    exclude_patterns,
    kernel_names,
    resources,
    results_file,
    survey,
    top_hint,
)
from kernel_lsp.workspace.inotify import InotifyWatcher
from kernel_lsp.workspace.inotify import available as inotify_available
from kernel_lsp.workspace.watch import CREATED, DELETED, Coalescer, FolderWatcher

if TYPE_CHECKING:
    from kernel_lsp.server.language_server import KernelLanguageServer

log = logging.getLogger(__name__)

SUMMARY_REQUEST = "kernelLsp/workspaceSummary"
SUMMARY_COMMAND = "kernel-lsp.workspaceSummary"  # the same, for clients that only send workspace/executeCommand
VISIBLE_NOTIFICATION = "kernelLsp/visibleDocuments"
WATCHED_GLOB = "**/*.{" + ",".join(sorted({s.lstrip(".") for s in (*KERNEL_SUFFIXES, *DEPENDENCY_SUFFIXES)})) + "}"
GITIGNORE_GLOB = "**/.gitignore"
CACHE_FLUSH_S = 5.0  # the on-disk cache is written at most this often (and at shutdown)
CACHE_MAX_AGE_DAYS = 30  # another workspace's results file untouched this long is deleted


@dataclass(frozen=True)
class _Read:
    """One path of a batch as read in a thread: gone (no digest), or its new text's digest, edges and kind."""
    path: Path
    digest: str | None = None
    edges: frozenset[Edge] = frozenset()
    kernel: bool = False


@dataclass
class WorkspaceState:
    """What the summary reports about the scan and the watching."""
    files: int = 0
    kernel_files: int = 0
    scan_s: float = 0.0
    truncated: bool = False
    watching: str = "off"  # client | watchdog | off
    watch_problem: str | None = None
    dropped: int = 0
    cache: str = "off"
    cache_problem: str | None = None
    ready: bool = False
    kernel_paths: set[Path] = field(default_factory=set)


class WorkspaceFeature(Feature):
    def __init__(self, store: DiagnosticStore, settings: SettingsManager, compile: CompileFeature,
                 verify: VerifyFeature, documents: Callable[[], Mapping[str, OpenDocument]],
                 tell_user: Callable[[str], None],
                 register_watchers: Callable[[list[str]], Awaitable[bool]],
                 cache_folder: Callable[[], Path], results: ResultCache | None = None) -> None:
        self.store = store
        self.settings = settings
        self.compile = compile
        self.verify = verify
        self._documents = documents
        self._tell_user = tell_user
        self._register_watchers = register_watchers
        self._cache_folder = cache_folder
        self._results = results  # the compile results the on-disk cache backs (open_cache at initialize)
        self.state = WorkspaceState()
        self.graph = DependencyGraph()
        self._rules: dict[Path, IgnoreRules] = {}
        self._seen: dict[Path, str] = {}  # path -> digest of the text last handled
        self._kernels: dict[Path, tuple[str, list[str]]] = {}  # path -> (digest, kernel names) for the summary
        self._queue: OrderedDict[Path, None] = OrderedDict()
        self._in_flight: set[Path] = set()
        self._early: list[tuple[Path, str]] = []  # events that came before the scan ended
        self._coalescer = Coalescer(self._apply_soon)
        self._turn = asyncio.Lock()  # one batch applied at a time, in the order they came
        self._applying: set[asyncio.Task] = set()
        self._watcher: InotifyWatcher | FolderWatcher | None = None
        self._disk: DiskCache | None = None
        self._flusher: asyncio.Task | None = None
        self.active: str | None = None
        self.visible: set[str] = set()

    # --- priorities ---------------------------------------------------------------------------------------

    def priority(self, uri: str) -> int | None:
        return self.priority_of(uri)

    def priority_of(self, uri: str) -> int:
        if uri == self.active:
            return 0
        if uri in self.visible:
            return 1
        return 2 if self.is_open(uri) else 3

    def is_open(self, uri: str) -> bool:
        return uri in self._documents()

    def set_visible(self, params: Any) -> None:
        """kernelLsp/visibleDocuments {active, visible}: what the client shows (VS Code's extension sends it)."""
        active = getattr(params, "active", None) if not isinstance(params, dict) else params.get("active")
        visible = getattr(params, "visible", None) if not isinstance(params, dict) else params.get("visible")
        self.active = active if isinstance(active, str) else None
        self.visible = {v for v in visible or [] if isinstance(v, str)}

    def touched(self, uri: str) -> None:
        """The user acted on this document (opened, edited, hovered): it is the active one until another is."""
        self.active = uri

    # --- the server's hooks (kernel_lsp/server/feature.py) -------------------------------------------------

    def document_active(self, uri: str) -> None:
        self.touched(uri)

    def document_save(self, uri: str, version: int | None, text: str) -> None:
        self.saved(uri, text)

    def initialize(self) -> None:
        if self._results is not None:
            self.open_cache(self._results)

    async def started(self, client_can_watch: bool) -> None:
        asyncio.ensure_future(self.start(client_can_watch))

    async def shutdown(self) -> None:
        await self.stop()

    def commands(self) -> dict[str, Callable[[tuple[Any, ...]], Any]]:
        return {SUMMARY_COMMAND: lambda _args: self.summary()}

    def methods(self) -> dict[str, Callable[[Any], Any]]:
        return {VISIBLE_NOTIFICATION: self.set_visible, SUMMARY_REQUEST: lambda _params: self.summary()}

    # --- start and stop -----------------------------------------------------------------------------------

    def open_cache(self, cache: ResultCache) -> None:
        """Attaches the on-disk cache for this workspace (before the first check) and loads it."""
        settings = self.settings.settings
        folders = self.settings.folders
        if not settings.workspace.persistent_cache or not folders:
            return
        path = results_file(self._cache_folder(), folders)
        _prune(path.parent, keep=path.name)
        self._disk = DiskCache(path)
        report = self._disk.load()
        cache.disk = self._disk
        self.state.cache = f"{report.entries} results from {self._disk.path}"
        if report.problem:
            self.state.cache_problem = report.problem
            log.warning("%s", report.problem)
        log.info("result cache: %s", self.state.cache)
        self._flusher = asyncio.ensure_future(self._flush_periodically())

    async def start(self, client_can_watch: bool) -> None:
        """Watching starts first, then the scan: a change made while the scan runs is held (`_early`) and handled
        once it is done (the same text read twice is handled once), so nothing written after `initialized` is
        missed."""
        settings = self.settings.settings
        roots = [f.resolve() for f in self.settings.folders if f.is_dir()]
        if not roots:
            self.state.ready = True
            return
        started = time.perf_counter()
        excludes = exclude_patterns(settings.workspace.exclude)
        include_dirs = [Path(d) for d in settings.compile.include_dirs]
        try:
            self._rules = await asyncio.to_thread(lambda: {r: IgnoreRules.for_folder(r, excludes) for r in roots})
            await self._watch(roots, client_can_watch, settings.workspace.watch)  # its filter needs the rules
            found = await asyncio.to_thread(survey, roots, excludes, include_dirs, self.verify.reference_finder(),
                                            self._rules)
        except Exception:  # a scan that fails leaves the open documents working
            log.exception("scanning the workspace failed")
            self.state.ready = True
            return
        self._rules, self.graph, self._seen = found.rules, found.graph, found.digests
        kernel_paths, truncated = found.kernel_paths, found.truncated
        self.state.files = len(self._seen)
        self.state.kernel_files = len(kernel_paths)
        self.state.kernel_paths = kernel_paths
        self.state.truncated = truncated
        self.state.scan_s = time.perf_counter() - started
        self.state.ready = True
        log.info("workspace: %d files (%d kernel files) scanned in %.2f s%s", self.state.files,
                 self.state.kernel_files, self.state.scan_s, " (truncated)" if truncated else "")
        if truncated:
            self._tell_user(f"kernel-lsp: the workspace has more than {self.state.files} files; only those are "
                            "checked and watched (add folders to 'workspaceExclude')")
        for path in sorted(kernel_paths):
            if self._checked_alone(path):
                self._enqueue(path)
        for path, kind in self._early:
            self._coalescer.add(path, kind)
        self._early.clear()
        await self._show_kept_verdicts()

    async def _show_kept_verdicts(self) -> None:
        """The verdicts kept on disk for the closed candidates, as their files are now: after a restart they are
        shown at once, not when each file is opened again."""
        open_paths = set(self._open_by_path())
        closed = sorted(p for p in self._seen if p.suffix == ".py" and p not in open_paths)
        try:
            kept = await asyncio.to_thread(self.verify.kept_verdicts, closed)
        except Exception:  # a bad entry costs the kept verdicts, not the workspace
            log.exception("reading the kept verdicts failed")
            return
        self.verify.show_kept(kept)

    async def _watch(self, roots: list[Path], client_can_watch: bool, mode: str) -> None:
        if mode == "off":
            return
        if mode in ("auto", "client") and client_can_watch:
            if await self._register_watchers([WATCHED_GLOB, GITIGNORE_GLOB]):
                self.state.watching = "client"
                return
        if mode == "client":
            self.state.watch_problem = "the client does not offer workspace/didChangeWatchedFiles"
            return
        watcher = InotifyWatcher if inotify_available() else FolderWatcher  # inotify: no watch on ignored folders
        self._watcher = watcher(roots, self._ignored, self._watch_event, asyncio.get_running_loop())
        problem = await asyncio.to_thread(self._watcher.start)
        if problem:
            self._watcher = None
            self.state.watch_problem = problem
            self._tell_user(f"kernel-lsp: {problem}")
            return
        self.state.watching = "watchdog"

    async def stop(self) -> None:
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.stop)
            self._watcher = None
        self._coalescer.close()
        if self._flusher is not None:
            self._flusher.cancel()
        await self.flush_cache()

    async def flush_cache(self) -> None:
        """Writes the on-disk cache when it changed (in a thread: it merges with the file and fsyncs)."""
        if self._disk is not None:
            await asyncio.to_thread(self._disk.flush)

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(CACHE_FLUSH_S)
            await self.flush_cache()

    # --- changes ------------------------------------------------------------------------------------------

    def client_changes(self, changes: list[tuple[str, int]]) -> None:
        """workspace/didChangeWatchedFiles: (uri, FileChangeType 1 created, 2 changed, 3 deleted)."""
        for uri, kind in changes:
            try:
                path = uri_to_path(uri)
            except ValueError:
                continue
            if path.name == ".gitignore":
                self._rules_changed()
                continue
            if not self._ignored(path, None):
                self._add(path, {1: CREATED, 3: DELETED}.get(kind, "changed"))

    def saved(self, uri: str, text: str) -> None:
        """A save in the editor: the dependents of the file are checked again now (not when the disk event
        comes, which then carries the same text and is dropped)."""
        try:
            path = uri_to_path(uri).resolve()
        except ValueError:
            return
        if not self.state.ready:
            return
        self._apply_soon({path: "changed"}, texts={path: text})

    def _watch_event(self, path: Path, kind: str, is_dir: bool) -> None:
        if path.name == ".gitignore":
            self._rules_changed()
            return
        if is_dir:
            if kind == DELETED:
                for known in [p for p in self._seen if p.is_relative_to(path)]:
                    self._add(known, DELETED)
            elif kind == CREATED:
                self._track(self._folder_created(path))
            return
        self._add(path, kind)

    async def _folder_created(self, path: Path) -> None:
        """A folder moved or copied in: its files, found in a thread, as created."""
        rules = self._rules_for(path)
        found = await asyncio.to_thread(lambda: scan_folder(path, rules).files if path.is_dir() else [])
        for file in found:
            self._add(file, CREATED)

    def _track(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._applying.add(task)
        task.add_done_callback(self._done_applying)

    def _done_applying(self, task: asyncio.Task) -> None:
        self._applying.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a bug in a batch must not stop watching
            log.error("handling changed files failed", exc_info=task.exception())

    def _add(self, path: Path, kind: str) -> None:
        if not self.state.ready:
            self._early.append((path, kind))
        else:
            self._coalescer.add(path, kind)

    def _apply_soon(self, batch: dict[Path, str], texts: dict[Path, str] | None = None) -> None:
        """A batch from the Coalescer, or a save (`texts`: the editor's, read nowhere): applied after those before
        it."""
        self._track(self._apply(batch, texts or {}))

    async def _apply(self, batch: dict[Path, str], texts: dict[Path, str]) -> None:
        """One batch: the graph updated, deleted files cleared, changed kernel files and all dependents checked."""
        async with self._turn:  # what the thread compares with (_seen) changes only here
            reads = await asyncio.to_thread(self._read, list(batch), texts)
            changed, dependents = self._update(reads, texts)
            if not changed:
                return
            candidates = sorted((changed - set(texts)) | dependents)
            closed = None
            if self.settings.settings.verify.on_save and self.settings.settings.verify.closed_files:
                open_paths = set(self._open_by_path())
                closed = await asyncio.to_thread(_closed_texts, [p for p in candidates if p not in open_paths])
            self.verify.dependencies_changed(candidates, closed)
            self.state.files = len(self._seen)
            self.state.kernel_files = len(self.state.kernel_paths)

    def _read(self, paths: list[Path], texts: dict[Path, str]) -> list[_Read]:
        """In a thread: each path resolved and read (or the editor's text taken) and, when its text is new, parsed
        for its edges; a text handled already (the editor's save, a touch without a change) is left out."""
        reads = []
        for raw in paths:
            path = resolved(raw) if raw.is_absolute() else raw
            if path.suffix not in KERNEL_SUFFIXES and path.suffix not in DEPENDENCY_SUFFIXES:
                continue
            text = texts.get(path)
            if text is None:
                text = read_regular_text(path)
            if text is None:  # gone
                reads.append(_Read(path))
                continue
            text_digest = digest(text)
            if self._seen.get(path) != text_digest:
                reads.append(_Read(path, text_digest, self.graph.edges_of(path, text),
                                   path.suffix in KERNEL_SUFFIXES and is_kernel_file(path, text)))
        return reads

    def _update(self, reads: list[_Read], texts: dict[Path, str]) -> tuple[set[Path], set[Path]]:
        """On the loop: what was read put in the graph and the state; changed kernel files queued, open dependents
        checked again with their buffers. The changed files and their dependents."""
        open_docs = self._open_by_path()
        changed: set[Path] = set()
        for read in reads:
            path = read.path
            if read.digest is None:
                if path in self._seen:
                    self._forget(path, open_docs)
                    changed.add(path)
                continue
            self._seen[path] = read.digest
            self.graph.set_edges(path, read.edges)
            changed.add(path)
            if read.kernel:
                self.state.kernel_paths.add(path)
                if path not in open_docs and path not in texts and self._checked_alone(path):
                    self._enqueue(path)
            else:
                self.state.kernel_paths.discard(path)
        dependents: set[Path] = set()
        for path in changed:
            dependents |= self.graph.dependents(path)
        dependents -= changed
        for path in sorted(dependents):
            document = open_docs.get(path)
            if document is not None:
                self.compile.recheck(document.uri, document.version, document.source)
            elif path in self.state.kernel_paths and self._checked_alone(path):
                self._enqueue(path)
        return changed, dependents

    def _checked_alone(self, path: Path) -> bool:
        return checked_alone(path, self.graph)

    def _forget(self, path: Path, open_docs: dict[Path, OpenDocument]) -> None:
        self._seen.pop(path, None)
        self._kernels.pop(path, None)
        self.graph.remove(path)
        self.state.kernel_paths.discard(path)
        self._queue.pop(path, None)
        if path not in open_docs:
            self.compile.forget(path_to_uri(path))
            self.verify.file_deleted(path_to_uri(path))

    def _rules_changed(self) -> None:
        """A .gitignore changed: new rules, and the watched folders made to match them (in a thread: a walk)."""
        excludes = exclude_patterns(self.settings.settings.workspace.exclude)
        self._rules = {root: IgnoreRules.for_folder(root, excludes) for root in self._rules}
        if self._watcher is not None:
            task = asyncio.ensure_future(asyncio.to_thread(self._watcher.refresh))
            task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or log.error(
                "watching the folders the new rules keep failed", exc_info=t.exception()))

    def _rules_for(self, path: Path) -> IgnoreRules | None:
        return next((rules for root, rules in self._rules.items() if path.is_relative_to(root)), None)

    def _ignored(self, path: Path, is_dir: bool | None) -> bool:
        rules = self._rules_for(path)
        return rules is None or rules.ignored(path, is_dir)

    # --- the background queue -----------------------------------------------------------------------------

    def _enqueue(self, path: Path) -> None:
        """A closed file's check queued (only with `workspaceCheck`: off, closed files are not compiled at all)."""
        if path in self._queue or not self.settings.settings.workspace.check:
            return
        if len(self._queue) >= self.settings.settings.workspace.max_queued_checks:
            self.state.dropped += 1
            if self.state.dropped == 1:
                limit = self.settings.settings.workspace.max_queued_checks
                self._tell_user(f"kernel-lsp: more than {limit} files wait for a check; the rest are skipped until "
                                "they change (setting 'maxQueuedChecks')")
            return
        self._queue[path] = None
        self._pump()

    def _pump(self) -> None:
        limit = max(1, self.settings.settings.compile.max_parallel)
        while self._queue and len(self._in_flight) < limit:
            path, _ = self._queue.popitem(last=False)
            task = self.compile.check_closed(path_to_uri(path), path)
            if task is None:
                continue
            self._in_flight.add(path)
            task.add_done_callback(lambda _t, p=path: self._done(p))

    def _done(self, path: Path) -> None:
        self._in_flight.discard(path)
        self._pump()

    @property
    def queued(self) -> int:
        return len(self._queue) + len(self._in_flight)

    async def idle(self) -> None:
        """Waits until the background queue is empty and no batch is being applied (tests and benchmarks)."""
        while self.queued or self._applying or not self.state.ready:
            await asyncio.sleep(0.05)

    # --- the summary --------------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """kernelLsp/workspaceSummary: one entry per kernel file: its kernels, compile state, verification, top
        hint; and the scan's and the queue's state."""
        open_docs = self._open_by_path()
        checked = self.store.uris()
        files = []
        for path in sorted(self.state.kernel_paths):
            document = open_docs.get(path)
            if document is None and not self._checked_alone(path):
                continue
            uri = document.uri if document is not None else path_to_uri(path)
            findings = self.store.findings(uri, COMPILE)
            state, errors, warnings = compile_state(findings)
            if self.compile.scheduler.is_pending(uri) or path in self._queue:
                state = "checking"
            elif uri not in checked:
                state = "not checked"
            files.append({
                "uri": uri, "path": str(path), "open": document is not None,
                "kernels": self._kernel_names(path, document),
                "compile": state, "errors": errors, "warnings": warnings,
                "resources": resources(findings),
                "verify": self.verify.summary_of(uri),
                "topHint": top_hint(self.store.findings(uri, PROFILE)),
            })
        state = self.state
        return {"ready": state.ready, "files": files, "scanned": state.files, "kernelFiles": state.kernel_files,
                "scanSeconds": round(state.scan_s, 3), "truncated": state.truncated, "watching": state.watching,
                "watchProblem": state.watch_problem, "queued": self.queued, "dropped": state.dropped,
                "batches": self._coalescer.batches, "closedChecks": self.compile.closed_checks, "cache": state.cache,
                "cacheProblem": state.cache_problem}

    def _kernel_names(self, path: Path, document: OpenDocument | None) -> list[str]:
        """The file's kernels, parsed again only when its text changed (the summary is asked for often)."""
        text = document.source if document is not None else None
        key = digest(text) if text is not None else self._seen.get(path)
        known = self._kernels.get(path)
        if known is not None and key is not None and known[0] == key:
            return known[1]
        if text is None:
            text = read_regular_text(path) or ""
            key = digest(text)
        names = kernel_names(path, text)
        self._kernels[path] = (key, names)
        return names

    def _open_by_path(self) -> dict[Path, OpenDocument]:
        found = {}
        for document in self._documents().values():
            try:
                found[uri_to_path(document.uri).resolve()] = document
            except ValueError:
                continue
        return found


def _closed_texts(paths: list[Path]) -> dict[Path, str | None]:
    """In a thread: the texts of closed files that may be candidates, each .py parsed (pairing them next, on the
    loop, finds the parse kept)."""
    texts = {path: read_regular_text(path) for path in paths if path.suffix == ".py"}
    for text in texts.values():
        if text is not None:
            parse_python(text)
    return texts


def _prune(folder: Path, keep: str) -> None:
    """Deletes the results files of workspaces not opened for CACHE_MAX_AGE_DAYS (one file per workspace)."""
    cutoff = time.time() - CACHE_MAX_AGE_DAYS * 86400
    try:
        old = [p for p in folder.glob("*.msgpack") if p.name != keep and p.stat().st_mtime < cutoff]
    except OSError:
        return
    for path in old:
        try:
            path.unlink()
        except OSError:
            pass


def setup(server: KernelLanguageServer) -> WorkspaceFeature:
    return WorkspaceFeature(server.diagnostics, server.settings, server.get_feature(CompileFeature),
                            server.get_feature(VerifyFeature), documents=server.open_documents,
                            tell_user=lambda m: server.show(m, types.MessageType.Warning),
                            register_watchers=server.register_file_watchers, cache_folder=cache_dir,
                            results=server.results)
