"""Thin dispatch from LSP messages to the features; no checking logic lives here.

The features register themselves: each module of FEATURE_MODULES ends with `setup(server)`, which builds its
feature from what the server offers and from the features set up before it (`server.get_feature(cls)`). Every LSP
message is then handed to each feature's hook in that order (kernel_lsp/server/feature.py), and each feature's
commands, custom methods and code action kinds are served as it declares them. Adding a feature is one module
and one line here."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from lsprotocol import types

from kernel_lsp.server.convert import shows_disabled
from kernel_lsp.server.language_server import KernelLanguageServer
from kernel_lsp.server.parsing import DocumentEvent

log = logging.getLogger(__name__)

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


def create_server() -> KernelLanguageServer:
    server = KernelLanguageServer(FEATURE_MODULES)
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
        disabled_shown = shows_disabled(ls.settings.disabled_actions, params.context)
        await ls.document_events.settled(uri)
        return [action for feature in features for action in feature.code_actions(uri, span, only, disabled_shown)]

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
