"""`torch.utils.cpp_extension.load_inline` / `load` calls, read statically, and the files load_inline writes.

A source argument is resolved as far as the file itself tells: string literals, names assigned at module or
function level (`=`, annotated, `+=`), `+` concatenations and lists of those. Anything computed at run time
becomes a human-readable note in `InlineExtension.problems` instead.
"""

from __future__ import annotations

import ast
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import NamedTuple

from kernel_lsp.findings import Range
from kernel_lsp.sources.pystrings import LiteralError, decode_literals
from kernel_lsp.sources.pysyntax import Imports, SourceLines, header_expressions, nested_statements
from kernel_lsp.sources.sourcemap import CharPositions, GeneratedFile

CPP_EXTENSION = "torch.utils.cpp_extension"

# Parameter order of torch 2.13's load_inline and load, for positional arguments.
LOAD_INLINE_PARAMETERS = ("name", "cpp_sources", "cuda_sources", "sycl_sources", "functions", "extra_cflags",
                          "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags", "extra_include_paths",
                          "build_directory", "verbose", "with_cuda", "with_sycl", "is_python_module",
                          "with_pytorch_error_handling", "keep_intermediates", "use_pch", "no_implicit_headers")
LOAD_PARAMETERS = ("name", "sources", "extra_cflags", "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags",
                   "extra_include_paths", "build_directory", "verbose", "with_cuda", "with_sycl", "is_python_module",
                   "is_standalone", "keep_intermediates")

# What load_inline puts before the user's sources (torch/utils/cpp_extension.py, load_inline).
CPP_HEADER = "#include <torch/extension.h>"
CUDA_HEADERS = ("#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>")

_MAX_RESOLUTION_DEPTH = 64  # guards against `a = a + b` cycles and absurdly deep expressions


@dataclass(frozen=True)
class SourceString:
    text: str  # the decoded value
    origin_range: Range  # the expression it was read from in the .py (the literal, or the `a + b` it was built by)
    char_positions: CharPositions  # the .py (line, col) of each character of `text`


@dataclass
class InlineExtension:
    kind: str  # 'load_inline' or 'load'
    call_range: Range
    name: str | None = None
    cuda_sources: list[SourceString] = field(default_factory=list)
    cpp_sources: list[SourceString] = field(default_factory=list)
    functions: list[str] | None = None
    function_docstrings: dict[str, str] = field(default_factory=dict)  # only from functions={name: docstring}
    extra_cuda_cflags: list[str] = field(default_factory=list)
    extra_cflags: list[str] = field(default_factory=list)
    extra_include_paths: list[str] = field(default_factory=list)
    source_files: list[str] = field(default_factory=list)  # load(sources=[...])
    with_pytorch_error_handling: bool = True
    no_implicit_headers: bool = False
    problems: list[str] = field(default_factory=list)


def assemble_load_inline(ext: InlineExtension) -> tuple[GeneratedFile | None, GeneratedFile]:
    """(cuda.cu or None when there are no CUDA sources, main.cpp), exactly as load_inline writes them."""
    if ext.kind != "load_inline":
        raise ValueError(f"{ext.kind}() compiles files named in the call, not strings")
    cpp_parts: list[str | SourceString] = [] if ext.no_implicit_headers else [CPP_HEADER]
    cpp_parts += ext.cpp_sources
    if ext.functions is not None:
        cpp_parts += _module_definition(ext)
    cuda = None
    if ext.cuda_sources:
        cuda = _joined(([] if ext.no_implicit_headers else list(CUDA_HEADERS)) + ext.cuda_sources)
    return cuda, _joined(cpp_parts)


def _module_definition(ext: InlineExtension) -> list[str]:
    """The PYBIND11_MODULE block load_inline appends for `functions` (a list becomes a dict: duplicates go)."""
    lines = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    for name in dict.fromkeys(ext.functions or ()):
        docstring = ext.function_docstrings.get(name, name)
        if ext.with_pytorch_error_handling:
            lines.append(f'm.def("{name}", torch::wrap_pybind_function({name}), "{docstring}");')
        else:
            lines.append(f'm.def("{name}", {name}, "{docstring}");')
    lines.append("}")
    return lines


def _joined(parts: list[str | SourceString]) -> GeneratedFile:
    """"\\n".join(parts), keeping the origin of every character that came from the .py."""
    generated = GeneratedFile()
    for k, part in enumerate(parts):
        if k:
            generated.add_text("\n")
        if isinstance(part, SourceString):
            generated.add_literal(part.text, part.char_positions)
        else:
            generated.add_text(part)
    return generated


