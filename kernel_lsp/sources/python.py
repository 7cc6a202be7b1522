"""What a Python document holds for kernel authors: Triton kernels, CuTe DSL kernels, load_inline / load extensions,
KernelBench parts.

A file with a syntax error is parsed again with the offending lines blanked (a bounded number of times), so a
broken `forward` still leaves the kernels and extension sources in the rest of the file visible.

The same text is parsed once: its hover, lenses, code actions, pairing and compile check all ask for it, so the
models of the latest texts are kept (shared: a model is never changed by whoever reads it). A big text is parsed
in another process where one is offered (`offload_large_parses`): ast.parse holds the GIL for the whole parse, a
second and more for a 50,000-line file, which a thread of the server would take from its event loop.
"""

from __future__ import annotations

import ast
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from kernel_lsp.findings import Position, Range
from kernel_lsp.sources.extensions import InlineExtension, find_extensions
from kernel_lsp.sources.pysyntax import Imports, SourceLines, all_statements, split_lines

TRITON_JIT = frozenset({"triton.jit", "triton.runtime.jit.jit"})
CUTE_DECORATORS = {"cutlass.cute.kernel": "kernel", "cutlass.cute.jit": "jit"}  # qualified name -> CuteKernel.role
KERNELBENCH_CLASSES = ("Model", "ModelNew")
KERNELBENCH_FUNCTIONS = ("get_inputs", "get_init_inputs")

_REPARSES = 12  # blank-and-retry rounds for a broken file
_REPARSES_LARGE = 2  # the same for files over _LARGE_FILE characters, where each parse is slow
_LARGE_FILE = 1_000_000
_DEF_NAME = re.compile(r"(?:async\s+)?def\s+(\w+)")
_CLASS_NAME = re.compile(r"class\s+(\w+)")
_INDENTED_BLOCK_AFTER = re.compile(r"expected an indented block after .* on line (\d+)")
LARGE_PARSE = 32_000  # characters (some 800 lines, tens of ms to parse): from here on a text is a big parse
_KEPT = 16  # models kept, the latest texts parsed (each open document's, a few on disk)


@dataclass(frozen=True)
class SyntaxErrorInfo:
    message: str
    range: Range


@dataclass(frozen=True)
class FuncInfo:
    name: str
    name_range: Range
    def_range: Range  # from `def` to the header's ':'
    body_range: Range  # first statement to the end of the last


@dataclass(frozen=True)
class ClassInfo:
    name: str
    name_range: Range
    def_range: Range  # from `class` to the header's ':'
    body_range: Range
    forward: FuncInfo | None


@dataclass(frozen=True)
class TritonKernel:
    name: str
    name_range: Range
    def_range: Range
    body_range: Range
    decorator_range: Range  # the whole decorator stack, from the first '@' to the end of the last decorator


@dataclass(frozen=True)
class CuteKernel:
    """A CuTe DSL function: `@cute.kernel` (role "kernel", runs on the GPU; the DSL names it
    kernel_cutlass_<name>_<arguments>_<n>) or `@cute.jit` (role "jit", the host function that launches kernels)."""

    name: str
    name_range: Range
    def_range: Range
    body_range: Range
    decorator_range: Range
    role: str


@dataclass(frozen=True)
class KernelBenchParts:
    model: ClassInfo | None = None
    model_new: ClassInfo | None = None
    get_inputs: FuncInfo | None = None
    get_init_inputs: FuncInfo | None = None


@dataclass(frozen=True)
class PythonModel:
    triton_kernels: tuple[TritonKernel, ...] = ()
    cute_kernels: tuple[CuteKernel, ...] = ()
    extensions: tuple[InlineExtension, ...] = ()
    kernelbench: KernelBenchParts = field(default_factory=KernelBenchParts)
    syntax_error: SyntaxErrorInfo | None = None  # the first one; the rest of the model comes from what parsed
    imported: frozenset[str] = frozenset()  # the top package of every absolute import, wherever it is


