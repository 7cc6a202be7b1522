"""The "Optimize this kernel" code action: on a kernel name or `class ModelNew` of a verification candidate runs one
agent pass (kernel_lsp.agent.loop.Optimizer, built as `kernel-lsp optimize` builds it) as a task per document. On
`class Model` of a problem file without ModelNew (a KernelBench problem) the pass writes the first ModelNew itself,
and its best verified candidate is offered as a new file beside the problem, NAME_new.py, with a
`# kernel-lsp: reference=NAME.py` header so that the editor pairs it (offered when it verified, however fast: it
replaces nothing).

`$/progress` shows the stage, the best verified speedup so far and the spend; its cancel button stops the pass
(the trajectory and the side file are still written). At the end a verified improvement is offered as a
`workspace/applyEdit` replacing the whole document, under a change annotation that needs confirmation, so the
editor shows a preview first; a client without change annotations is asked with `window/showMessageRequest`.
Nothing is applied when the document changed during the pass: the user is told where the side file is.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from kernel_lsp.agent.credentials import api_key
from kernel_lsp.config import Settings
from kernel_lsp.compile.units import CUDA_SUFFIXES
from kernel_lsp.findings import path_to_uri, uri_to_path
from kernel_lsp.jobs.files import load_sources
from kernel_lsp.kinds.verify import verify_options
from kernel_lsp.profile.locations import kernel_locations
from kernel_lsp.server.convert import CannotRun, OpenDocument, command_action, kind_requested, open_texts
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.settings import SettingsManager, api_key_remedy
from kernel_lsp.server.work_progress import WorkProgress
from kernel_lsp.server.worker_feature import WorkerFeature
from kernel_lsp.sources import parse_python
from kernel_lsp.verify.pairing import Pairing, ReferenceProblem

if TYPE_CHECKING:  # the anthropic SDK takes ~2 s to import: the first pass pays for it, in a thread
    from kernel_lsp.server.language_server import KernelLanguageServer
    from kernel_lsp.agent.loop import Optimizer, PassOutcome, ProgressEvent

log = logging.getLogger(__name__)

OPTIMIZE_COMMAND = "kernel-lsp.optimize"
OPTIMIZE_ACTION_KIND = "refactor.rewrite.optimizeKernel"  # a rewrite of the code under the cursor: in the lightbulb
OPTIMIZE_ACTION_TITLE = "Optimize this kernel"
NOT_A_CANDIDATE = ("not an optimization candidate: no ModelNew with a reference (Model in the same file, a "
                   "'# kernel-lsp: reference=PATH' header, the 'references' setting or a KernelBench problem name)")
MAX_NEIGHBOURS = 200  # .py files read beside a .cu to find the candidate that builds it
ANNOTATION_ID = "kernel-lsp.optimize"
APPLY, KEEP = "Apply", "Keep mine"
_PROGRESS_MESSAGE_CHARS = 160

Tell = Callable[[str, types.MessageType], None]


@dataclass(frozen=True)
class PassStart:
    """What one pass started from: the edit is offered only if the document still holds `text`."""

    uri: str
    path: Path
    reference: Path
    text: str
    start_text: str  # what the pass starts from: the document's text, or '' for a problem file
    new_file: Path | None = None  # a problem file's pass: where its candidate goes


class OptimizeFeature(Feature):
    code_action_kinds = (OPTIMIZE_ACTION_KIND,)

    def __init__(self, settings: SettingsManager, worker: WorkerFeature,
                 documents: Callable[[], Mapping[str, OpenDocument]], progress: WorkProgress, tell_user: Tell,
                 apply_edit: Callable[[types.ApplyWorkspaceEditParams], Awaitable[types.ApplyWorkspaceEditResult]],
                 ask_user: Callable[[types.ShowMessageRequestParams], Awaitable[types.MessageActionItem | None]],
                 supports_annotations: Callable[[], bool],
                 supports_file_creation: Callable[[], bool] = lambda: False) -> None:
        self.settings = settings
        self.worker = worker
        self._documents = documents
        self._progress = progress
        self._tell_user = tell_user
        self._apply_edit = apply_edit
        self._ask_user = ask_user
        self._supports_annotations = supports_annotations
        self._supports_file_creation = supports_file_creation
        self._tasks: dict[str, asyncio.Task] = {}  # document URI -> its running pass

    # --- code action ----------------------------------------------------------------------------------------

    def code_actions(self, uri: str, span: types.Range, only: Sequence[str] | None,
                     disabled_shown: bool) -> list[types.CodeAction]:
        """On a kernel's name (a `.py`'s, or a `.cu`'s through the candidate that builds it), `class ModelNew`, or
        `class Model` of a problem file. One that cannot run says why the command would say (disabled, or in its
        title: convert.command_action)."""
        if not kind_requested(OPTIMIZE_ACTION_KIND, only):
            return []
        document = self._documents().get(uri)
        if document is None:
            return []
        try:
            path = uri_to_path(uri)
        except ValueError:
            return []
        if path.suffix in CUDA_SUFFIXES:
            kernel = next((name for name, location in kernel_locations({path.name: document.source},
                                                                       {path.name: str(path)}).items()
                           if span.start.line <= location.range.start.line <= span.end.line), None)
            if kernel is None:
                return []
            found = self._candidate_building(path)
            if found is None:
                return [command_action(f"{OPTIMIZE_ACTION_TITLE} ({kernel})", OPTIMIZE_ACTION_KIND, OPTIMIZE_COMMAND,
                                       [uri], no_candidate_builds(path), disabled_shown)]
            title, run_uri = f"{OPTIMIZE_ACTION_TITLE} ({kernel}, through {found[0].name})", path_to_uri(found[0])
        else:
            target = _target_at(uri, document.source, span)
            if target is None:
                return []
            run_uri = uri
            title = (f"{OPTIMIZE_ACTION_TITLE} (a new ModelNew in {new_candidate_path(path).name})"
                     if target == "Model" else f"{OPTIMIZE_ACTION_TITLE} ({target})")
        start = self._pass_start(run_uri)
        cannot = start if isinstance(start, CannotRun) else self._no_key()
        return [command_action(title, OPTIMIZE_ACTION_KIND, OPTIMIZE_COMMAND, [run_uri], cannot, disabled_shown)]

    def _no_key(self) -> CannotRun | None:
        if self.settings.settings.agent.api_key or api_key():
            return None
        return CannotRun("no Anthropic API key", f"no Anthropic API key: {api_key_remedy(self.settings.client)}")

    def _candidate_building(self, path: Path) -> tuple[Path, str] | None:
        """The `.py` candidate (and its text) whose ModelNew builds the `.cu` at `path`: an open one, or one beside
        it."""
        return next(((candidate, text) for candidate, text in self._py_files_near(path)
                     if path.resolve() in load_sources(candidate, text)), None)

    def _py_files_near(self, path: Path) -> list[tuple[Path, str]]:
        """The open `.py` documents, then the `.py` files in the `.cu`'s folder (at most MAX_NEIGHBOURS)."""
        found = {open_path.resolve(): text for open_path, text in open_texts(self._documents().values()).items()
                 if open_path.suffix == ".py"}
        try:
            neighbours = sorted(path.parent.glob("*.py"))[:MAX_NEIGHBOURS]
        except OSError:
            neighbours = []
        for neighbour in neighbours:
            if neighbour.resolve() not in found:
                text = _read(neighbour)
                if text is not None and "cpp_extension" in text:
                    found[neighbour.resolve()] = text
        return list(found.items())

    # --- the command ----------------------------------------------------------------------------------------

    def commands(self) -> dict[str, Any]:
        return {OPTIMIZE_COMMAND: self.optimize_command}

    async def optimize_command(self, args: tuple[Any, ...]) -> dict[str, Any]:
        """kernel-lsp.optimize [uri]: starts a pass and answers at once; the pass ends with an edit or a message. What
        keeps it from starting is asked as the menu asked it, and said in one message."""
        uri = args[0].get("uri") if args and isinstance(args[0], dict) else (args[0] if args else None)
        if not isinstance(uri, str):
            return {"status": "error", "message": f"{OPTIMIZE_COMMAND} needs the document URI as its argument"}
        start = self._pass_start(uri)
        if isinstance(start, CannotRun):
            self._tell_user(f"kernel-lsp: {_name(uri)}: {start.reason}", types.MessageType.Warning)
            return {"uri": uri, "status": "not-a-candidate", "message": start.reason}
        running = self._tasks.get(start.uri)
        if running is not None and not running.done():
            message = (f"kernel-lsp: an optimization pass is already running on {start.path.name}; cancel it to "
                       "start again")
            self._tell_user(message, types.MessageType.Info)
            return {"uri": uri, "status": "running", "message": message}
        settings = self.settings.settings
        no_key = self._no_key()
        if no_key:
            message = f"kernel-lsp: {no_key.reason}, to let the agent call Claude"
            self._tell_user(message, types.MessageType.Error)
            return {"uri": uri, "status": "error", "message": message}
        try:
            await asyncio.to_thread(importlib.import_module, "kernel_lsp.agent.loop")  # off the event loop
            optimizer = self._optimizer(start, settings)
        except Exception as exc:  # e.g. the trajectory folder cannot be made: said once, the server goes on
            log.exception("cannot start an optimization pass on %s", uri)
            message = f"kernel-lsp: cannot start optimizing {start.path.name}: {type(exc).__name__}: {exc}"
            self._tell_user(message, types.MessageType.Error)
            return {"uri": uri, "status": "error", "message": message}
        task = asyncio.ensure_future(self._run(start, optimizer))
        self._tasks[start.uri] = task
        return {"uri": uri, "status": "started", "reference": str(start.reference),
                "trajectory": str(optimizer.trajectory.path)}

    def _pass_start(self, uri: str) -> PassStart | CannotRun:
        """The pass's starting point, or why there is none. A `.cu` starts from the candidate that builds it."""
        try:
            path = uri_to_path(uri)
        except ValueError:
            return CannotRun("not a file", "not a file")
        if path.suffix in CUDA_SUFFIXES:
            found = self._candidate_building(path)
            if found is None:
                return no_candidate_builds(path)
            path, uri = found[0], path_to_uri(found[0])
        document = self._documents().get(uri)
        text = document.source if document is not None else _read(path)
        if text is None:
            return CannotRun("cannot read the file", "cannot read the file")
        parts = parse_python(text).kernelbench if path.suffix == ".py" else None
        if parts is not None and parts.model is not None and parts.model_new is None:
            return PassStart(uri, path, path, text, "", new_candidate_path(path))
        found = self._pair(uri, text)
        if isinstance(found, ReferenceProblem):
            return CannotRun("no reference", found.message)
        if not isinstance(found, Pairing) or parse_python(text).kernelbench.model_new is None:
            return CannotRun("not a candidate", NOT_A_CANDIDATE)
        return PassStart(uri, path, found.reference, text, text)

    def _pair(self, uri: str, text: str) -> Pairing | ReferenceProblem | None:
        try:
            path = uri_to_path(uri)
        except ValueError:
            return None
        if path.suffix != ".py":
            return None
        return self.settings.find_reference(path, text)

    def _optimizer(self, start: PassStart, settings: Settings) -> Optimizer:
        """As `kernel-lsp optimize` builds one, from the settings alone; the server's worker, not a new one."""
        from kernel_lsp.agent.setup import build_optimizer, settings_budget

        workspace = self.settings.folders[0] if self.settings.folders else None
        return build_optimizer(start.path, start.reference, start.start_text, workspace, settings,
                               self.worker.client(settings), verify_options(settings, unattended=True),
                               settings_budget(settings))

    # --- the pass -------------------------------------------------------------------------------------------

    async def _run(self, start: PassStart, optimizer: Optimizer) -> None:
        """The pass, then its offer; the task stays the document's running pass until the user has answered."""
        token = None
        try:
            token = await self._progress.begin("optimize", f"Optimizing {start.path.name}",
                                               f"against {start.reference.name}")
            optimizer.on_event = lambda event: self._progress.report(token, progress_message(event), None)
            outcome = await optimizer.run()
            self._progress.end(token, outcome.improvement)
            token = None
            await self._offer(start, outcome)
        except asyncio.CancelledError:
            self._progress.end(token, "cancelled")
            self._cancelled(start, optimizer.outcome)
            raise
        except Exception as exc:  # a bug here is one message, never a dead server
            log.exception("optimizing %s failed", start.uri)
            self._progress.end(token, "failed")
            self._tell_user(f"kernel-lsp: optimizing {start.path.name} failed: {type(exc).__name__}: {exc}",
                            types.MessageType.Error)
        finally:
            if self._tasks.get(start.uri) is asyncio.current_task():
                self._tasks.pop(start.uri)

    async def _offer(self, start: PassStart, outcome: PassOutcome) -> None:
        name, side = start.path.name, outcome.side_file
        if outcome.error_kind is not None:
            kept = f"; the best so far is in {side}" if side else ""
            self._tell_user(f"kernel-lsp: optimizing {name} stopped: {outcome.stop_reason}{kept}",
                            types.MessageType.Error)
            if not outcome.improved:
                return
        if start.new_file is not None and outcome.best_source is not None:
            await self._offer_new_file(start, outcome)
            return
        if not outcome.improved or outcome.best_source is None:
            kept = (f"; the best attempt is kept in {side}" if side is not None
                    else "; no candidate got far enough to keep")
            self._tell_user(f"kernel-lsp: no verified improvement for {name}: {outcome.improvement} "
                            f"(stopped: {outcome.stop_reason}){kept}", types.MessageType.Info)
            return
        current, version = self._current(start)
        if current != start.text:
            self._tell_user(f"kernel-lsp: {name} changed during the optimization pass, so nothing was applied; "
                            f"the verified improvement ({outcome.improvement}) is in {side}", types.MessageType.Warning)
            return
        applied, reason = await self._apply(start, version, outcome)
        if not applied:
            self._tell_user(f"kernel-lsp: the optimized {name} was not applied ({reason}); it is in {side}",
                            types.MessageType.Info)

    async def _apply(self, start: PassStart, version: int | None, outcome: PassOutcome) -> tuple[bool, str]:
        label = f"Optimized {start.path.name}: {outcome.improvement}"
        return await self._send_edit(
            label, f"Apply it to {start.path.name}?", "you kept your version",
            lambda annotated: whole_document_edit(start.uri, version, start.text, outcome.best_source or "", label,
                                                  annotated))

    async def _send_edit(self, label: str, question: str, kept: str,
                         make_edit: Callable[[bool], types.WorkspaceEdit]) -> tuple[bool, str]:
        """workspace/applyEdit of make_edit(annotated): under a previewed change annotation where the client has
        them, else only after the user said Apply to `question`; (applied, why not)."""
        annotated = self._supports_annotations()
        if not annotated:  # no preview in this client: ask first, so nothing is applied without the user's say
            answer = await self._ask_user(types.ShowMessageRequestParams(
                type=types.MessageType.Info, message=f"kernel-lsp: {label}. {question}",
                actions=[types.MessageActionItem(title=APPLY), types.MessageActionItem(title=KEEP)]))
            if answer is None or answer.title != APPLY:
                return False, kept
        try:
            result = await self._apply_edit(types.ApplyWorkspaceEditParams(edit=make_edit(annotated), label=label))
        except Exception as exc:
            log.warning("workspace/applyEdit failed: %s", exc)
            return False, f"the editor answered: {exc}"
        return result.applied, result.failure_reason or "declined in the preview"

    async def _offer_new_file(self, start: PassStart, outcome: PassOutcome) -> None:
        """A problem file's pass: its best verified candidate as a new file, previewed; nothing is overwritten."""
        new, side = start.new_file, outcome.side_file
        assert new is not None
        current, _ = self._current(start)
        reason = ""
        if current != start.text:
            reason = f"{start.path.name} changed during the pass"
        elif new.exists():
            reason = f"{new.name} exists already"
        elif not self._supports_file_creation():
            reason = "this editor cannot create files through LSP (workspaceEdit.resourceOperations 'create')"
        if not reason:
            applied, reason = await self._apply_new_file(start, new, outcome)
            if applied:
                return
        self._tell_user(f"kernel-lsp: the candidate for {start.path.name} ({outcome.improvement}) was not created as "
                        f"{new.name} ({reason}); it is in {side}", types.MessageType.Info)

    async def _apply_new_file(self, start: PassStart, new: Path, outcome: PassOutcome) -> tuple[bool, str]:
        label = f"New {new.name} for {start.path.name}: {outcome.improvement}"
        text = paired_candidate(outcome.best_source or "", start.reference.name)
        return await self._send_edit(label, "Create it?", "you chose not to create it",
                                     lambda annotated: new_file_edit(new.as_uri(), text, label, annotated))

    def _cancelled(self, start: PassStart, outcome: PassOutcome | None) -> None:
        side = outcome.side_file if outcome is not None else None
        what = ("the best verified candidate so far" if outcome is not None and outcome.best_source
                else "the best attempt")
        kept = f"; {what} is in {side}" if side is not None else ""
        self._tell_user(f"kernel-lsp: optimizing {start.path.name} was cancelled{kept}", types.MessageType.Info)

    def _current(self, start: PassStart) -> tuple[str | None, int | None]:
        document = self._documents().get(start.uri)
        if document is not None:
            return document.source, document.version
        return _read(start.path), None


