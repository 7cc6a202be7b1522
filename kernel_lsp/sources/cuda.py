"""CUDA kernels and #includes in `.cu`/`.cuh` text, found by a linear scan (no preprocessor, no parser).

Comments, string and character literals and preprocessor directives are blanked first (replaced by spaces,
line breaks kept), so every offset in the scanned text is an offset in the document.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

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


# Where a comment or literal may start; each is then skipped with str.find, so the scan stays linear.
_LEXICAL_START = re.compile(r"//|/\*|(?<![\w])(?:u8|[uUL])?R\"|\"|'")
_RAW_DELIMITER = re.compile(r"[^()\\\s\"]{0,16}\(")
_DIRECTIVE = re.compile(r"^[ \t]*#(?:\\\r?\n|\\\r|[^\r\n])*", re.MULTILINE)
_INCLUDE = re.compile(r"^[ \t]*(#)[ \t]*include[ \t]*(?:\"([^\"\r\n]*)\"|<([^>\r\n]*)>)", re.MULTILINE)
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_NOT_LINE_BREAK = re.compile(r"[^\r\n]")
_SCOPE_EVENT = re.compile(r"[{}]|\b(?:namespace|__global__)\b")
_NAMESPACE_NAME = re.compile(r"\s*((?:inline\s+)?[A-Za-z_]\w*(?:\s*::\s*(?:inline\s+)?[A-Za-z_]\w*)*)?\s*\Z")
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.']*|::|[^\s\w]")
_INTEGER_LITERAL = re.compile(r"(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\Z")

_SPECIFIERS = frozenset({"static", "extern", "inline", "__inline__", "__forceinline__", "__noinline__", "__device__",
                         "__host__", "constexpr", "__global__"})
_ATTRIBUTE_CALLS = frozenset({"__launch_bounds__", "__maxnreg__", "__attribute__", "__declspec", "alignas",
                              "__cluster_dims__", "decltype"})
_STATEMENT_END = frozenset({";", "{", "}"})
_PREFIX_WINDOW = 8192  # how far back from __global__ a template<...> or attribute is looked for
_SIGNATURE_WINDOW = 65536  # longest signature searched before giving up on one __global__
_ANONYMOUS_NAMESPACE = "(anonymous namespace)"  # how c++filt spells it


def find_kernels(text: str) -> list[CudaKernel]:
    """Every __global__ function definition or declaration, in document order."""
    code = blank_directives(blank_comments_and_literals(text))
    lines = _LineIndex(text)
    brace_pairs, globals_found = _scan_scopes(code)
    kernels = []
    for offset, namespace in globals_found:
        kernel = _kernel_at(code, offset, namespace, brace_pairs, lines)
        if kernel is not None:
            kernels.append(kernel)
    return kernels


def find_includes(text: str) -> list[Include]:
    code = blank_comments_and_literals(text)
    lines = _LineIndex(text)
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
    pieces = []
    done = 0
    search_from = 0
    while True:
        match = _LEXICAL_START.search(text, search_from)
        if match is None:
            break
        start = match.start()
        end = _lexical_end(text, match)
        if end is None:  # a digit separator, not a literal
            search_from = start + 1
            continue
        pieces.append(text[done:start])
        pieces.append(_NOT_LINE_BREAK.sub(" ", text[start:end]))
        done = search_from = end
    pieces.append(text[done:])
    return "".join(pieces)


def blank_directives(code: str) -> str:
    """Preprocessor lines (with their continuations) replaced by spaces: macro bodies are not code."""
    return _DIRECTIVE.sub(lambda m: _NOT_LINE_BREAK.sub(" ", m.group()), code)


def _lexical_end(text: str, match: re.Match[str]) -> int | None:
    token = match.group()
    start = match.start()
    if token == "//":
        return _line_comment_end(text, start)
    if token == "/*":
        close = text.find("*/", start + 2)
        return len(text) if close < 0 else close + 2
    if token.endswith('R"'):
        return _raw_string_end(text, match.end())
    if token == "'" and _is_digit_separator(text, start):
        return None
    return _quoted_end(text, start, token)


def _line_comment_end(text: str, start: int) -> int:
    """A // comment runs to the end of the line, and on past line ends escaped by a backslash."""
    pos = start
    while True:
        newline = _LINE_BREAK.search(text, pos)
        if newline is None:
            return len(text)
        if text[newline.start() - 1] != "\\":
            return newline.start()
        pos = newline.end()