def extension_kind(callee: ast.expr, imports: Imports) -> str | None:
    """'load_inline' or 'load' when the call is torch's; `load` alone must be imported from cpp_extension."""
    name = imports.qualified_name(callee)
    if name is None:
        return None
    if name.split(".")[-2:] in (["load_inline"], ["cpp_extension", "load_inline"]):
        return "load_inline"
    if name == f"{CPP_EXTENSION}.load":
        return "load"
    return None


def find_extensions(tree: ast.Module, lines: SourceLines, imports: Imports) -> list[InlineExtension]:
    """Every load_inline / load call in the file, in source order, with its arguments resolved."""
    calls = _ScopeWalk(tree, lines, imports).calls
    calls.sort(key=lambda item: (item[0].lineno, item[0].col_offset))
    return [_ExtensionReader(lines, call, kind, chain).read() for call, kind, chain in calls]


class _Unresolvable(Exception):
    """A value the file does not pin down; the message says why, for `problems`."""


@dataclass(frozen=True)
class _Unresolved:
    """A list element that could not be resolved (the other elements still can be)."""

    reason: str


class _Scope:
    def __init__(self, is_class: bool) -> None:
        self.is_class = is_class
        self.bindings: dict[str, list[_Binding]] = {}

    def bind(self, name: str, binding: "_Binding") -> None:
        self.bindings.setdefault(name, []).append(binding)


class _Binding(NamedTuple):  # a tuple: large files make one per assignment
    position: tuple[int, int]  # where the assignment is, to pick the one in effect at a call
    value: ast.expr | None  # None: bound to something not written as an expression here (a parameter)
    augmented: bool  # `name += value`
    chain: tuple[_Scope, ...]  # scopes visible to `value`, innermost first


def _position(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset


def _parameters(arguments: ast.arguments) -> list[ast.arg]:
    variadic = [arg for arg in (arguments.vararg, arguments.kwarg) if arg is not None]
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, *variadic]


class _ScopeWalk:
    """One pass over the statements recording assignments per scope, and the extension calls with their scopes.

    Expressions are searched for calls only in statements on lines that mention `load`: walking every
    expression of a large file costs far more than parsing it.
    """

    def __init__(self, tree: ast.Module, lines: SourceLines, imports: Imports) -> None:
        self._imports = imports
        self._mention_lines = [k + 1 for k, line in enumerate(lines.lines) if "load" in line]  # 1-based, as ast
        self.calls: list[tuple[ast.Call, str, tuple[_Scope, ...]]] = []
        module = (_Scope(is_class=False),)
        stack: list[tuple[ast.stmt, tuple[_Scope, ...]]] = [(statement, module) for statement in reversed(tree.body)]
        while stack:  # iterative: deeply nested code must not hit the recursion limit
            statement, chain = stack.pop()
            inner = self._visit(statement, chain)
            stack.extend((nested, inner) for nested in reversed(nested_statements(statement)))

    def _visit(self, statement: ast.stmt, chain: tuple[_Scope, ...]) -> tuple[_Scope, ...]:
        """Records the statement; returns the scope chain of the statements nested in it."""
        if self._mentions_load(statement):
            self._find_calls(header_expressions(statement), chain)
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # a class body's names are not visible inside its methods
            inner = (_Scope(is_class=False),) + tuple(scope for scope in chain if not scope.is_class)
            for argument in _parameters(statement.args):  # a parameter hides a module-level name spelled alike
                inner[0].bind(argument.arg, _Binding(_position(statement), None, False, inner))
            return inner
        if isinstance(statement, ast.ClassDef):
            return (_Scope(is_class=True),) + chain
        self._record_assignment(statement, chain)
        return chain

    def _mentions_load(self, statement: ast.stmt) -> bool:
        k = bisect_left(self._mention_lines, statement.lineno)
        return k < len(self._mention_lines) and self._mention_lines[k] <= (statement.end_lineno or statement.lineno)

    def _find_calls(self, expressions: list[ast.AST], chain: tuple[_Scope, ...]) -> None:
        for expression in expressions:
            for node in ast.walk(expression):
                if isinstance(node, ast.Call):
                    kind = extension_kind(node.func, self._imports)
                    if kind is not None:
                        self.calls.append((node, kind, chain))

    def _record_assignment(self, node: ast.stmt, chain: tuple[_Scope, ...]) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind_target(target, node.value, node, chain)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._bind_target(node.target, node.value, node, chain)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            augmented = isinstance(node.op, ast.Add)
            binding = _Binding(_position(node), node.value if augmented else None, augmented, chain)
            chain[0].bind(node.target.id, binding)

    def _bind_target(self, target: ast.expr, value: ast.expr | None, node: ast.AST, chain) -> None:
        if isinstance(target, ast.Name):
            chain[0].bind(target.id, _Binding(_position(node), value, False, chain))
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
            paired = values is not None and len(values) == len(target.elts)
            for k, element in enumerate(target.elts):
                self._bind_target(element, values[k] if paired else None, node, chain)