# ---- pure parts -----------------------------------------------------------------------------------------------


def progress_message(event: ProgressEvent) -> str:
    """One line: the stage, the best verified speedup so far (on the CPU: how many verified) and the spend."""
    best = event.best or ("nothing verified yet" if event.cpu else "nothing verified faster yet")
    spend = event.spend
    message = event.message if len(event.message) <= _PROGRESS_MESSAGE_CHARS \
        else event.message[:_PROGRESS_MESSAGE_CHARS - 1] + "…"
    return (f"{event.stage}: {message} · {best} · {spend['model_calls']} calls, ${spend['dollars']:.2f}, "
            f"{spend['evaluations']} evaluations")


def whole_document_edit(uri: str, version: int | None, old_text: str, new_text: str, label: str,
                        annotated: bool) -> types.WorkspaceEdit:
    """Replaces all of `old_text`; annotated: under a change annotation that needs confirmation (a preview)."""
    lines = old_text.split("\n")
    end = types.Position(line=len(lines) - 1, character=len(lines[-1].encode("utf-16-le")) // 2)
    span = types.Range(start=types.Position(line=0, character=0), end=end)
    identifier = types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version)
    if not annotated:
        return types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(
            text_document=identifier, edits=[types.TextEdit(range=span, new_text=new_text)])])
    return types.WorkspaceEdit(
        document_changes=[types.TextDocumentEdit(text_document=identifier, edits=[
            types.AnnotatedTextEdit(range=span, new_text=new_text, annotation_id=ANNOTATION_ID)])],
        change_annotations={ANNOTATION_ID: types.ChangeAnnotation(
            label="Optimize this kernel", needs_confirmation=True, description=label)})


