"""Findings to LSP objects: the only place that knows both; and the editor's open documents by path (the URIs
the client spells, the texts it shows)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lsprotocol import types

from kernel_lsp.findings import Finding, Range, path_to_uri, uri_to_path


class OpenDocument(Protocol):
    uri: str
    version: int | None
    source: str


def uris_by_path(documents: Iterable[OpenDocument]) -> dict[Path, str]:
    """Each open file's resolved path -> the URI the client spells it with (untitled: and git: left out)."""
    known = {}
    for document in documents:
        try:
            known[uri_to_path(document.uri).resolve()] = document.uri
        except ValueError:
            continue
    return known


def client_uri(uri: str, known: dict[Path, str]) -> str:
    """The URI the client uses for the file (its own spelling when it has the file open)."""
    try:
        path = uri_to_path(uri)
    except ValueError:
        return uri
    return known.get(path.resolve(), path_to_uri(path))


def open_texts(documents: Iterable[OpenDocument]) -> dict[Path, str]:
    """The open documents' texts by path: what the editor shows, saved or not."""
    texts = {}
    for document in documents:
        try:
            texts[uri_to_path(document.uri)] = document.source
        except ValueError:  # not a file (untitled:, git:)
            continue
    return texts


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


@dataclass(frozen=True)
class CannotRun:
    """Why a code action cannot run: `brief`, the few words its title ends with where it is listed enabled;
    `reason`, the whole sentence with what to do: a disabled action's reason, and the one message its command answers
    with when chosen."""

    brief: str
    reason: str


def command_action(title: str, kind: str, command: str, arguments: list[Any] | None,
                   cannot: CannotRun | None = None, disabled_shown: bool = False) -> types.CodeAction:
    """A code action that runs `command`. One that cannot run is listed disabled with its reason where the editor
    shows that (`disabled_shown`, from `shows_disabled`); elsewhere enabled, its title saying why, so that the menu
    still lists it: its command asks what the menu asked first and answers with the reason in one message."""
    if cannot is not None and not disabled_shown:
        title = f"{title} — unavailable: {cannot.brief}"
    return types.CodeAction(title=title, kind=kind, command=types.Command(title=title, command=command,
                                                                          arguments=arguments),
                            disabled=types.CodeActionDisabled(reason=cannot.reason) if cannot and disabled_shown
                            else None)


def shows_disabled(client_shows: bool, context: types.CodeActionContext) -> bool:
    """Whether this answer lists an action that cannot run disabled, with its reason, rather than enabled with its
    title saying why: only when the client says it shows disabled actions (`codeAction.disabledSupport`) and the
    request is a menu of kinds (VS Code's Refactor...) or the lightbulb's (automatic: no lightbulb for what cannot
    run). VS Code's Ctrl+. asks for every kind and leaves disabled actions out: all of them disabled read "No code
    actions available"."""
    return client_shows and (bool(context.only) or context.trigger_kind == types.CodeActionTriggerKind.Automatic)


def kind_requested(kind: str, only: Sequence[str] | None) -> bool:
    """Whether a code action of `kind` answers a request filtered to `only` (a kind covers its sub-kinds)."""
    return not only or any(kind == wanted or kind.startswith(wanted + ".") for wanted in only)


STALE = " (before your last edit)"  # a result shown for a document whose text changed since


def ago(seconds: float) -> str:
    """'just now', '12 min ago', '3 h ago', '2 days ago': how old a result kept across restarts is."""
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''} ago"
    return "just now"
