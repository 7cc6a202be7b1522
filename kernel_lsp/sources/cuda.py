"""CUDA kernels and #includes in `.cu`/`.cuh` text, found by a linear scan (no preprocessor, no parser).

Comments, string and character literals and preprocessor directives are blanked first (replaced by spaces,
line breaks kept), so every offset in the scanned text is an offset in the document.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate, count
from operator import add

from kernel_lsp.findings import Position, Range


@dataclass(frozen=True)
class CudaKernel:
    name: str
    name_range: Range
    signature_range: Range  # first specifier (template, extern "C", static, ...) to the parameter list's ')'
    body_range: Range | None  # '{' to '}' inclusive; None for a declaration
    launch_bounds: tuple[int, ...] | None  # only when every argument is an integer literal
    is_template: bool
    namespace: str  # '' or 'a::b'

    @property
    def has_body(self) -> bool:
        return self.body_range is not None


@dataclass(frozen=True)
class Include:
    path: str
    quoted: bool  # "x.h" rather than <x.h>
    range: Range  # the path, without its delimiters


# Unterminated: a block comment or raw string runs to the end of the text, a quoted literal to the end of its line.
# Each pattern starts with a lookahead on the first characters, which lets `re` skip ahead fast (5x on large files).
_COMMENT_OR_LITERAL = re.compile(
    r"(?=[/uULR\"'])(?:"
    r"//(?:\\\r?\n|[^\r\n])*"
    r"|/\*[\s\S]*?(?:\*/|\Z)"
    r"|(?<!\w)(?:u8|[uUL])?R\"([^()\\\s\"]{0,16})\([\s\S]*?(?:\)\1\"|\Z)"
    r"|\"(?:\\(?:\r\n|[\s\S])|[^\"\\\r\n])*\"?"
    r"|(?<![0-9])'(?:\\(?:\r\n|[\s\S])|[^'\\\r\n])*'?"  # not after a digit: 1'000'000 has separators
    r")"
)
_DIRECTIVE = re.compile(r"^[ \t]*#[^\r\n]*(?:(?<=\\)(?:\r\n|\r|\n)[^\r\n]*)*", re.MULTILINE)
_INCLUDE = re.compile(r"^[ \t]*(#)[ \t]*include[ \t]*(?:\"([^\"\r\n]*)\"|<([^>\r\n]*)>)", re.MULTILINE)
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LONE_CARRIAGE_RETURN = re.compile(r"\r(?!\n)")
_NOT_LINE_BREAK = re.compile(r"[^\r\n]")
_SCOPE_EVENT = re.compile(r"(?=[{}n_])(?:[{}]|\bnamespace\b|\b__global__\b)")
_NAMESPACE_NAME = re.compile(r"\s*((?:inline\s+)?[A-Za-z_]\w*(?:\s*::\s*(?:inline\s+)?[A-Za-z_]\w*)*)?\s*\Z")
_PAREN = re.compile(r"[()]")
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.']*|::|[^\s\w]")
_INLINE_KEYWORD = re.compile(r"^inline\s+")
_INTEGER_LITERAL = re.compile(r"(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9]\d*)[uUlL]*\Z")

_SPECIFIERS = frozenset({"static", "extern", "inline", "__inline__", "__forceinline__", "__noinline__", "__device__",
                         "__host__", "constexpr", "__global__"})
_ATTRIBUTE_CALLS = frozenset({"__launch_bounds__", "__maxnreg__", "__attribute__", "__declspec", "alignas",
                              "__cluster_dims__", "decltype"})
_STATEMENT_END = (";", "{", "}")
_TYPE_KEYWORDS = frozenset({"void", "int", "float", "double", "char", "bool", "long", "short", "unsigned", "signed",
                            "auto", "const", "volatile"})
_PREFIX_WINDOW = 8192  # how far back from __global__ a template<...> or attribute is looked for
_SIGNATURE_WINDOW = 65536  # longest signature searched before giving up on one __global__
_ANONYMOUS_NAMESPACE = "(anonymous namespace)"  # how c++filt spells it


def find_kernels(text: str) -> list[CudaKernel]:
    """Every __global__ function definition or declaration, in document order."""
    code = blank_directives(blank_comments_and_literals(text))
    lines = LineIndex(text)
    brace_pairs, globals_found = _scan_scopes(code)
    scanner = _KernelScanner(code, brace_pairs, lines)
    offsets = [offset for offset, _ in globals_found]
    kernels = []
    for k, (offset, namespace) in enumerate(globals_found):
        # neighbouring __global__s bound each search, so a text full of them still costs linear time
        previous_end = offsets[k - 1] + len("__global__") if k > 0 else 0
        next_start = offsets[k + 1] if k + 1 < len(offsets) else len(code)
        kernel = scanner.kernel_at(offset, namespace, previous_end, next_start)
        if kernel is not None:
            kernels.append(kernel)
    return kernels


def find_includes(text: str) -> list[Include]:
    code = blank_comments_and_literals(text)
    lines = LineIndex(text)
    includes = []
    for match in _INCLUDE.finditer(text):
        if code[match.start(1)] != "#":  # the directive sits inside a comment or literal
            continue
        quoted = match.group(2) is not None
        group = 2 if quoted else 3
        includes.append(Include(match.group(group), quoted, lines.range(match.start(group), match.end(group))))
    return includes


def blank_comments_and_literals(text: str) -> str:
    """The text with comments and string/char literals replaced by spaces; line breaks and offsets kept."""
    return _COMMENT_OR_LITERAL.sub(_blanked, text)


def blank_directives(code: str) -> str:
    """Preprocessor lines (with their continuations) replaced by spaces: macro bodies are not code."""
    return _DIRECTIVE.sub(_blanked, code)


def _blanked(match: re.Match[str]) -> str:
    text = match[0]
    if "\n" in text or "\r" in text:
        return _NOT_LINE_BREAK.sub(" ", text)
    return " " * len(text)


def _scan_scopes(code: str) -> tuple[dict[int, int], list[tuple[int, str]]]:
    """Matching braces ({ offset -> } offset) and each __global__ offset with its enclosing namespace."""
    brace_pairs: dict[int, int] = {}
    open_braces: list[int] = []
    namespaces: list[tuple[int, str]] = []  # (brace depth it opened at, name)
    globals_found: list[tuple[int, str]] = []
    namespace_keyword_end = -1
    for match in _SCOPE_EVENT.finditer(code):
        token = match[0]
        if token == "{":
            if namespace_keyword_end >= 0:
                name = _namespace_opened(code, namespace_keyword_end, match.start())
                if name is not None:
                    namespaces.append((len(open_braces), name))
                namespace_keyword_end = -1  # a namespace keyword opens at most the next brace
            open_braces.append(match.start())
        elif token == "}":
            if open_braces:
                brace_pairs[open_braces.pop()] = match.start()
                if namespaces and namespaces[-1][0] == len(open_braces):
                    namespaces.pop()
        elif token == "namespace":
            namespace_keyword_end = match.end()
        else:
            globals_found.append((match.start(), "::".join(name for _, name in namespaces)))
    return brace_pairs, globals_found


def _namespace_opened(code: str, keyword_end: int, brace: int) -> str | None:
    if brace - keyword_end > 1024:
        return None
    match = _NAMESPACE_NAME.match(code, keyword_end, brace)
    if match is None:
        return None
    if match.group(1) is None:
        return _ANONYMOUS_NAMESPACE
    return "::".join(_INLINE_KEYWORD.sub("", part.strip()) for part in match.group(1).split("::"))


class _KernelScanner:
    """Reads the declaration around each __global__ of one blanked text."""

    def __init__(self, code: str, brace_pairs: dict[int, int], lines: "LineIndex") -> None:
        self._code = code
        self._brace_pairs = brace_pairs
        self._lines = lines
        self._stops = _StatementStops(code)

    def kernel_at(self, global_offset: int, namespace: str, search_from: int, search_to: int) -> CudaKernel | None:
        prefix = self._declaration_prefix(global_offset, search_from)
        signature = self._signature_after(global_offset, search_to)
        if signature is None:
            return None
        name, signature_end, suffix_bounds = signature
        body = self._body_after(signature_end)
        return CudaKernel(
            name=name[0],
            name_range=self._lines.range(name.start(), name.end()),
            signature_range=self._lines.range(prefix.start, signature_end),
            body_range=None if body is None else self._lines.range(*body),
            launch_bounds=prefix.launch_bounds if prefix.launch_bounds is not None else suffix_bounds,
            is_template=prefix.is_template,
            namespace=namespace,
        )

    def _tokens(self, start: int, end: int) -> list[re.Match[str]]:
        return list(_TOKEN.finditer(self._code, start, end))

    def _declaration_prefix(self, global_offset: int, search_from: int) -> _Prefix:
        """Walks back from __global__ over specifiers, template<...> and attributes: where the declaration starts."""
        window_start = max(search_from, global_offset - _PREFIX_WINDOW, self._stops.last_before(global_offset) + 1)
        tokens = self._tokens(window_start, global_offset)
        prefix = _Prefix(global_offset)
        i = len(tokens) - 1
        while i >= 0:
            token = tokens[i]
            if token[0] in _SPECIFIERS:
                prefix.start, i = token.start(), i - 1
            elif token[0] == ">":
                opening = _matching_backward(tokens, i, "<", ">")
                if opening is None or opening == 0 or tokens[opening - 1][0] != "template":
                    break
                prefix.start, prefix.is_template, i = tokens[opening - 1].start(), True, opening - 2
            elif token[0] == ")":
                opening = _matching_backward(tokens, i, "(", ")")
                if opening is None or opening == 0 or tokens[opening - 1][0] not in _ATTRIBUTE_CALLS:
                    break
                if tokens[opening - 1][0] == "__launch_bounds__":
                    prefix.launch_bounds = _integer_arguments(tokens[opening + 1:i])
                prefix.start, i = tokens[opening - 1].start(), opening - 2
            elif token[0] == "]" and i > 0 and tokens[i - 1][0] == "]":
                opening = _matching_backward(tokens, i, "[", "]")
                if opening is None:
                    break
                prefix.start, i = tokens[opening].start(), opening - 1
            else:
                break
        return prefix

    def _signature_after(self, global_offset: int, search_to: int
                         ) -> tuple[re.Match[str], int, tuple[int, ...] | None] | None:
        """(name, offset just past the parameters' ')', launch bounds written after __global__), or None."""
        window_end = min(search_to, global_offset + _SIGNATURE_WINDOW, self._stops.first_after(global_offset))
        pos = global_offset + len("__global__")
        launch_bounds = None
        angle_depth = 0
        name = None
        while (token := _TOKEN.search(self._code, pos, window_end)) is not None:
            pos = token.end()
            text = token[0]
            if text in _ATTRIBUTE_CALLS and angle_depth == 0:
                arguments = self._parenthesized(pos, window_end)
                if arguments is None:
                    return None
                if text == "__launch_bounds__":
                    launch_bounds = _integer_arguments(self._tokens(arguments[0] + 1, arguments[1]))
                pos = arguments[1] + 1
            elif text == "<":
                angle_depth += 1
            elif text == ">":
                angle_depth = max(0, angle_depth - 1)
            elif text == "(" and angle_depth == 0:
                close = self._closing_paren(token.start(), window_end)
                if name is None or name[0] in _TYPE_KEYWORDS or close is None:
                    return None
                return name, close + 1, launch_bounds
            elif angle_depth == 0 and (text[0].isalpha() or text[0] == "_"):
                name = token
        return None

    def _parenthesized(self, pos: int, end: int) -> tuple[int, int] | None:
        """Offsets of the '(' that is the next token and of its ')'."""
        opening = _TOKEN.search(self._code, pos, end)
        if opening is None or opening[0] != "(":
            return None
        close = self._closing_paren(opening.start(), end)
        return None if close is None else (opening.start(), close)

    def _closing_paren(self, opening: int, end: int) -> int | None:
        depth = 0
        for paren in _PAREN.finditer(self._code, opening, end):
            depth += 1 if paren[0] == "(" else -1
            if depth == 0:
                return paren.start()
        return None

    def _body_after(self, pos: int) -> tuple[int, int] | None:
        """The body's (start, end) offsets, braces included; an unclosed body runs to the end of the text."""
        stop = self._stops.first_after(pos)
        if stop >= len(self._code) or self._code[stop] != "{":
            return None
        close = self._brace_pairs.get(stop)
        return stop, len(self._code) if close is None else close + 1


