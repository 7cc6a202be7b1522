"""Parse what nvcc prints on stderr into `CompilerMessage`s.

nvcc's stderr interleaves four producers, each with its own format:

- the EDG front end (cudafe++): `x.cu(12): error: msg`, `x.cu(12): warning #177-D: msg`, continuation lines
  indented by more than two spaces, the *preprocessed* source line echoed with a two-space indent, a caret
  line under it, and `detected during ... at line N of path` instantiation context;
- the host compiler (gcc/g++, which also preprocesses for nvcc): `x.cu:12:5: error: msg [-Wfoo]`, notes,
  `In file included from`, `x.cu: In function 'f':`, `required from here`, and `   12 | src` / `      | ^` echoes;
- ptxas: `ptxas error   : msg`, `ptxas x.ptx, line 5; error   : msg`, `ptxas fatal   : msg`;
- nvcc and its device linker: `nvcc fatal   : msg`, `nvcc warning : msg`, `nvlink error   : msg`.

The parser is a line-oriented state machine: one EDG message at a time is open (it collects continuation,
echo and caret lines until a blank or an unindented line), gcc's context lines wait for the message they
introduce, and notes fold into the message before them. Unknown lines are skipped; it never raises.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_EDG_HEADER = re.compile(
    r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<severity>catastrophic error|internal error|error|warning|remark|note)"
    r"(?: #(?P<code>[\w-]+))?: (?P<message>.*)$")
_EDG_COMMAND_LINE = re.compile(r"^Command-line (?P<severity>error|warning): (?P<message>.*)$")
_EDG_AT_LINE = re.compile(r"^(?P<what>.*?) at line (?P<line>\d+)(?: of (?P<file>.+))?$")
_CARET = re.compile(r"^(?P<indent>\s*)\^\s*$")
_GCC_HEADER = re.compile(
    r"^(?P<file>.+?):(?P<line>\d+):(?:(?P<column>\d+):)? (?P<severity>fatal error|error|warning|note): "
    r"(?P<message>.*)$")
_GCC_OPTION = re.compile(r"\s*\[(?P<code>-W[^\]]+|-f[^\]]+)\]$")
_GCC_DRIVER = re.compile(
    r"^(?P<driver>cc1plus|cc1|collect2|[\w.+-]*(?:gcc|g\+\+|c\+\+|clang\+\+|clang)(?:-\d+)?): "
    r"(?P<severity>fatal error|error|warning|note): (?P<message>.*)$")
_GCC_INCLUDED_FROM = re.compile(r"^(?:In file included from|\s+from) (?P<file>.+?):(?P<line>\d+)(?::\d+)?[:,]$")
_GCC_INSTANTIATION = re.compile(r"^.+?: (?P<context>In (?:instantiation|substitution) of .*):$")
_GCC_SCOPE = re.compile(r"^.+?: (?:In|At) .*:$")
_GCC_REQUIRED_FROM = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?:(?P<column>\d+):)?\s{2,}(?P<message>\S.*)$")
_GCC_ECHO = re.compile(r"^\s*(?:\d+\s+)?\|(?: |$)")
_TOOL = re.compile(
    r"^(?P<tool>ptxas|nvcc|nvlink)(?: (?P<file>.+?), line (?P<line>\d+);)? "
    r"(?P<severity>error|warning|fatal|info)\s*: (?P<message>.*)$")
_SYMBOL = re.compile(r"(?:[Ff]unction|reference to) '(?P<symbol>[^']+)'")
_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*")
_NOT_MESSAGES = re.compile(
    r"^(?:\d+ (?:catastrophic )?errors? detected in the compilation of .*|Compilation terminated\.|"
    r"compilation terminated\.|Error limit reached\.|Remark: The warnings can be suppressed with .*)$")

_SEVERITY = {"catastrophic error": "error", "internal error": "error", "fatal error": "error"}
_TOOL_NAME = {"ptxas": "ptxas", "nvcc": "nvcc", "nvlink": "nvcc"}


@dataclass
class RelatedLocation:
    file: str | None
    line: int | None
    column: int | None
    message: str


@dataclass
class CompilerMessage:
    file: str | None
    line: int | None  # 1-based
    column: int | None  # 1-based; EDG gives none (see echo_column and source_column)
    severity: str  # error | warning | remark | note | fatal
    message: str
    code: str | None = None  # EDG's '177-D' or gcc's '-Wunused-variable'
    tool: str = "nvcc"  # nvcc-frontend | host-compiler | ptxas | nvcc
    echo: str | None = None  # the (preprocessed) source line EDG printed under the message
    echo_column: int | None = None  # 1-based column of the caret within echo
    related: list[RelatedLocation] = field(default_factory=list)
    symbol: str | None = None  # mangled name a ptxas/nvlink message is about


def parse_compiler_output(text: str) -> list[CompilerMessage]:
    """All messages in nvcc's (or gcc's, or ptxas') output, in order, exact duplicates dropped."""
    lines = [_ANSI.sub("", line) for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    parser = _OutputParser()
    for index, line in enumerate(lines):
        parser.feed(line, lines[index + 1] if index + 1 < len(lines) else "")
    return _without_duplicates(parser.finish())


def _without_duplicates(messages: list[CompilerMessage]) -> list[CompilerMessage]:
    """nvcc preprocesses and front-ends each file twice (device and host pass), printing many messages twice."""
    seen: set[tuple] = set()
    kept = []
    for m in messages:
        key = (m.tool, m.file, m.line, m.column, m.severity, m.message, m.code, m.echo_column)
        if key not in seen:
            seen.add(key)
            kept.append(m)
    return kept


class _OutputParser:
    def __init__(self) -> None:
        self.messages: list[CompilerMessage] = []
        self.open_edg: CompilerMessage | None = None  # EDG message still collecting indented lines
        self.gcc_context: list[RelatedLocation] = []  # include chain / instantiation, for the next gcc message
        self.gcc_instantiation: str | None = None  # "In instantiation of ..." until its "required from" line

    def feed(self, line: str, next_line: str) -> None:
        if self.open_edg is not None and line[:1].isspace() and line.strip():
            self._edg_indented(self.open_edg, line, next_line)
            return
        self._close_edg()
        if not line.strip() or _NOT_MESSAGES.match(line):
            return
        for handler in (self._edg_header, self._tool_line, self._gcc_header, self._gcc_context_line,
                        self._gcc_driver, self._edg_command_line):
            if handler(line):
                return

    def finish(self) -> list[CompilerMessage]:
        self._close_edg()
        return self.messages

    def _edg_header(self, line: str) -> bool:
        m = _EDG_HEADER.match(line)
        if not m:
            return False
        self.open_edg = CompilerMessage(m["file"], int(m["line"]), None, _severity(m["severity"]), m["message"],
                                        m["code"], "nvcc-frontend")
        return True

    def _edg_indented(self, msg: CompilerMessage, line: str, next_line: str) -> None:
        caret = _CARET.match(line)
        if caret and msg.echo is not None and msg.echo_column is None:
            msg.echo_column = max(len(caret["indent"]) - 1, 1)
        elif _CARET.match(next_line) and msg.echo is None:
            msg.echo = line[2:] if line.startswith("  ") else line.lstrip()
        elif not caret:
            self._edg_continuation(msg, line.strip())

    def _edg_continuation(self, msg: CompilerMessage, text: str) -> None:
        msg.message += "\n" + text
        at = _EDG_AT_LINE.match(text)
        if at:
            what = at["what"].removeprefix("detected during ").strip()
            msg.related.append(RelatedLocation(at["file"] or msg.file, int(at["line"]), None, what))

    def _close_edg(self) -> None:
        if self.open_edg is not None:
            self._add(self.open_edg)
            self.open_edg = None

    def _edg_command_line(self, line: str) -> bool:
        m = _EDG_COMMAND_LINE.match(line)
        if m:
            self._add(CompilerMessage(None, None, None, m["severity"], m["message"], tool="nvcc-frontend"))
        return bool(m)

    def _tool_line(self, line: str) -> bool:
        m = _TOOL.match(line)
        if not m:
            return False
        if m["severity"] != "info":
            symbol = _SYMBOL.search(m["message"])
            self._add(CompilerMessage(m["file"], int(m["line"]) if m["line"] else None, None, m["severity"],
                                      m["message"].strip(), tool=_TOOL_NAME[m["tool"]],
                                      symbol=symbol["symbol"] if symbol else None))
        return True

    def _gcc_header(self, line: str) -> bool:
        m = _GCC_HEADER.match(line)
        if not m:
            return False
        text, code = _split_gcc_option(m["message"])
        msg = CompilerMessage(m["file"], int(m["line"]), int(m["column"]) if m["column"] else None,
                              _severity(m["severity"]), text, code, "host-compiler", related=self.gcc_context)
        self.gcc_context = []
        self._add(msg)
        return True

    def _gcc_driver(self, line: str) -> bool:
        m = _GCC_DRIVER.match(line)
        if m:
            text, code = _split_gcc_option(m["message"])
            self._add(CompilerMessage(None, None, None, _severity(m["severity"]), f"{m['driver']}: {text}", code,
                                      "host-compiler"))
        return bool(m)

    def _gcc_context_line(self, line: str) -> bool:
        if _GCC_ECHO.match(line):
            return True
        if m := _GCC_INCLUDED_FROM.match(line):
            self.gcc_context.append(RelatedLocation(m["file"], int(m["line"]), None, "included from here"))
        elif m := _GCC_INSTANTIATION.match(line):
            self.gcc_instantiation = m["context"]
        elif m := _GCC_REQUIRED_FROM.match(line):
            text = f"{self.gcc_instantiation}: {m['message']}" if self.gcc_instantiation else m["message"]
            self.gcc_instantiation = None
            self.gcc_context.append(RelatedLocation(m["file"], int(m["line"]),
                                                    int(m["column"]) if m["column"] else None, text))
        return bool(m) or bool(_GCC_SCOPE.match(line))

    def _add(self, msg: CompilerMessage) -> None:
        """Notes belong to the message before them (same tool); a note with nothing before it stands alone."""
        previous = self.messages[-1] if self.messages else None
        if msg.severity == "note" and previous is not None and previous.tool == msg.tool:
            previous.related.append(RelatedLocation(msg.file, msg.line, msg.column, msg.message))
        else:
            self.messages.append(msg)


def _severity(word: str) -> str:
    return _SEVERITY.get(word, word)


def _split_gcc_option(message: str) -> tuple[str, str | None]:
    """gcc ends a warning with the option that enables it: 'unused variable 'q' [-Wunused-variable]'."""
    m = _GCC_OPTION.search(message)
    if not m:
        return message, None
    return message[:m.start()], m["code"]


def source_column(echo: str, echo_column: int, source_line: str) -> int:
    """The 1-based column in `source_line` of the caret at `echo_column` in EDG's preprocessed echo.

    EDG echoes the line after preprocessing (`__global__` shows as `__attribute__((global))`, macros expanded),
    so the caret is aligned onto the real line: unchanged text maps character for character; a caret inside
    rewritten text goes to the same text found after it in the source. A caret that lands in a macro's
    expansion (or whose text is nowhere in the source) goes to the macro's name.
    """
    index = echo_column - 1
    if echo == source_line or not 0 <= index < len(echo):
        return _clamped(echo_column, source_line)
    position, exact = _aligned_position(echo, index, source_line)
    for start, end in reversed(_macro_spans(echo, source_line)):
        if start <= position and (position < end or not exact):
            return start + 1
    return position + 1


def _aligned_position(echo: str, index: int, source_line: str) -> tuple[int, bool]:
    """0-based source position of echo[index], and whether it is exact or only where rewritten text begins."""
    matcher = difflib.SequenceMatcher(None, echo, source_line, autojunk=False)
    for tag, e1, e2, s1, _ in matcher.get_opcodes():
        if e1 <= index < e2:
            if tag == "equal":
                return s1 + (index - e1), True
            found = _text_after_caret(echo[index:], source_line, s1)
            return (found, True) if found is not None else (s1, False)
    return min(index, len(source_line)), False


def _macro_spans(echo: str, source_line: str) -> list[tuple[int, int]]:
    """Identifiers of the source line that preprocessing made disappear from the echo: macro names."""
    echo_words = set(_IDENTIFIER.findall(echo))
    return [(m.start(), m.end()) for m in _IDENTIFIER.finditer(source_line) if m[0] not in echo_words]


def _text_after_caret(rest: str, source_line: str, near: int) -> int | None:
    """Where the longest start of the text from the caret on occurs in the source, the occurrence nearest `near`."""
    text = rest.strip()
    token = re.match(r"\w+|\S", text)
    if token is None or token[0] not in source_line:
        return None
    shortest, longest = len(token[0]), len(text)
    while shortest < longest:  # a prefix that occurs has all its own prefixes occurring: bisect on length
        middle = (shortest + longest + 1) // 2
        shortest, longest = (middle, longest) if text[:middle] in source_line else (shortest, middle - 1)
    starts = [m.start() for m in re.finditer(re.escape(text[:shortest]), source_line)]
    return min(starts, key=lambda s: abs(s - near))


def _clamped(column: int, source_line: str) -> int:
    return min(max(column, 1), len(source_line) + 1)
