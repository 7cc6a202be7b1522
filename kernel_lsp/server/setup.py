"""Thin dispatch from LSP messages to the features; no checking logic lives here.

The features register themselves: each module of FEATURE_MODULES ends with `setup(server)`, which builds its
feature from what the server offers and from the features set up before it (`server.get_feature(cls)`). Every LSP
message is then handed to each feature's hook in that order (kernel_lsp/server/feature.py), and each feature's
commands, custom methods and code action kinds are served as it declares them. Adding a feature is one module
and one line here."""

from __future__ import annotations

import importlib
import inspect
import logging
from urllib.parse import unquote
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from kernel_lsp import __version__
from kernel_lsp.jobs.cache import ResultCache
from kernel_lsp.server.connection import KernelProtocol
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.parsing import DocumentEvent, DocumentEvents
from kernel_lsp.server.settings import SECTION, SettingsManager

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Feature)

FEATURE_MODULES = (  # set up in this order: each may use those above it; document hooks run in this order too
    "kernel_lsp.server.compile_feature",
    "kernel_lsp.server.worker_feature",
    "kernel_lsp.server.verify_feature",
    "kernel_lsp.server.cute_dsl_feature",
    "kernel_lsp.server.profile_feature",
    "kernel_lsp.server.sanitize_feature",
    "kernel_lsp.server.optimize_feature",
    "kernel_lsp.server.workspace_feature",
)


class OpenDocuments(Mapping[str, Any]):
    """The open documents by URI. pygls keeps them under the percent-decoded URI; the features look them up by the
    URI the client sends (`file:///a%20b.cu`): a URI finds its document however it is percent-encoded, and iterating
    gives each document's URI as the client opened it.

    A document whose notifications wait for a parse (`waiting`, by percent-decoded URI) is what the features were
    last handed: not open yet, or its text before the change that waits; so no feature parses a big text on the loop
    because pygls already holds it."""

    def __init__(self, documents: Mapping[str, Any], waiting: Mapping[str, Any] | None = None) -> None:
        self._documents = documents
        self._waiting = waiting or {}

    def __getitem__(self, uri: str) -> Any:
        key = unquote(uri)
        if key in self._waiting:
            shown = self._waiting[key]
            if shown is None:
                raise KeyError(uri)
            return shown
        return self._documents[key]

    def __iter__(self) -> Iterator[str]:
        keys = [*self._documents, *(key for key in self._waiting if key not in self._documents)]
        shown = [self._waiting[key] if key in self._waiting else self._documents[key] for key in keys]
        return iter([document.uri for document in shown if document is not None])

    def __len__(self) -> int:
        return len(list(iter(self)))


class KernelLanguageServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("kernel-lsp", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
                         protocol_cls=KernelProtocol)
        self.settings = SettingsManager(warn=lambda m: self.show(m, types.MessageType.Warning))
        self.diagnostics = DiagnosticStore(self.text_document_publish_diagnostics, visible=self._visible,
                                           limit=lambda: self.settings.settings.max_diagnostics_per_file)
        self.results = ResultCache()
        self.features: list[Feature] = []
        for name in FEATURE_MODULES:
            self.features.append(importlib.import_module(name).setup(self))
        self.document_events = DocumentEvents(self._hand_on, self._text_of)

    def _hand_on(self, event: DocumentEvent) -> None:
        """One document notification to every feature, in list order (`document_active` first, for those that say
        where the user is)."""
        if event.kind in ("open", "change"):
            for feature in self.features:
                feature.document_active(event.uri)
        for feature in self.features:
            if event.kind == "close":
                feature.document_close(event.uri)
            else:
                getattr(feature, f"document_{event.kind}")(event.uri, event.version, event.text)

    def _text_of(self, uri: str) -> str | None:
        document = self.open_documents().get(uri)
        return document.source if document is not None else None

    def open_documents(self) -> OpenDocuments:
        """What the features read as their `documents`: the open documents by the client's URI, as handed to them."""
        return OpenDocuments(self.workspace.text_documents, self.document_events.waiting)

    def get_feature(self, kind: type[F]) -> F:
        """The feature of this class, set up before the one asking."""
        found = next((f for f in self.features if isinstance(f, kind)), None)
        if found is None:
            raise LookupError(f"{kind.__name__} is not set up (yet): see FEATURE_MODULES")
        return found

    def _visible(self, finding: Any) -> bool:
        from kernel_lsp.server.compile_feature import CompileFeature

        return self.get_feature(CompileFeature).visible(finding)

    def show(self, message: str, kind: types.MessageType) -> None:
        log.warning("%s", message)
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def refresh_code_lenses(self) -> None:
        workspace = self.client_capabilities.workspace
        if workspace and workspace.code_lens and workspace.code_lens.refresh_support:
            future = self.workspace_code_lens_refresh(None)
            future.add_done_callback(
                lambda f: f.cancelled() or f.exception() and log.info("codeLens/refresh: %s", f.exception()))

    def supports_work_done_progress(self) -> bool:
        window = self.client_capabilities.window
        return bool(window and window.work_done_progress)

    def supports_change_annotations(self) -> bool:
        """Whether a workspace edit can carry a change annotation that the editor previews before applying."""
        workspace = self.client_capabilities.workspace
        edit = workspace.workspace_edit if workspace else None
        return bool(edit and edit.document_changes and edit.change_annotation_support)

    def supports_file_creation(self) -> bool:
        """Whether a workspace edit may create a file (resource operation 'create' in document changes)."""
        workspace = self.client_capabilities.workspace
        edit = workspace.workspace_edit if workspace else None
        return bool(edit and edit.document_changes and types.ResourceOperationKind.Create in
                    (edit.resource_operations or []))

    def supports_watched_files(self) -> bool:
        """Whether the client can watch files for us (workspace/didChangeWatchedFiles, registered dynamically)."""
        workspace = self.client_capabilities.workspace
        watched = workspace.did_change_watched_files if workspace else None
        return bool(watched and watched.dynamic_registration)

    async def register_file_watchers(self, globs: list[str]) -> bool:
        options = types.DidChangeWatchedFilesRegistrationOptions(
            watchers=[types.FileSystemWatcher(glob_pattern=g) for g in globs])
        try:
            await self.client_register_capability_async(types.RegistrationParams(registrations=[types.Registration(
                id="kernel-lsp-watched-files", method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                register_options=options)]))
        except Exception as exc:  # a client that refuses: the server watches on its own
            log.warning("client/registerCapability for watched files failed: %s", exc)
            return False
        return True

    def supports_configuration(self) -> bool:
        workspace = self.client_capabilities.workspace
        return bool(workspace and workspace.configuration)

    async def pull_configuration(self) -> None:
        if not self.supports_configuration():
            return
        try:
            result = await self.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)]))
        except Exception as exc:  # a client that fails this request keeps the settings we have
            log.warning("workspace/configuration failed: %s", exc)
            return
        self.settings.set_client_config(result[0] if result else None)
        self.settings_changed()

    def settings_changed(self) -> None:
        for feature in self.features:
            feature.settings_changed()