@dataclass
class _Prefix:
    start: int
    is_template: bool = False
    launch_bounds: tuple[int, ...] | None = None


class _StatementStops:
    """The nearest ';', '{' or '}' before or after an offset.

    Kernels are visited in increasing offsets, so each cached answer is reused and the total work stays linear.
    """

    def __init__(self, code: str) -> None:
        self._code = code
        self._after = {ch: (-1, -1) for ch in _STATEMENT_END}  # (queried offset, answer)
        self._before = -1
        self._scanned_to = 0

    def first_after(self, offset: int) -> int:
        """Offset of the first stop at or after `offset`; len(code) if none."""
        nearest = len(self._code)
        for ch, (queried, answer) in self._after.items():
            if not queried <= offset <= answer:
                found = self._code.find(ch, offset)
                answer = len(self._code) if found < 0 else found
                self._after[ch] = (offset, answer)
            nearest = min(nearest, answer)
        return nearest

    def last_before(self, offset: int) -> int:
        """Offset of the last stop before `offset`; -1 if none."""
        if offset < self._scanned_to:
            return max(self._code.rfind(ch, 0, offset) for ch in _STATEMENT_END)
        for ch in _STATEMENT_END:
            self._before = max(self._before, self._code.rfind(ch, self._scanned_to, offset))
        self._scanned_to = offset
        return self._before