_kept: OrderedDict[str, PythonModel] = OrderedDict()  # text -> its model, the latest last
_kept_lock = threading.Lock()  # the server's loop and its threads all parse
_offload: Callable[[str], PythonModel] | None = None


def parse_python(text: str) -> PythonModel:
    """Never raises: a file that does not parse gives its syntax error and whatever the recovered parse found. The
    model of a text parsed lately is the one kept; a big text goes to the parsing process, if one is offered."""
    model = parsed(text)
    if model is None:
        model = _offload(text) if _offload is not None and len(text) >= LARGE_PARSE else python_model(text)
        _keep(text, model)
    return model


def parsed(text: str) -> PythonModel | None:
    """The model kept for this text, if it was parsed lately (nothing is parsed here)."""
    with _kept_lock:
        model = _kept.get(text)
        if model is not None:
            _kept.move_to_end(text)
        return model


def _keep(text: str, model: PythonModel) -> None:
    with _kept_lock:
        _kept[text] = model
        _kept.move_to_end(text)
        while len(_kept) > _KEPT:
            _kept.popitem(last=False)


def offload_large_parses(parse: Callable[[str], PythonModel] | None) -> None:
    """From now on a text of LARGE_PARSE characters or more is parsed by `parse` (which blocks its caller until
    the model is back; the server's sends it to a process); None: here again."""
    global _offload
    _offload = parse


def python_model(text: str) -> PythonModel:
    """The parse itself, here and now (what the parsing process runs)."""
    lines = split_lines(text.replace("\0", " "))  # a null byte is one character wide either way
    tree, syntax_error = _parse_recovering(lines)
    if "\0" in text:
        syntax_error = _null_byte_error(text)
    if tree is None:
        return PythonModel(syntax_error=syntax_error)
    source = SourceLines(lines)
    imports = Imports(tree)
    return PythonModel(triton_kernels=tuple(find_triton_kernels(tree, source, imports)),
                       cute_kernels=tuple(find_cute_kernels(tree, source, imports)),
                       extensions=tuple(find_extensions(tree, source, imports)),
                       kernelbench=find_kernelbench_parts(tree, source), syntax_error=syntax_error,
                       imported=frozenset(imports.modules))


def _parse_recovering(lines: list[str]) -> tuple[ast.Module | None, SyntaxErrorInfo | None]:
    """Parses `lines`, blanking the lines of each syntax error in place and trying again, a bounded number of times."""
    first_error = None
    rounds = _REPARSES if sum(map(len, lines)) < _LARGE_FILE else _REPARSES_LARGE
    for _ in range(rounds + 1):
        try:
            return _parse("\n".join(lines)), first_error
        except SyntaxError as error:
            first_error = first_error or _syntax_error_info(error, lines)
            if not _blank_offending_lines(lines, error):
                break
        except (ValueError, RecursionError, MemoryError) as error:  # surrogates, absurd nesting
            return None, first_error or SyntaxErrorInfo(f"cannot parse this file: {error}", Range.line(0))
    return None, first_error


def _parse(text: str) -> ast.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escapes in CUDA strings warn; under -W error they would raise
        return ast.parse(text)


def _syntax_error_info(error: SyntaxError, lines: list[str]) -> SyntaxErrorInfo:
    line = _clamp((error.lineno or 1) - 1, 0, len(lines) - 1)
    col = _clamp((error.offset or 1) - 1, 0, len(lines[line]))
    start = Position(line, col)
    end = Position(line, min(col + 1, len(lines[line])))
    if error.end_lineno and error.end_offset and error.end_offset > 0:
        end_line = _clamp(error.end_lineno - 1, 0, len(lines) - 1)
        reported_end = Position(end_line, _clamp(error.end_offset - 1, 0, len(lines[end_line])))
        end = max(end, reported_end)
    return SyntaxErrorInfo(error.msg or "invalid syntax", Range(start, end))


