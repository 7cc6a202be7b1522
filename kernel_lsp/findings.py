"""Finding: the one result type every checker returns (compiler, verifier, profiler, agent).

Positions are 0-based (line, character), as in LSP; the CLI adds 1 when it prints.
Checkers never import pygls: the server alone turns findings into LSP objects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse


class Severity(enum.IntEnum):
    """Same numbers as LSP's DiagnosticSeverity."""

    ERROR = 1
    WARNING = 2
    INFORMATION = 3
    HINT = 4

    @property
    def label(self) -> str:
        return {1: "error", 2: "warning", 3: "info", 4: "hint"}[int(self)]


@dataclass(frozen=True, order=True)
class Position:
    line: int
    character: int


@dataclass(frozen=True, order=True)
class Range:
    start: Position
    end: Position

    @classmethod
    def of(cls, line: int, col: int, end_line: int | None = None, end_col: int | None = None) -> "Range":
        end_line = line if end_line is None else end_line
        end_col = col if end_col is None else end_col
        return cls(Position(line, col), Position(end_line, end_col))

    @classmethod
    def line(cls, line: int, length: int = 0) -> "Range":
        """A whole line (or its first `length` characters)."""
        return cls(Position(line, 0), Position(line, length))


@dataclass(frozen=True)
class Related:
    """A secondary location (a note, an instantiation context, the other end of a redefinition)."""

    uri: str
    range: Range
    message: str


@dataclass(frozen=True)
class Finding:
    uri: str
    range: Range
    severity: Severity
    source: str
    code: str
    message: str
    related: tuple[Related, ...] = ()
    data: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "range": _range_to_list(self.range),
            "severity": int(self.severity),
            "source": self.source,
            "code": self.code,
            "message": self.message,
            "related": [
                {"uri": r.uri, "range": _range_to_list(r.range), "message": r.message} for r in self.related
            ],
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        return cls(
            uri=d["uri"],
            range=_range_from_list(d["range"]),
            severity=Severity(d["severity"]),
            source=d["source"],
            code=d["code"],
            message=d["message"],
            related=tuple(Related(r["uri"], _range_from_list(r["range"]), r["message"]) for r in d.get("related", ())),
            data=d.get("data"),
        )


def _range_to_list(r: Range) -> list[int]:
    return [r.start.line, r.start.character, r.end.line, r.end.character]


def _range_from_list(v: list[int]) -> Range:
    return Range(Position(v[0], v[1]), Position(v[2], v[3]))


def path_to_uri(path: str | Path) -> str:
    return "file://" + quote(str(Path(path).absolute()))


def uri_to_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme not in ("file", ""):
        raise ValueError(f"not a file URI: {uri}")
    return Path(unquote(parsed.path))
