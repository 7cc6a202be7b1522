"""Findings to LSP objects: the only place that knows both."""

from __future__ import annotations

from collections.abc import Sequence

from lsprotocol import types

from kernel_lsp.findings import Finding, Range


def lsp_range(r: Range) -> types.Range:
    return types.Range(start=types.Position(line=r.start.line, character=r.start.character),
                       end=types.Position(line=r.end.line, character=r.end.character))


def diagnostic(f: Finding) -> types.Diagnostic:
    related = [types.DiagnosticRelatedInformation(location=types.Location(uri=r.uri, range=lsp_range(r.range)),
                                                  message=r.message) for r in f.related]
    return types.Diagnostic(range=lsp_range(f.range), message=f.message,
                            severity=types.DiagnosticSeverity(int(f.severity)), code=f.code, source=f.source,
                            related_information=related or None, data=f.data)


def code_lens(f: Finding) -> types.CodeLens:
    # the lens sits on the kernel's signature line; its title is the resource summary without the kernel name
    title = f.message.split(": ", 1)[1] if ": " in f.message else f.message
    return types.CodeLens(range=lsp_range(f.range), command=types.Command(title=f"ptxas {title}", command=""))


def kind_requested(kind: str, only: Sequence[str] | None) -> bool:
    """Whether a code action of `kind` answers a request filtered to `only` (a kind covers its sub-kinds)."""
    return not only or any(kind == wanted or kind.startswith(wanted + ".") for wanted in only)
