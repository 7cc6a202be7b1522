"""Verification feature: saving a candidate (or the `kernel-lsp.verify` command) runs a "verify" job on the
worker; its findings become diagnostics, its summary a code lens on `class ModelNew`, its progress `$/progress`.

Saving any other file (a `.cu` a candidate builds with cpp_extension.load, a reference) verifies again the open
candidates that depend on it; a change on disk (server/workspace_feature.py) verifies its dependents, closed ones
too. A newer run of a candidate cancels the older one, which cancels the worker's job. A closed candidate's run is
background work: it waits until no run for an open document is going, and runs one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lsprotocol import types

from kernel_lsp.config import Settings
from kernel_lsp.findings import SOURCE, Finding, Range, Severity, path_to_uri, uri_to_path
from kernel_lsp.jobs.cache import ResultCache
from kernel_lsp.kinds.verify import VerifyOutcome, verify_job, verify_options
from kernel_lsp.paths import read_regular_text
from kernel_lsp.server.convert import STALE, OpenDocument, ago, lsp_range, open_texts, uris_by_path
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.events import CANDIDATE_VERIFIED, Events
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.settings import SettingsManager
from kernel_lsp.server.work_progress import WorkProgress
from kernel_lsp.server.worker_feature import WorkerFeature
from kernel_lsp.sources import parse_python
from kernel_lsp.verify.pairing import (
    Pairing,
    ReferenceProblem,
    files_to_reverify,
    find_reference,
    is_reference,
)
from kernel_lsp.worker.client import WorkerUnavailable
from kernel_lsp.worker.protocol import Job, Result

if TYPE_CHECKING:
    from kernel_lsp.server.language_server import KernelLanguageServer

log = logging.getLogger(__name__)

PRODUCER = "verify"
REMEMBERED = "verify-verdict"  # the kind of a verdict's entry in the on-disk cache
VERIFY_COMMAND = "kernel-lsp.verify"
RUNNING = "verifying…"
_TITLE_MESSAGE_CHARS = 100


# ---- the job -----------------------------------------------------------------------------------------------


def candidate_job(pairing: Pairing, settings: Settings, texts: Mapping[Path, str] | None = None) -> Job:
    """The candidate's "verify" job, the same as `kernel-lsp bench` builds, options from the settings: the files as
    saved on disk, or as `texts` has them (the editor's buffers, for a run asked for by the user)."""
    return verify_job(pairing.candidate, pairing.reference, verify_options(settings), texts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


# ---- what one candidate shows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyRun:
    state: str  # idle (known candidate, not run) | running | done (a result) | unavailable (no result)
    reference: Path
    text: str | None = None  # the candidate text the run verified
    summary: str = ""  # metrics["summary"] of a done run
    message: str = ""  # why an unavailable run has no result


def lens_title(run: VerifyRun, current_text: str | None, energy: str | None = None) -> str:
    """The code lens title; a result for text the user has edited since says so (current_text None: not open).
    `energy`: what a profile of this same text read (ProfileFeature.lens_note), shown after a result."""
    if run.state == "idle":
        return f"verify against {run.reference.name}"
    if run.state == "running":
        return RUNNING
    if run.state == "done":
        title = run.summary or "verified (no summary)"
    else:
        message = run.message.removeprefix("kernel-lsp: ").splitlines()[0] if run.message else "no result"
        short = message if len(message) <= _TITLE_MESSAGE_CHARS else message[:_TITLE_MESSAGE_CHARS - 1] + "…"
        title = f"not verified: {short}"
    stale = current_text is not None and run.text is not None and current_text != run.text
    if stale:
        return title + STALE
    return f"{title} · {energy}" if energy and run.state == "done" else title


@dataclass(frozen=True)
class RunResult:
    """What one verify run left for the lens and the diagnostics: `state` "done" (a verdict, its `summary` and
    `findings`) or "unavailable" (`summary` says why; the caller places one verify-unavailable finding); the job's
    cache `key` and the candidate `text` verified, where the job was built; `verified`: the job, when its verdict
    was "verified" (published to the features that act on it). `verdict`: verified, rejected or unavailable (a
    job done on a machine that could not run the candidate, as one that did not finish), so that a client never
    words a "not verified" summary as a verification."""

    state: str
    summary: str
    findings: list[Finding] = field(default_factory=list)
    key: str | None = None
    text: str | None = None
    verified: Job | None = None
    verdict: str = "unavailable"


def outcome_of(result: Result) -> tuple[str, str, list[Finding]]:
    """(state, summary or message, findings) of a finished job; a job that did not finish is one verify-unavailable
    finding (placed on the candidate by the caller)."""
    outcome = VerifyOutcome.of(result)
    if outcome.finished:
        return "done", outcome.summary, outcome.findings
    message = f"verification did not finish ({result.status}): {result.error or 'no reason given'}"
    return "unavailable", message, []


def age(seconds: float) -> str:
    """'verified just now', 'verified 12 min ago': how old a remembered verdict is."""
    return f"verified {ago(seconds)}"


def unavailable_finding(uri: str, message: str) -> Finding:
    """Information, as the worker's own: a job that did not finish says nothing of the candidate."""
    return Finding(uri, Range.line(0), Severity.INFORMATION, SOURCE, "verify-unavailable", message)


# ---- the feature -------------------------------------------------------------------------------------------


class VerifyFeature(Feature):
    def __init__(self, store: DiagnosticStore, settings: SettingsManager, worker: WorkerFeature,
                 documents: Callable[[], Mapping[str, OpenDocument]], progress: Any,
                 supports_progress: Callable[[], bool], tell_user: Callable[[str], None],
                 refresh_lenses: Callable[[], None], results: ResultCache | None = None,
                 lens_notes: Callable[[str, str | None], list[str]] = lambda _uri, _text: [],
                 events: Events | None = None) -> None:
        self.store = store
        self._results = results  # its `disk` (the workspace's on-disk cache) keeps verdicts across restarts
        self.settings = settings
        self.worker = worker
        self._documents = documents
        self._progress = WorkProgress(progress, supports_progress)
        self._tell_user = tell_user
        self._refresh_lenses = refresh_lenses
        self._runs: dict[str, VerifyRun] = {}  # candidate URI -> what its lens shows
        self._tasks: dict[str, asyncio.Task] = {}
        self._published: dict[str, set[str]] = {}  # candidate URI -> URIs holding its findings
        self._background: set[str] = set()  # candidates whose run waits behind the open documents' runs
        self._background_turn = asyncio.Lock()
        # what other features add after the lens's result for the same text (the energy a profile read)
        self._lens_notes = lens_notes
        # each run that verified a candidate is published (CANDIDATE_VERIFIED: SanitizeFeature's sanitizeAfterVerify)
        self._events = events or Events()

    # --- document hooks -------------------------------------------------------------------------------------

    def document_open(self, uri: str, version: int | None, text: str) -> None:
        """Opening finds the reference (cheap) so the lens can offer a run; it never starts one. A verdict kept on
        disk for exactly these files and options (after a restart) is shown again, with its age."""
        found = self._pair(uri, text)
        if isinstance(found, Pairing) and uri not in self._runs:
            remembered = self._remembered(found, self._open_texts())
            if remembered is None:
                self._runs[uri] = VerifyRun("idle", found.reference)
            else:
                run, findings = remembered
                self._runs[uri] = run
                self._publish(uri, findings)
                self._refresh_lenses()

    def document_save(self, uri: str, version: int | None, text: str) -> None:
        if not self.settings.settings.verify.on_save:
            return
        found = self._pair(uri, text)
        if isinstance(found, Pairing):
            self._start(uri, found)
        for dependent_uri, pairing in self._dependents(uri):
            self._start(dependent_uri, pairing)

    def document_close(self, uri: str) -> None:
        task = self._tasks.pop(uri, None)
        if task is not None:
            task.cancel()
        self._runs.pop(uri, None)
        for other in self._published.pop(uri, set()) - {uri}:  # the candidate's own URI is cleared on close
            self.store.set(other, self._producer(uri), self._version(other), [])

    def commands(self) -> dict[str, Callable[[tuple[Any, ...]], Any]]:
        return {VERIFY_COMMAND: self.verify_command}

    async def verify_command(self, args: tuple[Any, ...]) -> dict[str, Any]:
        """kernel-lsp.verify [uri]: verifies now (whatever verifyOnSave says) the files as the editor shows them
        (unsaved buffers included: the candidate's, its reference's, its helpers') and answers with the outcome."""
        uri = args[0].get("uri") if args and isinstance(args[0], dict) else (args[0] if args else None)
        if not isinstance(uri, str):
            return {"status": "error", "message": "kernel-lsp.verify needs the document URI as its argument"}
        document = self._document(uri)
        try:
            text = document.source if document is not None else _read(uri_to_path(uri))
        except ValueError:
            text = None
        if text is None:
            return {"uri": uri, "status": "error", "message": f"cannot read {uri}"}
        found = self._pair(uri, text)
        if not isinstance(found, Pairing):
            if isinstance(found, ReferenceProblem):
                message = found.message
            elif uri.startswith("file:") and is_reference(uri_to_path(uri), text):
                message = ("a reference (Model, and no ModelNew to verify): verify a candidate that defines ModelNew "
                           "against it, or run kernel-lsp's optimize command on it to have one written")
            else:
                message = ("not a verification candidate: no ModelNew with a reference (Model in the same file, a "
                           "'# kernel-lsp: reference=PATH' header, the 'references' setting or a KernelBench "
                           "problem name)")
            self._tell_user(f"kernel-lsp: {uri_to_path(uri).name}: {message}")
            return {"uri": uri, "status": "not-a-candidate", "message": message}
        task = self._start(uri, found, texts=self._open_texts())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # a newer run took its place, or the document closed
                return {"uri": uri, "status": "cancelled"}
            raise

    def result_summary(self, uri: str) -> str | None:
        """What the last finished verification of a candidate said (its lens title: correctness, speedups, time, or
        why there is no result; marked when the text changed since), None while none finished or one runs."""
        run = self._runs.get(uri)
        if run is None or run.state not in ("done", "unavailable"):
            return None
        document = self._document(uri)
        return lens_title(run, document.source if document is not None else None)

    def code_lenses(self, uri: str) -> list[types.CodeLens]:
        run = self._runs.get(uri)
        if run is None:
            return []
        document = self._document(uri)
        current = document.source if document is not None else None
        parts = parse_python(current).kernelbench if current is not None else None
        line = parts.model_new.def_range.start.line if parts is not None and parts.model_new is not None else 0
        command = "" if run.state == "running" else VERIFY_COMMAND
        return [types.CodeLens(range=lsp_range(Range.line(line)), command=types.Command(
            title=lens_title(run, current, " · ".join(self._lens_notes(uri, current)) or None), command=command,
            arguments=[uri] if command else None))]

    # --- the workspace --------------------------------------------------------------------------------------

    def dependencies_changed(self, paths: list[Path], closed: Mapping[Path, str | None] | None,
                             open_too: bool = True) -> int:
        """Files changed on disk, or files depending on them: each that is a candidate is verified again (open ones
        when `open_too`, as a save of theirs would; closed ones in the background, when `closed` holds their texts,
        which the caller read off the loop; None: closed files are not verified). How many started."""
        if not self.settings.settings.verify.on_save:
            return 0
        open_docs = self._uris_by_path()
        started = 0
        for path in paths:
            if path.suffix != ".py":
                continue
            uri = open_docs.get(path.resolve())
            if uri is not None:
                document = self._document(uri)
                if open_too and document is not None:
                    found = self._pair(uri, document.source)
                    if isinstance(found, Pairing):
                        self._start(uri, found)
                        started += 1
                continue
            if closed is None:
                continue
            text = closed.get(path)
            uri = path_to_uri(path)
            found = self._pair(uri, text) if text is not None else None
            if isinstance(found, Pairing):
                self._start(uri, found, background=True)
                started += 1
        return started

    def file_deleted(self, uri: str) -> None:
        """A closed candidate that is gone: its run stops and its findings (on any file) go."""
        self._forget(uri)
        for other in self._published.pop(uri, set()):
            self.store.set(other, self._producer(uri), self._version(other), [])

    def summary_of(self, uri: str) -> str | None:
        run = self._runs.get(uri)
        if run is None:
            return None
        return lens_title(run, None)

    def reference_finder(self) -> Callable[[Path, str], Path | None]:
        """For the dependency graph: a candidate's reference, as verification pairs it (no diagnostics)."""
        workspace, pairs, roots = self.settings.pairing_context()

        def reference_of(path: Path, text: str) -> Path | None:
            if path.suffix != ".py":
                return None
            found = find_reference(path, text, workspace, pairs, roots)
            return found.reference.resolve() if isinstance(found, Pairing) and found.reference != path else None
        return reference_of

    # --- pairing --------------------------------------------------------------------------------------------

    def _pair(self, uri: str, text: str) -> Pairing | ReferenceProblem | None:
        """The reference of a .py candidate; a named reference that is missing becomes a diagnostic, and a file
        that stopped being a candidate loses its verification."""
        try:
            path = uri_to_path(uri)
        except ValueError:
            return None
        found = self.settings.find_reference(path, text) if path.suffix == ".py" else None
        if isinstance(found, ReferenceProblem):
            self._forget(uri)
            self._publish(uri, [Finding(uri, Range.line(found.line), Severity.ERROR, SOURCE,
                                        "verify-reference-error", found.message)])
        elif isinstance(found, Pairing) and any(f.code == "verify-reference-error"
                                                for f in self.store.findings(uri, self._producer(uri))):
            self._publish(uri, [])  # the reference is found again
        elif found is None and (uri in self._published or uri in self._runs):
            self._forget(uri)
            self._publish(uri, [])
            self._published.pop(uri, None)
        return found

    def _dependents(self, saved_uri: str) -> list[tuple[str, Pairing]]:
        """Open candidates that build the saved file with cpp_extension.load, or whose reference it is."""
        try:
            saved = uri_to_path(saved_uri)
        except ValueError:
            return []
        open_py = {}
        for document in self._documents().values():
            try:
                path = uri_to_path(document.uri)
            except ValueError:
                continue
            if path.suffix == ".py" and document.uri != saved_uri:
                open_py[path] = document
        workspace, pairs, roots = self.settings.pairing_context()
        stale = files_to_reverify(saved, {p: d.source for p, d in open_py.items()}, workspace=workspace,
                                  settings_pairs=pairs, kernelbench_roots=roots)
        dependents = []
        for path in stale:
            document = open_py[path]
            found = self._pair(document.uri, document.source)
            if isinstance(found, Pairing):
                dependents.append((document.uri, found))
        return dependents

    # --- running ---------------------------------------------------------------------------------------------

    def _start(self, uri: str, pairing: Pairing, background: bool = False,
               texts: Mapping[Path, str] | None = None) -> asyncio.Task:
        old = self._tasks.pop(uri, None)
        if old is not None:
            old.cancel()
        if background:
            self._background.add(uri)
        else:
            self._background.discard(uri)
        previous = self._runs.get(uri)
        if previous is not None and previous.state == "running":
            previous = None
        self._runs[uri] = VerifyRun("running", pairing.reference)
        task = asyncio.ensure_future(self._run(uri, pairing, previous, texts))
        self._tasks[uri] = task
        self._refresh_lenses()
        return task

    async def _run(self, uri: str, pairing: Pairing, previous: VerifyRun | None,
                   texts: Mapping[Path, str] | None = None) -> dict[str, Any]:
        progress = None
        try:
            if uri in self._background:
                async with self._background_turn:
                    await self._wait_for_open_runs(uri)
                    log.info("verifying %s (closed) against %s (%s)", pairing.candidate.name, pairing.reference,
                             pairing.how)
                    run = await self._outcome(uri, pairing, None, texts)
            else:
                log.info("verifying %s against %s (%s)", pairing.candidate.name, pairing.reference, pairing.how)
                progress = await self._begin_progress(pairing)
                run = await self._outcome(uri, pairing, progress, texts)
        except asyncio.CancelledError:
            self._end_progress(progress, "cancelled")
            if self._tasks.get(uri) is asyncio.current_task():  # cancelled by the user, not replaced by a newer run
                self._tasks.pop(uri)
                self._runs[uri] = previous or VerifyRun("idle", pairing.reference)
                self._refresh_lenses()
            raise
        self._end_progress(progress, run.summary)
        outcome = {"uri": uri, "status": "ok" if run.state == "done" else "unavailable", "verdict": run.verdict,
                   "summary": run.summary}
        if self._tasks.get(uri) is not asyncio.current_task():
            return outcome  # the document closed meanwhile
        self._tasks.pop(uri)
        self._background.discard(uri)
        findings = run.findings
        if run.state == "done":
            self._runs[uri] = VerifyRun("done", pairing.reference, run.text, summary=run.summary)
            self._remember(run.key, run.summary, findings)
        else:
            self._runs[uri] = VerifyRun("unavailable", pairing.reference, run.text, message=run.summary)
            findings = [unavailable_finding(uri, run.summary)]
        self._publish(uri, findings)
        self._refresh_lenses()
        if run.verified is not None:
            self._events.publish(CANDIDATE_VERIFIED, uri, pairing, run.verified)
        log.info("%s: %s", pairing.candidate.name, run.summary)
        return {**outcome, "findings": len(findings)}

    async def _wait_for_open_runs(self, uri: str) -> None:
        """A background run starts only while no open document's run is going (the GPU goes to what the user
        looks at first)."""
        while any(other not in self._background and not task.done()
                  for other, task in self._tasks.items() if other != uri):
            await asyncio.sleep(0.1)

    async def _outcome(self, uri: str, pairing: Pairing, progress: str | None,
                       texts: Mapping[Path, str] | None) -> RunResult:
        """The job built and run on the worker; what it left, or why it could not run."""
        key = text = None
        try:
            job = candidate_job(pairing, self.settings.settings, texts)
            key, text = job.content_hash, job.source_files[job.config["candidate"]]
            client = self.worker.client(self.settings.settings)
            result = await client.run(job, progress=lambda m, f: self._report_progress(progress, m, f))
        except WorkerUnavailable as exc:
            return RunResult("unavailable", str(exc), key=key, text=text)
        except OSError as exc:
            return RunResult("unavailable", f"cannot read the files to verify: {exc}", key=key, text=text)
        except Exception as exc:  # a bug here becomes a diagnostic, not a lens stuck on "verifying…"
            log.exception("verifying %s failed", uri)
            return RunResult("unavailable", f"kernel-lsp could not verify this file ({type(exc).__name__}: {exc})",
                             key=key, text=text)
        state, summary, findings = outcome_of(result)
        verdict = VerifyOutcome.of(result).verdict
        return RunResult(state, summary, findings, key=key, text=text,
                         verified=job if verdict == "verified" else None, verdict=verdict)

    # --- verdicts across restarts ---------------------------------------------------------------------------

    def _remember(self, key: str | None, summary: str, findings: list[Finding]) -> None:
        disk = self._results.disk if self._results is not None else None
        if disk is not None and key:
            disk.put(key, {"kind": REMEMBERED, "summary": summary, "at": time.time(),
                           "findings": [f.to_dict() for f in findings]})

    def kept_verdicts(self, paths: list[Path]) -> list[tuple[str, VerifyRun, list[Finding]]]:
        """In a thread, at start-up: (URI, run, findings) of each closed candidate among `paths` whose verdict is
        kept for its files as they are on disk; a restart shows them before the files are opened."""
        if self._results is None or self._results.disk is None:
            return []
        kept = []
        for path in paths:
            text = read_regular_text(path) if path.suffix == ".py" else None
            if text is None or "ModelNew" not in text:  # no candidate: not parsed
                continue
            found = self.settings.find_reference(path, text)
            remembered = self._remembered(found, texts=None) if isinstance(found, Pairing) else None
            if remembered is not None:
                kept.append((path_to_uri(path), *remembered))
        return kept

    def show_kept(self, kept: list[tuple[str, VerifyRun, list[Finding]]]) -> None:
        """The verdicts kept_verdicts found: published and on the workspace summary, each unless its file was opened
        or verified since (what that showed is newer)."""
        shown = False
        for uri, run, findings in kept:
            if uri in self._runs or self._document(uri) is not None:
                continue
            self._runs[uri] = run
            self._publish(uri, findings)
            shown = True
        if shown:
            self._refresh_lenses()

    def _remembered(self, pairing: Pairing, texts: Mapping[Path, str] | None) -> tuple[VerifyRun, list[Finding]] | None:
        """The verdict kept for the files as `texts` has them (the editor's buffers; None: as on disk), by the job's
        content-addressed key."""
        disk = self._results.disk if self._results is not None else None
        if disk is None:
            return None
        try:
            job = candidate_job(pairing, self.settings.settings, texts)
        except OSError:
            return None
        value = disk.get(job.content_hash)
        if not value or value.get("kind") != REMEMBERED:
            return None
        try:
            findings = [Finding.from_dict(f) for f in value.get("findings") or []]
            summary = f"{value['summary']} ({age(time.time() - float(value['at']))})"
        except (KeyError, TypeError, ValueError):  # an entry of another layout: verified again when asked
            return None
        return VerifyRun("done", pairing.reference, job.source_files[job.config["candidate"]], summary=summary), findings

    # --- publishing ------------------------------------------------------------------------------------------

    def _publish(self, candidate_uri: str, findings: list[Finding]) -> None:
        """The candidate's findings, each on its own file (a .cu, the reference), replacing its earlier ones."""
        settings = self.settings.settings
        self._published[candidate_uri] = self.store.set_per_file(
            self._producer(candidate_uri), candidate_uri, [f for f in findings if not settings.is_ignored(f.code)],
            self._published.get(candidate_uri, set()), self._documents())

    def _forget(self, uri: str) -> None:
        task = self._tasks.pop(uri, None)
        if task is not None:
            task.cancel()
        if self._runs.pop(uri, None) is not None:
            self._refresh_lenses()

    @staticmethod
    def _producer(candidate_uri: str) -> str:
        # one producer per candidate: two candidates loading the same .cu keep each other's findings
        return f"{PRODUCER}:{candidate_uri}"

    def _uris_by_path(self) -> dict[Path, str]:
        return uris_by_path(self._documents().values())

    def _open_texts(self) -> dict[Path, str]:
        return open_texts(self._documents().values())

    def _document(self, uri: str) -> OpenDocument | None:
        return next((d for d in self._documents().values() if d.uri == uri), None)

    def _version(self, uri: str) -> int | None:
        document = self._document(uri)
        return document.version if document is not None else None

    # --- $/progress ------------------------------------------------------------------------------------------

    async def _begin_progress(self, pairing: Pairing) -> str | None:
        against = "itself" if pairing.reference == pairing.candidate else pairing.reference.name
        return await self._progress.begin("verify", f"Verifying {pairing.candidate.name}", f"against {against}")

    def _report_progress(self, token: str | None, message: str, fraction: float | None) -> None:
        self._progress.report(token, message, fraction)

    def _end_progress(self, token: str | None, message: str) -> None:
        self._progress.end(token, message)


def setup(server: KernelLanguageServer) -> VerifyFeature:
    return VerifyFeature(server.diagnostics, server.settings, server.get_feature(WorkerFeature),
                         documents=server.open_documents, progress=server.work_done_progress,
                         supports_progress=server.supports_work_done_progress,
                         tell_user=lambda m: server.show(m, types.MessageType.Warning),
                         refresh_lenses=server.refresh_code_lenses, results=server.results,
                         lens_notes=server.lens_notes, events=server.events)