def _matching_backward(tokens: list[re.Match[str]], close_index: int, open_text: str, close_text: str) -> int | None:
    depth = 0
    for i in range(close_index, -1, -1):
        text = tokens[i][0]
        if text == close_text:
            depth += 1
        elif text == open_text:
            depth -= 1
            if depth == 0:
                return i
    return None


def _integer_arguments(tokens: list[re.Match[str]]) -> tuple[int, ...] | None:
    """(256, 2) for __launch_bounds__(256, 2); None when any argument is not a plain integer literal."""
    arguments = [token[0] for token in tokens[::2]]
    separators = [token[0] for token in tokens[1::2]]
    if not arguments or len(tokens) % 2 == 0 or any(sep != "," for sep in separators):
        return None
    values = []
    for argument in arguments:
        match = _INTEGER_LITERAL.match(argument)
        if match is None:
            return None
        values.append(_c_integer(match.group(1)))
    return tuple(values)


def _c_integer(digits: str) -> int:
    """The value of a C integer literal without suffix: 0x.. is hex, a leading 0 means octal."""
    if digits[:2] in ("0x", "0X"):
        return int(digits, 16)
    if digits.startswith("0") and len(digits) > 1:
        return int(digits, 8)
    return int(digits)


class LineIndex:
    """Offset -> (line, character) for a text, with \\n, \\r\\n and \\r as line breaks (as LSP counts them)."""

    def __init__(self, text: str) -> None:
        if _LONE_CARRIAGE_RETURN.search(text) is None:  # the common case, done with C-level iteration only
            lengths = map(len, text.split("\n"))
            self._line_starts = list(map(add, accumulate(lengths, initial=0), count()))[:-1]
        else:
            self._line_starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]

    def position(self, offset: int) -> Position:
        line = bisect_right(self._line_starts, offset) - 1
        return Position(line, offset - self._line_starts[line])

    def range(self, start: int, end: int) -> Range:
        return Range(self.position(start), self.position(end))

    def offset(self, position: Position) -> int:
        """The offset of a position inside the text (the inverse of `position`)."""
        return self._line_starts[position.line] + position.character
