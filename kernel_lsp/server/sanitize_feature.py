"""Memory safety in the editor: the "Check memory safety (compute-sanitizer)" action on a kernel of a `.py` candidate
or of a standalone `.cu` program (`kernel-lsp.sanitize` [uri]), and, with `sanitizeAfterVerify`, the same check
after a verification that passed, for content not checked before. Both run the worker's "sanitize" job
(kernel_lsp/kinds/sanitize.py), the action on the files as the editor shows them, the check after verification on
the texts verified, with $/progress, and publish its `sanitizer-*` findings on the candidate's files under a
producer of their own: a new check replaces the previous check's findings and nothing else.

A check takes minutes: a file the editor shows with another text than the one checked (edited meanwhile, or unsaved
when a check after verification read the disk) gets none of its findings, their lines being the old text's, and the
user is told. A check that could not sanitize anything (no GPU, no compute-sanitizer) is said in a message and
publishes nothing; after verification, each such reason (the missing GPU first of all) is said once per session.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from kernel_lsp.findings import Finding, uri_to_path
from kernel_lsp.kinds.sanitize import (
    SanitizeOutcome,
    client_timeout_s,
    sanitize_job,
    sanitize_options,
)
from kernel_lsp.compile.units import CUDA_SUFFIXES
from kernel_lsp.profile.locations import kernel_locations
from kernel_lsp.profile.program import has_main
from kernel_lsp.profile.sanitize import NO_GPU, NO_GPU_CODE
from kernel_lsp.server.convert import CannotRun, OpenDocument, command_action, kind_requested, open_texts
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.events import CANDIDATE_VERIFIED
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.settings import SettingsManager
from kernel_lsp.server.work_progress import WorkProgress
from kernel_lsp.server.worker_feature import WorkerFeature
from kernel_lsp.verify.pairing import Pairing, ReferenceProblem
from kernel_lsp.worker.client import WorkerUnavailable
from kernel_lsp.worker.protocol import Job

if TYPE_CHECKING:
    from kernel_lsp.server.language_server import KernelLanguageServer

log = logging.getLogger(__name__)

PRODUCER = "sanitize"
SANITIZE_COMMAND = "kernel-lsp.sanitize"
SANITIZE_ACTION_KIND = "refactor.inspect.sanitizeKernel"  # beside "Profile this kernel"
SANITIZE_ACTION_TITLE = "Check memory safety (compute-sanitizer)"
NOT_A_CANDIDATE = ("not a candidate: compute-sanitizer runs a ModelNew with its reference's inputs (Model in the "
                   "same file, a '# kernel-lsp: reference=PATH' header, the 'references' setting or a KernelBench "
                   "problem name)")
NO_GPU_HERE = f"{NO_GPU}: connect a GPU worker (the `worker` setting) to check memory safety"
REMEMBERED_KEYS = 256  # sanitize job keys kept as checked: a verification of one of them checks nothing again


# ---- the pure parts ----------------------------------------------------------------------------------------


class RecentKeys:
    """The last `size` keys added (the oldest forgotten first)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._keys: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self._size:
            self._keys.popitem(last=False)

    def discard(self, key: str) -> None:
        self._keys.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)


def placeable(findings: Sequence[Finding], checked: Mapping[Path, str], shown: Mapping[Path, str]
              ) -> tuple[list[Finding], list[Finding], list[Path]]:
    """(the findings that fit what the editor shows, those held back, the files edited since the check read them).
    A file shown with another text than the one checked gets none of its findings: their lines are the old text's.
    A file not open, or open with the text checked, gets its own."""
    shown_now = {path.resolve(): text for path, text in shown.items()}
    edited = {path for path, text in ((p.resolve(), t) for p, t in checked.items())
              if path in shown_now and shown_now[path] != text}
    placed: list[Finding] = []
    held: list[Finding] = []
    for finding in findings:
        (held if _path_of(finding.uri) in edited else placed).append(finding)
    return placed, held, sorted(edited)


