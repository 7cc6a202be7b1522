"""Diagnostics kept per (uri, producer) and published together, with the document version they belong to."""

from __future__ import annotations

from typing import Callable

from lsprotocol import types

from kernel_lsp.findings import Finding
from kernel_lsp.server.convert import diagnostic


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

    def findings(self, uri: str, producer: str) -> list[Finding]:
        return self._findings.get(uri, {}).get(producer, [])

    def uris(self) -> set[str]:
        """Every URI that has findings kept (from any producer), even an empty list."""
        return set(self._findings)

    def clear(self, uri: str) -> None:
        self._findings.pop(uri, None)
        self._publish(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