def _raw_string_end(text: str, after_quote: int) -> int:
    delimiter = _RAW_DELIMITER.match(text, after_quote)
    if delimiter is None:
        return _quoted_end(text, after_quote - 1, '"')
    close = text.find(")" + delimiter.group()[:-1] + '"', delimiter.end())
    return len(text) if close < 0 else close + len(delimiter.group()) + 1


def _quoted_end(text: str, start: int, quote: str) -> int:
    """The end of a "..." or '...' literal; an unterminated one stops at the end of its line."""
    pos = start + 1
    length = len(text)
    while pos < length:
        ch = text[pos]
        if ch == quote:
            return pos + 1
        if ch == "\\":
            pos += 3 if text.startswith("\r\n", pos + 1) else 2
            continue
        if ch in "\r\n":
            return pos
        pos += 1
    return length


def _is_digit_separator(text: str, quote: int) -> bool:
    """C++14 1'000'000: the quote follows a number's digits."""
    word_start = quote
    while word_start > 0 and quote - word_start < 64 and (text[word_start - 1].isalnum() or text[word_start - 1] in "_'"):
        word_start -= 1
    return word_start < quote and text[word_start].isdigit()


def _scan_scopes(code: str) -> tuple[dict[int, int], list[tuple[int, str]]]:
    """Matching braces ({ offset -> } offset) and each __global__ offset with its enclosing namespace."""
    brace_pairs: dict[int, int] = {}
    open_braces: list[tuple[int, str | None]] = []  # offset, namespace name if the brace opens one
    globals_found: list[tuple[int, str]] = []
    namespace_keyword_end = -1
    for match in _SCOPE_EVENT.finditer(code):
        token = match.group()
        if token == "{":
            open_braces.append((match.start(), _namespace_opened(code, namespace_keyword_end, match.start())))
        elif token == "}":
            if open_braces:
                brace_pairs[open_braces.pop()[0]] = match.start()
        elif token == "namespace":
            namespace_keyword_end = match.end()
        else:
            names = [name for _, name in open_braces if name is not None]
            globals_found.append((match.start(), "::".join(names)))
    return brace_pairs, globals_found


def _namespace_opened(code: str, keyword_end: int, brace: int) -> str | None:
    if keyword_end < 0 or brace - keyword_end > 1024:
        return None
    match = _NAMESPACE_NAME.match(code, keyword_end, brace)
    if match is None:
        return None
    if match.group(1) is None:
        return _ANONYMOUS_NAMESPACE
    parts = (part.strip() for part in match.group(1).split("::"))
    return "::".join(part.removeprefix("inline").strip() for part in parts)


@dataclass
class _Token:
    text: str
    start: int
    end: int


