"""Helpers over a parsed Python file: `ast` positions as document ranges, and import-aware dotted names."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kernel_lsp.findings import Position, Range

_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what both Python's tokenizer and LSP count as line ends


def split_lines(text: str) -> list[str]:
    return _LINE_BREAK.split(text)


class SourceLines:
    """A file's lines, converting `ast`'s 1-based lines and UTF-8 byte columns to 0-based character positions."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def char_col(self, lineno: int, byte_col: int) -> int:
        line = self.lines[lineno - 1] if 0 < lineno <= len(self.lines) else ""
        if line.isascii():
            return byte_col
        return len(line.encode("utf-8", "surrogatepass")[:byte_col].decode("utf-8", "replace"))

    def start(self, node: ast.AST) -> tuple[int, int]:
        return node.lineno - 1, self.char_col(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> tuple[int, int]:
        return node.end_lineno - 1, self.char_col(node.end_lineno, node.end_col_offset)

    def range(self, node: ast.AST) -> Range:
        return Range(Position(*self.start(node)), Position(*self.end(node)))

    def excerpt(self, node: ast.AST, limit: int = 60) -> str:
        """The node's source on one line, shortened: for messages."""
        (start_line, start_col), (end_line, end_col) = self.start(node), self.end(node)
        if start_line == end_line:
            text = self.lines[start_line][start_col:end_col]
        else:
            text = self.lines[start_line][start_col:] + " ..."
        text = " ".join(text.split())
        return text if len(text) <= limit else text[:limit - 3] + "..."


_STATEMENT_LISTS = ("body", "orelse", "finalbody", "handlers", "cases")


def nested_statements(statement: ast.stmt) -> list[ast.stmt]:
    """The statements directly inside a compound statement: bodies, else branches, except handlers, match cases."""
    nested: list[ast.stmt] = []
    for name in ("body", "orelse", "finalbody"):
        value = getattr(statement, name, None)
        if isinstance(value, list):
            nested += value
    for clause in [*getattr(statement, "handlers", ()), *getattr(statement, "cases", ())]:
        nested += clause.body
    return nested


def header_expressions(statement: ast.stmt) -> list[ast.AST]:
    """A statement's own expressions, without those of the statements nested in it."""
    expressions: list[ast.AST] = []
    for name, value in ast.iter_fields(statement):
        if name not in _STATEMENT_LISTS:
            expressions += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, ast.AST)]
    for handler in getattr(statement, "handlers", ()):
        expressions += [handler.type] if handler.type is not None else []
    for case in getattr(statement, "cases", ()):
        expressions += [case.pattern] + ([case.guard] if case.guard is not None else [])
    return expressions


def all_statements(tree: ast.Module) -> Iterator[ast.stmt]:
    """Every statement, nested ones included, in source order; expressions are not entered (that is the slow part)."""
    stack = list(reversed(tree.body))
    while stack:
        statement = stack.pop()
        yield statement
        stack.extend(reversed(nested_statements(statement)))


class Imports:
    """Local names bound by import statements anywhere in the file, to their dotted origins."""

    def __init__(self, tree: ast.Module) -> None:
        self._origins: dict[str, str] = {}
        self.modules: set[str] = set()  # the top package of each absolute import (`a` of `import a.b`)
        for node in all_statements(tree):
            if isinstance(node, ast.Import):
                self.modules.update(alias.name.split(".")[0] for alias in node.names)
                for alias in node.names:
                    if alias.asname:
                        self._origins[alias.asname] = alias.name
                    else:  # `import a.b` binds `a`
                        top = alias.name.split(".")[0]
                        self._origins[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                self.modules.add(node.module.split(".")[0])
                for alias in node.names:
                    if alias.name != "*":
                        self._origins[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualified_name(self, expr: ast.expr) -> str | None:
        """`cpp_extension.load_inline` -> 'torch.utils.cpp_extension.load_inline' after `from torch.utils import
        cpp_extension`; a name that was not imported stands for itself; None for anything but a dotted name."""
        attributes = []
        while isinstance(expr, ast.Attribute):
            attributes.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name):
            return None
        return ".".join([self._origins.get(expr.id, expr.id)] + attributes[::-1])
