"""Diagnostics kept per (uri, producer) and published together, with the document version they belong to.

What is kept is every finding; what is published for one file is capped (`maxDiagnosticsPerFile`): a binary `.cu`
gave 6,331 diagnostics, which an editor draws slowly and no one reads. Over the cap the most severe are shown (in
their own order) and one last diagnostic, as severe as the worst it leaves out, counts the rest and names the
command that lists them all.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Callable

from lsprotocol import types

from kernel_lsp.findings import SOURCE, Finding, Severity, uri_to_path
from kernel_lsp.server.convert import OpenDocument, client_uri, diagnostic, uris_by_path

LEFT_OUT = "diagnostics-left-out"


class DiagnosticStore:
    def __init__(self, publish: Callable[[types.PublishDiagnosticsParams], None],
                 visible: Callable[[Finding], bool] = lambda f: True,
                 limit: Callable[[], int] = lambda: 0) -> None:
        self._publish = publish
        self._visible = visible  # findings kept but not shown as diagnostics (e.g. resources shown as lenses only)
        self._limit = limit  # most diagnostics published per file (the setting, read at each publish); 0: all
        self._findings: dict[str, dict[str, list[Finding]]] = {}

    def set(self, uri: str, producer: str, version: int | None, findings: list[Finding]) -> None:
        self._findings.setdefault(uri, {})[producer] = list(findings)
        shown = capped(uri, [f for fs in self._findings[uri].values() for f in fs if self._visible(f)], self._limit())
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


def capped(uri: str, findings: list[Finding], limit: int) -> list[types.Diagnostic]:
    """The findings as diagnostics, at most `limit` of them (0: no limit): over it, the `limit - 1` most severe
    (a stable sort: errors first, each severity in its own order) and one that counts the rest."""
    if not limit or len(findings) <= limit:
        return [diagnostic(f) for f in findings]
    ranked = sorted(range(len(findings)), key=lambda i: findings[i].severity)
    kept = sorted(ranked[:limit - 1])
    left = [findings[i] for i in ranked[limit - 1:]]
    return [diagnostic(findings[i]) for i in kept] + [_left_out(uri, left, len(findings), limit)]


def _left_out(uri: str, left: list[Finding], total: int, limit: int) -> types.Diagnostic:
    counts = Counter(f.severity for f in left)
    parts = ", ".join(f"{counts[s]} {s.label}{'s' if counts[s] != 1 and s != Severity.INFORMATION else ''}"
                      for s in sorted(counts))
    try:
        command = f"`kernel-lsp check {uri_to_path(uri)}`"
    except ValueError:  # untitled:, git:: no file to name
        command = "`kernel-lsp check` on the saved file"
    message = (f"{len(left)} more diagnostics not shown ({parts}): {limit - 1} of {total} are, the most severe "
               f"first (setting maxDiagnosticsPerFile); {command} prints every compile diagnostic.")
    zero = types.Position(line=0, character=0)
    return types.Diagnostic(range=types.Range(start=zero, end=zero), message=message,
                            severity=types.DiagnosticSeverity(int(min(counts))), code=LEFT_OUT, source=SOURCE)
