"""Diagnostics kept per (uri, producer) and published together, with the document version they belong to."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Callable

from lsprotocol import types

from kernel_lsp.findings import Finding
from kernel_lsp.server.convert import OpenDocument, client_uri, diagnostic, uris_by_path


class DiagnosticStore:
    def __init__(self, publish: Callable[[types.PublishDiagnosticsParams], None],
                 visible: Callable[[Finding], bool] = lambda f: True) -> None:
        self._publish = publish
        self._visible = visible  # findings kept but not shown as diagnostics (e.g. resources shown as lenses only)
        self._findings: dict[str, dict[str, list[Finding]]] = {}

    def set(self, uri: str, producer: str, version: int | None, findings: list[Finding]) -> None:
        self._findings.setdefault(uri, {})[producer] = list(findings)
        shown = [diagnostic(f) for fs in self._findings[uri].values() for f in fs if self._visible(f)]
        self._publish(types.PublishDiagnosticsParams(uri=uri, version=version, diagnostics=shown))

    def set_per_file(self, producer: str, origin_uri: str, findings: Iterable[Finding], earlier: set[str],
                     documents: dict[str, OpenDocument]) -> set[str]:
        """One job's findings (`origin_uri`'s: a candidate's, a checked file's), each on the file it names, spelt
        as the client spells it, replacing what the producer put on `earlier` files; the URIs now holding them."""
        known = uris_by_path(documents.values())
        by_uri: dict[str, list[Finding]] = {origin_uri: []}
        for f in findings:
            uri = client_uri(f.uri, known)
            by_uri.setdefault(uri, []).append(dataclasses.replace(f, uri=uri))
        for uri in (earlier - set(by_uri)) | set(by_uri):
            document = documents.get(uri)
            self.set(uri, producer, document.version if document is not None else None, by_uri.get(uri, []))
        return set(by_uri)

    def findings(self, uri: str, producer: str) -> list[Finding]:
        return self._findings.get(uri, {}).get(producer, [])

    def uris(self) -> set[str]:
        """Every URI that has findings kept (from any producer), even an empty list."""
        return set(self._findings)

    def clear(self, uri: str) -> None:
        self._findings.pop(uri, None)
        self._publish(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