def new_candidate_path(problem: Path) -> Path:
    """Where a problem file's first candidate goes: NAME_new.py beside NAME.py."""
    return problem.with_name(f"{problem.stem}_new.py")


def no_candidate_builds(cu: Path) -> CannotRun:
    return CannotRun(f"no candidate builds {cu.name}",
                     f"no candidate builds {cu.name}: write a .py whose ModelNew loads it with cpp_extension.load "
                     "(load_inline for the agent's rewrites), beside a reference")


def paired_candidate(source: str, reference_name: str) -> str:
    """The candidate's text with a `# kernel-lsp: reference=` header first, unless it names its reference already."""
    if any(line.startswith("# kernel-lsp: reference=") for line in source.splitlines()[:5]):
        return source
    return f"# kernel-lsp: reference={reference_name}\n{source}"


def new_file_edit(uri: str, text: str, label: str, annotated: bool) -> types.WorkspaceEdit:
    """Creates `uri` (never over an existing file) holding `text`; annotated: a preview first."""
    annotation = ANNOTATION_ID if annotated else None
    start = types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=0))
    insert = (types.AnnotatedTextEdit(range=start, new_text=text, annotation_id=ANNOTATION_ID) if annotated
              else types.TextEdit(range=start, new_text=text))
    edit = types.WorkspaceEdit(document_changes=[
        types.CreateFile(uri=uri, options=types.CreateFileOptions(overwrite=False, ignore_if_exists=False),
                         annotation_id=annotation),
        types.TextDocumentEdit(text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=None),
                               edits=[insert])])
    if annotated:
        edit.change_annotations = {ANNOTATION_ID: types.ChangeAnnotation(
            label="Optimize this kernel", needs_confirmation=True, description=label)}
    return edit