def _tokens(code: str, start: int, end: int) -> list[_Token]:
    return [_Token(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(code, start, end)]


def _kernel_at(code: str, global_offset: int, namespace: str, brace_pairs: dict[int, int],
               lines: "_LineIndex") -> CudaKernel | None:
    prefix = _declaration_prefix(code, global_offset)
    signature = _signature_after(code, global_offset)
    if signature is None:
        return None
    name, close_paren, suffix_bounds = signature
    body = _body_after(code, close_paren.end, brace_pairs)
    return CudaKernel(
        name=name.text,
        name_range=lines.range(name.start, name.end),
        signature_range=lines.range(prefix.start, close_paren.end),
        body_range=None if body is None else lines.range(*body),
        launch_bounds=prefix.launch_bounds if prefix.launch_bounds is not None else suffix_bounds,
        is_template=prefix.is_template,
        namespace=namespace,
    )


@dataclass
class _Prefix:
    start: int
    is_template: bool = False
    launch_bounds: tuple[int, ...] | None = None


def _declaration_prefix(code: str, global_offset: int) -> _Prefix:
    """Walks back from __global__ over specifiers, template<...> and attributes: where the declaration starts."""
    tokens = _tokens(code, max(0, global_offset - _PREFIX_WINDOW), global_offset)
    prefix = _Prefix(global_offset)
    i = len(tokens) - 1
    while i >= 0:
        token = tokens[i]
        if token.text in _SPECIFIERS:
            prefix.start, i = token.start, i - 1
        elif token.text == ">":
            opening = _matching_backward(tokens, i, "<", ">")
            if opening is None or opening == 0 or tokens[opening - 1].text != "template":
                break
            prefix.start, prefix.is_template, i = tokens[opening - 1].start, True, opening - 2
        elif token.text == ")":
            opening = _matching_backward(tokens, i, "(", ")")
            if opening is None or opening == 0 or tokens[opening - 1].text not in _ATTRIBUTE_CALLS:
                break
            if tokens[opening - 1].text == "__launch_bounds__":
                prefix.launch_bounds = _integer_arguments(tokens[opening + 1:i])
            prefix.start, i = tokens[opening - 1].start, opening - 2
        elif token.text == "]" and i > 0 and tokens[i - 1].text == "]":
            opening = _matching_backward(tokens, i, "[", "]")
            if opening is None:
                break
            prefix.start, i = tokens[opening].start, opening - 1
        else:
            break
    return prefix


def _matching_backward(tokens: list[_Token], close_index: int, open_text: str, close_text: str) -> int | None:
    depth = 0
    for i in range(close_index, -1, -1):
        text = tokens[i].text
        if text == close_text:
            depth += 1
        elif text == open_text:
            depth -= 1
            if depth == 0:
                return i
        elif text in _STATEMENT_END:
            return None
    return None


def _signature_after(code: str, global_offset: int) -> tuple[_Token, _Token, tuple[int, ...] | None] | None:
    """(name, closing paren of the parameters, launch bounds written after __global__), or None if not a function."""
    window_end = min(len(code), global_offset + _SIGNATURE_WINDOW)
    tokens = _tokens(code, global_offset + len("__global__"), window_end)
    launch_bounds = None
    angle_depth = 0
    name = None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.text in _STATEMENT_END:
            return None
        if token.text in _ATTRIBUTE_CALLS and angle_depth == 0:
            closing = _matching_forward(tokens, i + 1, "(", ")")
            if closing is None:
                return None
            if token.text == "__launch_bounds__":
                launch_bounds = _integer_arguments(tokens[i + 2:closing])
            i = closing + 1
            continue
        if token.text == "<":
            angle_depth += 1
        elif token.text == ">":
            angle_depth = max(0, angle_depth - 1)
        elif token.text == "(" and angle_depth == 0:
            closing = _matching_forward(tokens, i, "(", ")")
            if name is None or closing is None:
                return None
            return name, tokens[closing], launch_bounds
        elif angle_depth == 0 and (token.text[0].isalpha() or token.text[0] == "_"):
            name = token
        i += 1
    return None


def _matching_forward(tokens: list[_Token], open_index: int, open_text: str, close_text: str) -> int | None:
    if open_index >= len(tokens) or tokens[open_index].text != open_text:
        return None
    depth = 0
    for i in range(open_index, len(tokens)):
        text = tokens[i].text
        if text == open_text:
            depth += 1
        elif text == close_text:
            depth -= 1
            if depth == 0:
                return i
        elif text in _STATEMENT_END:
            return None
    return None


def _integer_arguments(tokens: list[_Token]) -> tuple[int, ...] | None:
    """(256, 2) for __launch_bounds__(256, 2); None when any argument is not a plain integer literal."""
    arguments = [token.text for token in tokens if token.text != ","]
    if len(arguments) * 2 - 1 != len(tokens) or not arguments:
        return None
    values = []
    for argument in arguments:
        match = _INTEGER_LITERAL.match(argument)
        if match is None:
            return None
        values.append(int(match.group(1), 0) if match.group(1)[:2].lower() == "0x" else int(match.group(1)))
    return tuple(values)


def _body_after(code: str, pos: int, brace_pairs: dict[int, int]) -> tuple[int, int] | None:
    """The body's (start, end) offsets, braces included; an unclosed body runs to the end of the text."""
    tokens = _TOKEN.finditer(code, pos, min(len(code), pos + _SIGNATURE_WINDOW))
    for match in tokens:
        token = match.group()
        if token == "{":
            close = brace_pairs.get(match.start())
            return match.start(), len(code) if close is None else close + 1
        if token in (";", "}", "=", ","):
            return None
    return None


class _LineIndex:
    """Offset -> (line, character) for a text, with \\n, \\r\\n and \\r as line breaks (as LSP counts them)."""

    def __init__(self, text: str) -> None:
        self._line_starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]

    def position(self, offset: int) -> Position:
        line = bisect_right(self._line_starts, offset) - 1
        return Position(line, offset - self._line_starts[line])

    def range(self, start: int, end: int) -> Range:
        return Range(self.position(start), self.position(end))