class _ExtensionReader:
    """Reads the arguments of one extension call, noting in `ext.problems` what it cannot resolve."""

    def __init__(self, lines: SourceLines, call: ast.Call, kind: str, chain: tuple[_Scope, ...]) -> None:
        self._lines = lines
        self._position = _position(call)
        self._chain = chain
        self.ext = InlineExtension(kind=kind, call_range=lines.range(call))
        parameters = LOAD_INLINE_PARAMETERS if kind == "load_inline" else LOAD_PARAMETERS
        self._arguments = self._bind_arguments(call, parameters)

    def read(self) -> InlineExtension:
        ext = self.ext
        ext.name = self._label_text("name")
        if ext.kind == "load_inline":
            ext.cpp_sources = self._as_sources(self._value("cpp_sources"), "cpp_sources")
            ext.cuda_sources = self._cuda_sources()
            self._read_functions()
            ext.with_pytorch_error_handling = self._flag("with_pytorch_error_handling", True)
            ext.no_implicit_headers = self._flag("no_implicit_headers", False)
        else:
            ext.source_files = self._strings("sources")
        ext.extra_cflags = self._strings("extra_cflags")
        ext.extra_cuda_cflags = self._strings("extra_cuda_cflags")
        ext.extra_include_paths = self._strings("extra_include_paths")
        return ext

    def _bind_arguments(self, call: ast.Call, parameters: tuple[str, ...]) -> dict[str, ast.expr]:
        arguments: dict[str, ast.expr] = {}
        for k, argument in enumerate(call.args):
            if isinstance(argument, ast.Starred):
                self.ext.problems.append(f"arguments unpacked from `{self._lines.excerpt(argument)}` are not read")
                break
            if k < len(parameters):
                arguments[parameters[k]] = argument
        for keyword in call.keywords:
            if keyword.arg is None:
                self.ext.problems.append(f"arguments unpacked from `**{self._lines.excerpt(keyword.value)}` "
                                         "are not read")
            else:
                arguments[keyword.arg] = keyword.value
        return arguments

    def _value(self, parameter: str):
        """The resolved argument; None when it is absent or cannot be resolved (that is noted)."""
        expr = self._arguments.get(parameter)
        if expr is None:
            return None
        try:
            return self._resolve(expr, self._position, self._chain, depth=0)
        except _Unresolvable as reason:
            self.ext.problems.append(f"{parameter}: {reason}")
            return None

    def _label_text(self, parameter: str) -> str | None:
        """A string argument that only names things: no note when it cannot be read."""
        expr = self._arguments.get(parameter)
        try:
            value = None if expr is None else self._resolve(expr, self._position, self._chain, depth=0)
        except _Unresolvable:
            return None
        return value.text if isinstance(value, SourceString) else None

    def _cuda_sources(self) -> list[SourceString]:
        value = self._value("cuda_sources")
        if isinstance(value, SourceString) and value.text == "":
            return []  # torch does `cuda_sources or []`: an empty string means no cuda.cu at all
        return self._as_sources(value, "cuda_sources")

    def _as_sources(self, value, parameter: str) -> list[SourceString]:
        """A string or a list of strings, as torch accepts for its source and flag arguments."""
        if value is None:
            return []
        if isinstance(value, SourceString):
            return [value]
        if not isinstance(value, list):
            self.ext.problems.append(f"{parameter}: expected a string or a list of strings")
            return []
        sources = []
        for element in value:
            if isinstance(element, SourceString):
                sources.append(element)
            elif isinstance(element, _Unresolved):
                self.ext.problems.append(f"{parameter}: {element.reason}")
            else:
                self.ext.problems.append(f"{parameter}: an element is not a string")
        return sources

    def _strings(self, parameter: str) -> list[str]:
        return [source.text for source in self._as_sources(self._value(parameter), parameter)]

    def _read_functions(self) -> None:
        value = self._value("functions")
        if isinstance(value, dict):
            self.ext.functions = list(value)
            self.ext.function_docstrings = {name: doc.text for name, doc in value.items()
                                            if isinstance(doc, SourceString)}
        elif value is not None:
            self.ext.functions = [source.text for source in self._as_sources(value, "functions")]

    def _flag(self, parameter: str, default: bool) -> bool:
        value = self._value(parameter)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.ext.problems.append(f"{parameter}: expected True or False")
            return default
        return value

    def _resolve(self, expr: ast.expr, position: tuple[int, int], chain: tuple[_Scope, ...], depth: int):
        """SourceString for a str, list for a list/tuple, dict for a dict, the value for other constants."""
        if depth > _MAX_RESOLUTION_DEPTH:
            raise _Unresolvable(f"`{self._lines.excerpt(expr)}` is built too deeply to follow")
        if isinstance(expr, ast.Constant):
            return self._literal(expr) if isinstance(expr.value, (str, bytes)) else expr.value
        if isinstance(expr, ast.JoinedStr):
            if any(isinstance(part, ast.FormattedValue) for part in expr.values):
                raise _Unresolvable(f"`{self._lines.excerpt(expr)}` is an f-string, filled in at run time")
            return self._literal(expr)
        if isinstance(expr, ast.Name):
            return self._resolve_name(expr.id, position, chain, depth)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self._resolve(expr.left, position, chain, depth + 1)
            return self._sum(left, self._resolve(expr.right, position, chain, depth + 1), expr)
        if isinstance(expr, (ast.List, ast.Tuple)):
            return self._elements(expr.elts, position, chain, depth)
        if isinstance(expr, ast.Dict):
            return self._dictionary(expr, position, chain, depth)
        raise _Unresolvable(f"`{self._lines.excerpt(expr)}` is computed at run time")

    def _literal(self, expr: ast.expr) -> SourceString:
        try:
            text, positions = decode_literals(self._lines.lines, self._lines.start(expr), self._lines.end(expr))
        except LiteralError as error:
            raise _Unresolvable(f"`{self._lines.excerpt(expr)}`: {error}") from error
        return SourceString(text, self._lines.range(expr), positions)

    def _resolve_name(self, name: str, position: tuple[int, int], chain: tuple[_Scope, ...], depth: int):
        binding = _binding_in_effect(name, position, chain)
        if binding is None:
            raise _Unresolvable(f"`{name}` is not assigned in this file")
        if binding.value is None:
            raise _Unresolvable(f"`{name}` is only known at run time (a parameter or an unpacked value)")
        value = self._resolve(binding.value, binding.position, binding.chain, depth + 1)
        if not binding.augmented:
            return value
        previous = self._resolve_name(name, binding.position, binding.chain, depth + 1)
        return self._sum(previous, value, binding.value)

    def _elements(self, elements: list[ast.expr], position, chain, depth: int) -> list:
        values: list = []
        for element in elements:
            try:
                if isinstance(element, ast.Starred):
                    unpacked = self._resolve(element.value, position, chain, depth + 1)
                    if not isinstance(unpacked, list):
                        raise _Unresolvable(f"`{self._lines.excerpt(element)}` does not unpack a list")
                    values += unpacked
                else:
                    values.append(self._resolve(element, position, chain, depth + 1))
            except _Unresolvable as reason:
                values.append(_Unresolved(str(reason)))
        return values

    def _dictionary(self, expr: ast.Dict, position, chain, depth: int) -> dict:
        result = {}
        for key, value in zip(expr.keys, expr.values):
            resolved_key = None if key is None else self._resolve(key, position, chain, depth + 1)
            if not isinstance(resolved_key, SourceString):
                raise _Unresolvable(f"`{self._lines.excerpt(expr)}` has keys that are not strings")
            result[resolved_key.text] = self._resolve(value, position, chain, depth + 1)
        return result

    def _sum(self, left, right, expr: ast.expr):
        if isinstance(left, SourceString) and isinstance(right, SourceString):
            start = min(left.origin_range.start, right.origin_range.start)
            end = max(left.origin_range.end, right.origin_range.end)
            return SourceString(left.text + right.text, Range(start, end),
                                left.char_positions.concatenated(right.char_positions))
        if isinstance(left, list) and isinstance(right, list):
            return left + right
        raise _Unresolvable(f"`{self._lines.excerpt(expr)}` adds values that are not both strings or both lists")


def _binding_in_effect(name: str, position: tuple[int, int], chain: tuple[_Scope, ...]) -> _Binding | None:
    """The assignment `name` refers to at `position`.

    A scope that runs in step with the reference (its own, or the module around class bodies) counts only earlier
    assignments; a function body runs later, so it sees the last assignment of an enclosing scope.
    """
    for k, scope in enumerate(chain):
        bindings = scope.bindings.get(name)
        if not bindings:
            continue
        in_step = all(inner.is_class for inner in chain[:k])
        if in_step:
            bindings = [binding for binding in bindings if binding.position < position]
        if bindings:
            return max(bindings, key=lambda binding: binding.position)
    return None