def create_server() -> KernelLanguageServer:
    server = KernelLanguageServer()
    features = server.features

    @server.feature(types.INITIALIZE)
    def initialize(ls: KernelLanguageServer, params: types.InitializeParams) -> None:
        ls.settings.initialize(params)
        for feature in features:
            feature.initialize()

    @server.feature(types.INITIALIZED)
    async def initialized(ls: KernelLanguageServer, params: types.InitializedParams) -> None:
        await ls.pull_configuration()
        for feature in features:
            await feature.started(ls.supports_watched_files())

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: KernelLanguageServer, params: types.DidChangeWatchedFilesParams) -> None:
        from kernel_lsp.server.workspace_feature import WorkspaceFeature

        ls.get_feature(WorkspaceFeature).client_changes([(c.uri, int(c.type)) for c in params.changes])

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: KernelLanguageServer, params: types.DidChangeConfigurationParams) -> None:
        if ls.supports_configuration():
            await ls.pull_configuration()
        else:
            ls.settings.set_client_config(params.settings)
            ls.settings_changed()

    # document notifications reach the features through DocumentEvents (in order, a big text parsed first), and
    # requests on a document wait there until its text is parsed: the loop never parses a big file itself
    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: KernelLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        doc = params.text_document
        ls.document_events.add(DocumentEvent("open", doc.uri, doc.version, doc.text))

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: KernelLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        doc = ls.workspace.get_text_document(params.text_document.uri)
        ls.document_events.add(DocumentEvent("change", doc.uri, params.text_document.version, doc.source))

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    def did_save(ls: KernelLanguageServer, params: types.DidSaveTextDocumentParams) -> None:
        doc = ls.workspace.get_text_document(params.text_document.uri)
        ls.document_events.add(DocumentEvent("save", doc.uri, doc.version, doc.source))

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: KernelLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.document_events.add(DocumentEvent("close", params.text_document.uri))

    @server.feature(types.TEXT_DOCUMENT_CODE_LENS)
    async def code_lens(ls: KernelLanguageServer, params: types.CodeLensParams) -> list[types.CodeLens]:
        await ls.document_events.settled(params.text_document.uri)
        return [lens for feature in features for lens in feature.code_lenses(params.text_document.uri)]

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def hover(ls: KernelLanguageServer, params: types.HoverParams) -> types.Hover | None:
        await ls.document_events.settled(params.text_document.uri)
        for feature in features:
            feature.document_active(params.text_document.uri)
        return next((h for f in features if (h := f.hover(params.text_document.uri, params.position)) is not None),
                    None)

    kinds = [kind for feature in features for kind in feature.code_action_kinds]

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=kinds))
    async def code_action(ls: KernelLanguageServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        uri, span, only = params.text_document.uri, params.range, params.context.only
        await ls.document_events.settled(uri)
        return [action for feature in features for action in feature.code_actions(uri, span, only)]

    for feature in features:
        for name, handler in feature.commands().items():
            server.command(name)(_command(handler))
        for method, handler in feature.methods().items():
            server.feature(method)(_method(handler))

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: KernelLanguageServer, params: None) -> None:
        await ls.document_events.close()
        for feature in reversed(features):
            await feature.shutdown()

    return server


def _command(handler: Callable[[tuple[Any, ...]], Any]) -> Callable[..., Any]:
    """pygls calls a command with the server and the arguments spread; a feature's handler takes the tuple."""
    return _method(handler, spread=True)


def _method(handler: Callable[[Any], Any], spread: bool = False) -> Callable[..., Any]:
    """A feature's handler, sync or async, as the coroutine pygls calls with the server and the params."""
    async def run(ls: KernelLanguageServer, *params: Any) -> Any:
        answer = handler(params if spread else params[0])
        return await answer if inspect.isawaitable(answer) else answer

    return run