def job_texts(job: Job) -> dict[Path, str]:
    """A job's files by their paths on this machine: the texts it checked."""
    origins = job.config.get("origins") or {}
    return {Path(origins.get(name, name)): text for name, text in job.source_files.items()}


def candidate_of(job: Job) -> Path:
    """A candidate's job's candidate, by its path on this machine."""
    return Path((job.config.get("origins") or {}).get(job.config["candidate"], job.config["candidate"]))


def verified_files(job: Job) -> tuple[Path, Path | None, dict[Path, str]]:
    """(candidate, reference or None when the candidate is its own, the texts verified) of a "verify" job: what a
    sanitize job of the same content is built from."""
    origins = job.config.get("origins") or {}
    reference = job.config.get("reference")
    own = reference is None or reference == job.config["candidate"]
    return candidate_of(job), None if own else Path(origins.get(reference, reference)), job_texts(job)


def not_sanitized_reason(error: str, code: str | None = None) -> str:
    """The sentence to tell the user: the worker's, without the job's wording around a missing GPU (known by the
    result's code, not by its sentence)."""
    return NO_GPU_HERE if code == NO_GPU_CODE else error


# ---- the feature -------------------------------------------------------------------------------------------


class SanitizeFeature(Feature):
    code_action_kinds = (SANITIZE_ACTION_KIND,)

    def __init__(self, store: DiagnosticStore, settings: SettingsManager, worker: WorkerFeature,
                 documents: Callable[[], Mapping[str, OpenDocument]], progress: WorkProgress,
                 tell_user: Callable[..., None]) -> None:
        self.store = store
        self.settings = settings
        self.worker = worker
        self._documents = documents
        self._progress = progress
        self._tell_user = tell_user  # (message, kind=Warning): window/showMessage
        self._tasks: dict[str, asyncio.Task] = {}  # candidate URI -> its check running
        self._published: dict[str, set[str]] = {}  # candidate URI -> URIs holding its findings
        self._checked = RecentKeys(REMEMBERED_KEYS)  # sanitize job keys checked or being checked
        self._said: set[str] = set()  # why checks after verification did not run, said once each this session

    # --- documents and the server's life --------------------------------------------------------------------

    def document_close(self, uri: str) -> None:
        task = self._tasks.pop(uri, None)
        if task is not None:
            task.cancel()
        for other in self._published.pop(uri, set()) - {uri}:  # the candidate's own URI is cleared on close
            document = self._documents().get(other)
            self.store.set(other, self._producer(uri), document.version if document is not None else None, [])

    def commands(self) -> dict[str, Callable[[tuple[Any, ...]], Any]]:
        return {SANITIZE_COMMAND: self.sanitize_command}

    async def shutdown(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()

    # --- the code action ------------------------------------------------------------------------------------

    def code_actions(self, uri: str, span: types.Range, only: Sequence[str] | None,
                     disabled_shown: bool) -> list[types.CodeAction]:
        """On a kernel's name in a `.py` candidate (Triton, CuTe DSL, a load_inline CUDA string) or in a standalone
        `.cu` program; one that cannot run says why (disabled, or in its title: convert.command_action)."""
        if not kind_requested(SANITIZE_ACTION_KIND, only):
            return []
        document = self._documents().get(uri)
        try:
            path = uri_to_path(uri)
        except ValueError:
            return []
        if document is None:
            return []
        if not (path.suffix == ".py" or path.suffix in CUDA_SUFFIXES and has_main(document.source)):
            return []  # a .py candidate, or a standalone .cu program (its own main())
        kernels = kernel_locations({path.name: document.source}, {path.name: str(path)})
        if not any(span.start.line <= k.range.start.line <= span.end.line for k in kernels.values()):
            return []
        return [command_action(SANITIZE_ACTION_TITLE, SANITIZE_ACTION_KIND, SANITIZE_COMMAND, [uri],
                               self._cannot_sanitize(path, document.source), disabled_shown)]

    def _cannot_sanitize(self, path: Path, text: str) -> CannotRun | None:
        """Why the check cannot run, known before any job: no reference for a `.py`, or no GPU on the worker."""
        if path.suffix == ".py":  # a program (.cu) is built and run as it is, no reference
            found = self.settings.find_reference(path, text)
            if isinstance(found, ReferenceProblem):
                return CannotRun("no reference", found.message)
            if not isinstance(found, Pairing):
                return CannotRun("not a candidate", NOT_A_CANDIDATE)
        return CannotRun("needs a GPU", NO_GPU_HERE) if self.worker.gpu_missing(self.settings.settings) else None

    # --- the command ----------------------------------------------------------------------------------------

    async def sanitize_command(self, args: tuple[Any, ...]) -> dict[str, Any]:
        """kernel-lsp.sanitize [uri] or [{"uri"}]: the candidate under compute-sanitizer, its files as the editor
        shows them (unsaved buffers included), whatever sanitizeAfterVerify says; answers with the outcome."""
        first = args[0] if args else None
        uri = first.get("uri") if isinstance(first, dict) else first
        if not isinstance(uri, str):
            return {"status": "error", "message": f"{SANITIZE_COMMAND} needs the document URI as its argument"}
        try:
            path = uri_to_path(uri)
            document = self._documents().get(uri)
            text = document.source if document is not None else path.read_text(encoding="utf-8", errors="replace")
            cannot = self._cannot_sanitize(path, text)  # asked before any job, as the menu asked it
            if cannot is None:
                job = sanitize_job(path, self._reference(path, text), sanitize_options(self.settings.settings),
                                   open_texts(self._documents().values()))
        except (ValueError, OSError) as exc:
            message = f"cannot check {uri} for memory safety: {exc}"
            self._tell_user(f"kernel-lsp: {message}")
            return {"uri": uri, "status": "error", "message": message}
        if cannot is not None:
            self._say_not_sanitized(path.name, cannot.reason, once=False)
            return {"uri": uri, "status": "unavailable", "message": cannot.reason}
        task = self._start(uri, job, after_verify=False)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # a newer check took its place, the document closed, or the user cancelled
                return {"uri": uri, "status": "cancelled"}
            raise

    def _reference(self, path: Path, text: str) -> Path | None:
        """A .py candidate's reference, as verification pairs it (None: the candidate is its own, or a .cu)."""
        if path.suffix != ".py":
            return None
        found = self.settings.find_reference(path, text)
        if isinstance(found, ReferenceProblem):
            raise ValueError(found.message)
        return found.reference if isinstance(found, Pairing) and found.reference != path else None

    # --- after verification ---------------------------------------------------------------------------------

    def after_verify(self, uri: str, pairing: Pairing, verified: Job) -> None:
        """VerifyFeature's hook: a candidate verified; with sanitizeAfterVerify, the content verified is checked in
        the background unless it was checked before."""
        settings = self.settings.settings
        if not settings.sanitize.after_verify:
            return
        if self.worker.gpu_missing(settings):  # no job to learn it again: said once
            self._say_not_sanitized(pairing.candidate.name, NO_GPU_HERE, once=True)
            return
        try:
            candidate, reference, texts = verified_files(verified)
            job = sanitize_job(candidate, reference, sanitize_options(settings), texts)
        except (KeyError, ValueError, OSError) as exc:
            log.warning("no memory safety check after verifying %s: %s", uri, exc)
            return
        if job.content_hash in self._checked:
            log.info("%s: this content was checked for memory safety already", candidate.name)
            return
        self._start(uri, job, after_verify=True)

    # --- running --------------------------------------------------------------------------------------------

    def _start(self, uri: str, job: Job, after_verify: bool) -> asyncio.Task:
        old = self._tasks.pop(uri, None)
        if old is not None:
            old.cancel()
        self._checked.add(job.content_hash)
        task = asyncio.ensure_future(self._run(uri, job, after_verify))
        self._tasks[uri] = task
        return task

    async def _run(self, uri: str, job: Job, after_verify: bool) -> dict[str, Any]:
        name = candidate_of(job).name
        settings = self.settings.settings
        token = None
        try:
            options = sanitize_options(settings)
            token = await self._progress.begin("sanitize", f"Checking memory safety of {name}",
                                               f"compute-sanitizer: {', '.join(options.tools)}")
            result = await self.worker.client(settings).run(
                job, progress=lambda message, fraction: self._progress.report(token, message, fraction),
                timeout_s=client_timeout_s(options, settings))
            outcome = SanitizeOutcome.of(result)
            error, code = outcome.error, outcome.code
        except asyncio.CancelledError:
            self._progress.end(token, "cancelled")
            self._checked.discard(job.content_hash)
            if self._tasks.get(uri) is asyncio.current_task():
                self._tasks.pop(uri)
            raise
        except WorkerUnavailable as exc:
            outcome, error, code = None, str(exc), None
        except Exception as exc:  # a bug here is a message, never a dead server
            log.exception("checking %s for memory safety failed", uri)
            outcome, error, code = None, f"kernel-lsp could not run the check ({type(exc).__name__}: {exc})", None
        current = self._tasks.get(uri) is asyncio.current_task()
        if current:
            self._tasks.pop(uri)
        if error is not None or outcome is None:
            reason = not_sanitized_reason(error or "no outcome", code)
            self._progress.end(token, f"not checked: {reason}")
            self._say_not_sanitized(name, reason, once=after_verify)
            return {"uri": uri, "status": "unavailable", "message": reason}
        self._progress.end(token, outcome.summary)
        answer = {"uri": uri, "status": "ok", "summary": outcome.summary, "clean": outcome.clean}
        if not current:
            return {**answer, "findings": 0}  # the document closed meanwhile: nothing to show it on
        shown, held = self._publish(uri, job, outcome.findings)
        if token is None and not after_verify:  # no progress to end with the summary: said once done
            self._tell_user(f"kernel-lsp: {name}: {outcome.summary}", types.MessageType.Info)
        log.info("%s: %s", name, outcome.summary)
        return {**answer, "findings": shown, "heldBack": held}

    def _publish(self, uri: str, job: Job, findings: list[Finding]) -> tuple[int, int]:
        """The check's findings on the files that still show the text checked, replacing this candidate's earlier
        check; (how many shown, how many held back)."""
        settings = self.settings.settings
        kept = [f for f in findings if not settings.is_ignored(f.code)]
        placed, held, edited = placeable(kept, job_texts(job), open_texts(self._documents().values()))
        self._published[uri] = self.store.set_per_file(self._producer(uri), uri, placed,
                                                       self._published.get(uri, set()), self._documents())
        if held:
            files = ", ".join(path.name for path in edited)
            self._tell_user(f"kernel-lsp: {files} shows another text than compute-sanitizer checked: {len(held)} of "
                            "its findings are not shown, their lines are the checked text's; check again to see them")
        return len(placed), len(held)

    def _say_not_sanitized(self, name: str, reason: str, once: bool) -> None:
        if once:
            if reason in self._said:
                log.info("%s not checked for memory safety: %s", name, reason)
                return
            self._said.add(reason)
        self._tell_user(f"kernel-lsp: {name} not checked for memory safety: {reason}")

    @staticmethod
    def _producer(candidate_uri: str) -> str:
        # one producer per candidate: two candidates loading the same .cu keep each other's findings
        return f"{PRODUCER}:{candidate_uri}"


def _path_of(uri: str) -> Path | None:
    try:
        return uri_to_path(uri).resolve()
    except ValueError:
        return None


def setup(server: KernelLanguageServer) -> SanitizeFeature:
    sanitize = SanitizeFeature(server.diagnostics, server.settings, server.get_feature(WorkerFeature),
                               documents=server.open_documents,
                               progress=WorkProgress(server.work_done_progress, server.supports_work_done_progress),
                               tell_user=lambda m, kind=types.MessageType.Warning: server.show(m, kind))
    server.events.subscribe(CANDIDATE_VERIFIED, sanitize.after_verify)  # sanitizeAfterVerify
    return sanitize
