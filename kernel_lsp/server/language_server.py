"""The language server the features share: the open documents as handed to them, the diagnostics store, the
settings, the result cache, each feature by its class, and what the client can do. It imports no feature:
server/setup.py names the features and wires the LSP messages to them."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from kernel_lsp import __version__
from kernel_lsp.jobs.cache import ResultCache
from kernel_lsp.server.connection import KernelProtocol
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.events import Events
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.parsing import DocumentEvent, DocumentEvents
from kernel_lsp.server.settings import SECTION, SettingsManager

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Feature)


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
    def __init__(self, feature_modules: Sequence[str] = ()) -> None:
        """`feature_modules`: set up in this order (server/setup.py FEATURE_MODULES), each ending with `setup(server)`."""
        super().__init__("kernel-lsp", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
                         protocol_cls=KernelProtocol)
        self.settings = SettingsManager(warn=lambda m: self.show(m, types.MessageType.Warning))
        self.diagnostics = DiagnosticStore(self.text_document_publish_diagnostics, visible=self._visible,
                                           limit=lambda: self.settings.settings.diagnostics.max_per_file)
        self.results = ResultCache()
        self.events = Events()  # what a feature tells those set up after it (server/events.py)
        self.features: list[Feature] = []
        for name in feature_modules:
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
            raise LookupError(f"{kind.__name__} is not set up (yet): see server/setup.py FEATURE_MODULES")
        return found

    def lens_notes(self, uri: str, text: str | None) -> list[str]:
        """What the features add after a lens's result for this text (Feature.lens_note), in their order."""
        return [note for note in (f.lens_note(uri, text) for f in self.features) if note]

    def priority_of(self, uri: str) -> int | None:
        """The first feature's that says (Feature.priority); None when none does."""
        return next((said for said in (f.priority(uri) for f in self.features) if said is not None), None)

    def _visible(self, finding: Any) -> bool:
        """Whether a finding shows as a diagnostic: every feature agrees (Feature.shows_finding)."""
        return all(feature.shows_finding(finding) for feature in self.features)

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