def _null_byte_error(text: str) -> SyntaxErrorInfo:
    offset = text.index("\0")
    lines_before = split_lines(text[:offset])
    start = Position(len(lines_before) - 1, len(lines_before[-1]))
    return SyntaxErrorInfo("source code cannot contain null bytes",
                           Range(start, Position(start.line, start.character + 1)))


def _blank_offending_lines(lines: list[str], error: SyntaxError) -> bool:
    """Empties the lines the error is about; False when there is nothing left to blank."""
    line = _clamp((error.lineno or 1) - 1, 0, len(lines) - 1)
    if _INDENTED_BLOCK_AFTER.match(error.msg or "") and _give_header_a_body(lines, line):
        return True
    targets = [k for k in _offending_lines(lines, error, line) if lines[k].strip()]
    if not targets:  # an error on an empty line (often the end of the file): drop the code just above it
        above = _last_code_line(lines, line)
        if above is None:
            return False
        targets = [above]
    for k in targets:
        lines[k] = ""
    return True


def _offending_lines(lines: list[str], error: SyntaxError, line: int) -> range | list[int]:
    message = error.msg or ""
    if message.startswith("unterminated triple-quoted string"):
        return range(line, len(lines))  # the string swallows the rest of the file
    if message == "unexpected indent":
        return _indented_block(lines, line)
    header = _INDENTED_BLOCK_AFTER.match(message)
    if header is not None:  # a header whose body cannot be given one: drop the header
        return [_clamp(int(header.group(1)) - 1, 0, len(lines) - 1)]
    end_line = _clamp((error.end_lineno or error.lineno or 1) - 1, line, len(lines) - 1)
    return range(line, end_line + 1)


def _give_header_a_body(lines: list[str], error_line: int) -> bool:
    """Appends ` pass` to a header left without a body (its body was blanked), keeping the def or class."""
    header = _last_code_line(lines, error_line - 1)
    if header is None:
        return False
    code = lines[header].split("#")[0].rstrip()
    if not code.endswith(":"):
        return False
    lines[header] = code + " pass"  # only columns after the ':' change
    return True


def _last_code_line(lines: list[str], last: int) -> int | None:
    """The last line at or before `last` that is not blank."""
    return next((k for k in range(last, -1, -1) if lines[k].strip()), None)


def _indented_block(lines: list[str], first: int) -> list[int]:
    """`first` and the lines after it indented at least as deep (blank lines included)."""
    depth = _indentation(lines[first])
    block = [first]
    for k in range(first + 1, len(lines)):
        if lines[k].strip() and _indentation(lines[k]) < depth:
            break
        block.append(k)
    return block


def _indentation(line: str) -> int:
    return len(line) - len(line.lstrip(" \t\f"))


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def find_triton_kernels(tree: ast.Module, source: SourceLines, imports: Imports) -> list[TritonKernel]:
    """@triton.jit, @triton.jit(...), or @jit imported from triton (autotune/heuristics sit above one of these)."""
    return [TritonKernel(*parts) for parts, _ in _decorated(tree, source, imports, dict.fromkeys(TRITON_JIT, ""))]


def find_cute_kernels(tree: ast.Module, source: SourceLines, imports: Imports) -> list[CuteKernel]:
    """@cute.kernel and @cute.jit, bare or called (`@cute.jit(preprocess=False)`), after `import cutlass.cute as
    cute` or `from cutlass import cute`."""
    return [CuteKernel(*parts, role) for parts, role in _decorated(tree, source, imports, CUTE_DECORATORS)]


