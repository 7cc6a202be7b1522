"""Thin dispatch from LSP messages to the features; no checking logic lives here."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

from kernel_lsp import __version__
from kernel_lsp.compile.service import CompileService
from kernel_lsp.jobs.cache import ResultCache
from kernel_lsp.server.compile_feature import CompileFeature
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.optimize_feature import (
    OPTIMIZE_ACTION_KIND,
    OPTIMIZE_COMMAND,
    OptimizeFeature,
)
from kernel_lsp.server.profile_feature import (
    IMPORT_COMMAND,
    PROFILE_ACTION_KIND,
    PROFILE_COMMAND,
    ProfileFeature,
)
from kernel_lsp.server.settings import SECTION, SettingsManager
from kernel_lsp.server.verify_feature import VERIFY_COMMAND, VerifyFeature
from kernel_lsp.server.work_progress import WorkProgress
from kernel_lsp.server.worker_feature import STATUS_COMMAND, WorkerFeature
from kernel_lsp.server.workspace_feature import (
    SUMMARY_COMMAND,
    SUMMARY_REQUEST,
    VISIBLE_NOTIFICATION,
    WorkspaceFeature,
)
from kernel_lsp.config import cache_dir

log = logging.getLogger(__name__)


class KernelProtocol(LanguageServerProtocol):
    """JSON-RPC lets a request or notification leave `params` out; pygls's fallback message type for methods
    outside the LSP (kernelLsp/workspaceSummary) needs it, and would drop such a request unanswered."""

    def structure_message(self, data: dict[str, Any]):
        if isinstance(data, dict) and "method" in data and "params" not in data:
            data = {**data, "params": None}
        return super().structure_message(data)


class KernelLanguageServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("kernel-lsp", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
                         protocol_cls=KernelProtocol)
        self.settings = SettingsManager(warn=lambda m: self.show(m, types.MessageType.Warning))
        self.diagnostics = DiagnosticStore(self.text_document_publish_diagnostics,
                                           visible=lambda f: self.compile.visible(f))
        self.results = ResultCache()
        self.compile = CompileFeature(self.diagnostics, self.settings, CompileService(self.results),
                                      tell_user=lambda m: self.show(m, types.MessageType.Error),
                                      refresh_lenses=self.refresh_code_lenses,
                                      priority_of=lambda uri: self.project.priority_of(uri),
                                      is_open=lambda uri: uri in self.workspace.text_documents)
        self.worker = WorkerFeature(notify=self.protocol.notify,
                                    tell_user=lambda m: self.show(m, types.MessageType.Warning))
        self.verify = VerifyFeature(self.diagnostics, self.settings, self.worker,
                                    documents=lambda: self.workspace.text_documents, progress=self.work_done_progress,
                                    supports_progress=self.supports_work_done_progress,
                                    tell_user=lambda m: self.show(m, types.MessageType.Warning),
                                    refresh_lenses=self.refresh_code_lenses)
        self.profile = ProfileFeature(self.diagnostics, self.settings, self.worker,
                                      documents=lambda: self.workspace.text_documents,
                                      progress=WorkProgress(self.work_done_progress, self.supports_work_done_progress),
                                      tell_user=lambda m: self.show(m, types.MessageType.Warning),
                                      verify_summary=lambda uri: self.verify.result_summary(uri),
                                      chart_dir=cache_dir() / "charts")
        self.optimize = OptimizeFeature(self.settings, self.worker, documents=lambda: self.workspace.text_documents,
                                        progress=WorkProgress(self.work_done_progress,
                                                              self.supports_work_done_progress),
                                        tell_user=self.show, apply_edit=self.workspace_apply_edit_async,
                                        ask_user=self.window_show_message_request_async,
                                        supports_annotations=self.supports_change_annotations,
                                        supports_file_creation=self.supports_file_creation)
        self.project = WorkspaceFeature(self.diagnostics, self.settings, self.compile, self.verify,
                                        documents=lambda: self.workspace.text_documents,
                                        tell_user=lambda m: self.show(m, types.MessageType.Warning),
                                        register_watchers=self.register_file_watchers,
                                        cache_folder=cache_dir)

    def show(self, message: str, kind: types.MessageType) -> None:
        log.warning("%s", message)
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def refresh_code_lenses(self) -> None:
        workspace = self.client_capabilities.workspace
        if workspace and workspace.code_lens and workspace.code_lens.refresh_support:
            future = self.workspace_code_lens_refresh(None)
            future.add_done_callback(lambda f: f.cancelled() or f.exception() and log.info("codeLens/refresh: %s", f.exception()))

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
        self.recheck_open_documents()

    def recheck_open_documents(self) -> None:
        """Settings decide what a check finds, so every open document is checked again."""
        for doc in list(self.workspace.text_documents.values()):
            self.compile.recheck(doc.uri, doc.version, doc.source)
        self.profile.republish()  # the ignore list may have changed


def create_server() -> KernelLanguageServer:
    server = KernelLanguageServer()

    @server.feature(types.INITIALIZE)
    def initialize(ls: KernelLanguageServer, params: types.InitializeParams) -> None:
        ls.settings.initialize(params)
        ls.project.open_cache(ls.results)

    @server.feature(types.INITIALIZED)
    async def initialized(ls: KernelLanguageServer, params: types.InitializedParams) -> None:
        await ls.pull_configuration()
        asyncio.ensure_future(ls.project.start(ls.supports_watched_files()))

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: KernelLanguageServer, params: types.DidChangeWatchedFilesParams) -> None:
        ls.project.client_changes([(c.uri, int(c.type)) for c in params.changes])

    @server.feature(VISIBLE_NOTIFICATION)
    def visible_documents(ls: KernelLanguageServer, params) -> None:
        ls.project.set_visible(params)

    @server.feature(SUMMARY_REQUEST)
    def workspace_summary(ls: KernelLanguageServer, params) -> dict:
        return ls.project.summary()

    @server.command(SUMMARY_COMMAND)
    def workspace_summary_command(ls: KernelLanguageServer, *args) -> dict:
        return ls.project.summary()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: KernelLanguageServer, params: types.DidChangeConfigurationParams) -> None:
        if ls.supports_configuration():
            await ls.pull_configuration()
        else:
            ls.settings.set_client_config(params.settings)
            ls.recheck_open_documents()

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: KernelLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        doc = params.text_document
        ls.project.touched(doc.uri)
        ls.compile.document_open(doc.uri, doc.version, doc.text)
        ls.verify.document_open(doc.uri, doc.text)
        ls.profile.document_open(doc.uri, doc.version, doc.text)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: KernelLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        doc = ls.workspace.get_text_document(params.text_document.uri)
        ls.project.touched(doc.uri)
        ls.compile.document_change(doc.uri, params.text_document.version, doc.source)
        ls.profile.document_change(doc.uri, params.text_document.version, doc.source)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    def did_save(ls: KernelLanguageServer, params: types.DidSaveTextDocumentParams) -> None:
        doc = ls.workspace.get_text_document(params.text_document.uri)
        ls.compile.document_save(doc.uri, doc.version, doc.source)
        ls.verify.document_save(doc.uri, doc.source)
        ls.project.saved(doc.uri, doc.source)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: KernelLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.compile.document_close(params.text_document.uri)
        ls.verify.document_close(params.text_document.uri)
        ls.profile.document_close(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_CODE_LENS)
    def code_lens(ls: KernelLanguageServer, params: types.CodeLensParams) -> list[types.CodeLens]:
        return ls.compile.code_lenses(params.text_document.uri) + ls.verify.code_lenses(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(ls: KernelLanguageServer, params: types.HoverParams) -> types.Hover | None:
        ls.project.touched(params.text_document.uri)
        return ls.profile.hover(params.text_document.uri, params.position)

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION,
                    types.CodeActionOptions(code_action_kinds=[PROFILE_ACTION_KIND, OPTIMIZE_ACTION_KIND]))
    def code_action(ls: KernelLanguageServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        uri, span, only = params.text_document.uri, params.range, params.context.only
        return ls.profile.code_actions(uri, span, only) + ls.optimize.code_actions(uri, span, only)

    @server.command(IMPORT_COMMAND)
    async def import_profile(ls: KernelLanguageServer, *args) -> dict:
        return await ls.profile.import_command(args)

    @server.command(PROFILE_COMMAND)
    async def profile(ls: KernelLanguageServer, *args) -> dict:
        return await ls.profile.profile_command(args)

    @server.command(OPTIMIZE_COMMAND)
    async def optimize(ls: KernelLanguageServer, *args) -> dict:
        return await ls.optimize.optimize_command(args)

    @server.command(STATUS_COMMAND)
    async def worker_status(ls: KernelLanguageServer, *args) -> dict:
        return await ls.worker.status(ls.settings.settings)

    @server.command(VERIFY_COMMAND)
    async def verify(ls: KernelLanguageServer, *args) -> dict:
        return await ls.verify.verify_command(args)

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: KernelLanguageServer, params: None) -> None:
        await ls.project.stop()
        await ls.worker.close()

    return server