def _target_at(uri: str, text: str, span: types.Range) -> str | None:
    """The kernel whose name, or `ModelNew` when its class line, lies within the requested lines; `Model` on its
    class line in a problem file (Model and no ModelNew)."""
    try:
        path = uri_to_path(uri)
    except ValueError:
        return None
    if path.suffix != ".py":
        return None
    for name, location in kernel_locations({path.name: text}, {path.name: str(path)}).items():
        if span.start.line <= location.range.start.line <= span.end.line:
            return name
    parts = parse_python(text).kernelbench
    model_new = parts.model_new
    if model_new is not None and span.start.line <= model_new.def_range.start.line <= span.end.line:
        return "ModelNew"
    if model_new is None and parts.model is not None and span.start.line <= parts.model.def_range.start.line \
            <= span.end.line:
        return "Model"
    return None


def _name(uri: str) -> str:
    try:
        return uri_to_path(uri).name
    except ValueError:
        return uri


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def setup(server: KernelLanguageServer) -> OptimizeFeature:
    return OptimizeFeature(server.settings, server.get_feature(WorkerFeature),
                           documents=server.open_documents,
                           progress=WorkProgress(server.work_done_progress, server.supports_work_done_progress),
                           tell_user=server.show, apply_edit=server.workspace_apply_edit_async,
                           ask_user=server.window_show_message_request_async,
                           supports_annotations=server.supports_change_annotations,
                           supports_file_creation=server.supports_file_creation)