def _decorated(tree: ast.Module, source: SourceLines, imports: Imports,
               decorators: dict[str, str]) -> list[tuple[tuple[str, Range, Range, Range, Range], str]]:
    """Functions carrying one of `decorators` (qualified name -> tag): their ranges and the first tag found."""
    found = []
    for node in all_statements(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        tags = [decorators[name] for name in map(imports.qualified_name, map(_decorator_target, node.decorator_list))
                if name in decorators]
        if not tags:
            continue
        info = _function_info(node, source)
        first, last = node.decorator_list[0], node.decorator_list[-1]
        decorator_range = Range(_decorator_at_sign(first, source), Position(*source.end(last)))
        found.append(((info.name, info.name_range, info.def_range, info.body_range, decorator_range), tags[0]))
    return found


def _decorator_target(decorator: ast.expr) -> ast.expr:
    return decorator.func if isinstance(decorator, ast.Call) else decorator


def _decorator_at_sign(decorator: ast.expr, source: SourceLines) -> Position:
    line, col = source.start(decorator)
    at_sign = source.lines[line].rfind("@", 0, col)
    return Position(line, at_sign if at_sign >= 0 else col)


def find_kernelbench_parts(tree: ast.Module, source: SourceLines) -> KernelBenchParts:
    """The module-level Model / ModelNew classes and get_inputs / get_init_inputs functions (the last definition
    of each wins, as at run time)."""
    found: dict[str, ClassInfo | FuncInfo] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in KERNELBENCH_CLASSES:
            found[node.name] = _class_info(node, source)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in KERNELBENCH_FUNCTIONS:
            found[node.name] = _function_info(node, source)
    return KernelBenchParts(found.get("Model"), found.get("ModelNew"), found.get("get_inputs"),
                            found.get("get_init_inputs"))


def _function_info(node: ast.FunctionDef | ast.AsyncFunctionDef, source: SourceLines) -> FuncInfo:
    name_range = _name_range(node, _DEF_NAME, source)
    header_nodes = [*getattr(node, "type_params", ()), *ast.iter_child_nodes(node.args), node.returns]
    return FuncInfo(node.name, name_range, _header_range(node, name_range, header_nodes, source),
                    _body_range(node.body, source))


def _class_info(node: ast.ClassDef, source: SourceLines) -> ClassInfo:
    name_range = _name_range(node, _CLASS_NAME, source)
    forward = None
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == "forward":
            forward = _function_info(statement, source)
    header_nodes = [*getattr(node, "type_params", ()), *node.bases, *node.keywords]
    return ClassInfo(node.name, name_range, _header_range(node, name_range, header_nodes, source),
                     _body_range(node.body, source), forward)


def _name_range(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, keyword: re.Pattern[str],
                source: SourceLines) -> Range:
    line, col = source.start(node)
    match = keyword.match(source.lines[line], col)
    if match is None:  # `def` and its name on different lines (a backslash continuation): point at the keyword
        return Range(Position(line, col), Position(line, col))
    return Range(Position(line, match.start(1)), Position(line, match.end(1)))


def _header_range(node: ast.stmt, name_range: Range, header_nodes: list[ast.AST | None],
                  source: SourceLines) -> Range:
    """From the keyword to the ':' that ends the header (found after the header's last sub-expression)."""
    scan_from = name_range.end
    for child in header_nodes:
        if child is not None and hasattr(child, "end_lineno"):
            scan_from = max(scan_from, Position(*source.end(child)))
    colon = _colon_after(source.lines, scan_from, node.body[0].lineno - 1 if node.body else len(source.lines) - 1)
    return Range(Position(*source.start(node)), colon)


def _colon_after(lines: list[str], start: Position, last_line: int) -> Position:
    """Just past the first ':' from `start` on, outside comments; the end of the start line if there is none."""
    for line in range(start.line, min(last_line, len(lines) - 1) + 1):
        text = lines[line]
        col = start.character if line == start.line else 0
        comment = text.find("#", col)
        colon = text.find(":", col, comment if comment >= 0 else len(text))
        if colon >= 0:
            return Position(line, colon + 1)
    return Position(start.line, len(lines[start.line]))


def _body_range(body: list[ast.stmt], source: SourceLines) -> Range:
    return Range(Position(*source.start(body[0])), Position(*source.end(body[-1])))
