"""The kernel-only compile of a load_inline CUDA unit, and when its result stands for the exact one.

A `load_inline` CUDA source is kernels plus host wrappers that take and return `torch::Tensor`; nvcc spends nearly
all of its time on the torch headers the wrappers need (compile/reuse.py). The **split** text is the unit with its
torch includes, every top-level statement that names torch (the wrappers, their prototypes) and every host function
(which only host code can call) blanked, lines kept; the kernels, device and constexpr functions, types, constants
and macros stay. It compiles in well under a second, to the same front-end
messages in the kernels and the same ptxas figures, when nothing in the kernels depends on torch.

That is checked, not assumed. A **certificate** is earned by a version whose exact compile and split compile gave
the same output (exit status, every message with its line, every kernel's ptxas resources). It holds for a later
version whose **skeleton** (the unit with each `__global__` body emptied) is the certified one's and whose command
line is the same: the edit was inside kernel bodies only, so the wrappers, the kernels' signatures and everything
the wrappers see are unchanged, and the exact compile's output differs from the certified one only in what the kernel
bodies produce, which the split compile produces too. Its result is then shown as the unit's full result (errors,
warnings, ptxas resources), seconds after the edit; the exact compile still runs, and its result replaces it. A
composed result that differs from the exact one drops the certificate (logged); the next agreeing pair earns it
again.

An error of the split compile naming an identifier could be the torch headers' absence speaking (a kernel that now
uses `at::Half`, `std::max` from a header torch brought in): such a result is composed only when none of the names
the error quotes occurs as a token in torch's preprocessed headers (`torch_tokens`, one `nvcc -E` per command line
and torch version); otherwise the errors stay preliminary and the exact compile decides.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from kernel_lsp.compile.diagnostics import CompilerMessage
from kernel_lsp.compile.units import CompileUnit
from kernel_lsp.sources.cuda import blank_comments_and_literals, blank_directives
from profilers.ptxas import KernelResources, parse_ptxas_verbose

# the includes the split and fast compiles blank: torch's, and what only torch's wrappers need (pybind11, Python)
TORCH_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"](?:(?:torch|ATen|c10|caffe2|pybind11)/[^>"\n]*'
                           r'|Python\.h)[>"][^\n]*', re.MULTILINE)
_DEVICE_CODE = re.compile(r"\b(?:__global__|__device__|__constant__|__shared__|__managed__)\b")
_NAMES_TORCH = re.compile(r"\b(?:torch|at|c10|caffe2|pybind11|py)\s*::|\b(?:TORCH|AT|C10|PYBIND11)_\w+"
                          r"|\bTensor\b|\bIntArrayRef\b")
_CONSTEXPR = re.compile(r"\bconstexpr\b")  # a host function device code may call (--expt-relaxed-constexpr)
_SCOPE_HEAD = re.compile(r"^\s*(?:(?:inline\s+)?namespace\b[\w\s:]*|extern\s*)$")  # extern "C" (literal blanked)
_CLASS_HEAD = re.compile(r"^\s*(?:template\s*<[^{;]*?>\s*)?(?:struct|class|union|enum)\b")
_QUOTED_NAME = re.compile(r'["\'‘]([A-Za-z_]\w*)["\'’]')  # EDG quotes "x", gcc 'x' or ‘x’
_TOKEN = re.compile(r"[A-Za-z_]\w*")


def split_text(unit: CompileUnit) -> str | None:
    """The unit with torch's includes and its torch-naming top-level statements blanked (lines kept); None when
    the unit is not a load_inline CUDA unit with kernels that includes torch."""
    if unit.stage != "device" or not unit.torch_flags or not unit.kernels or not TORCH_INCLUDE.search(unit.text):
        return None
    text = TORCH_INCLUDE.sub(lambda m: " " * len(m[0]), unit.text)
    code = blank_directives(blank_comments_and_literals(text))
    pieces = []
    last = 0
    for start, end, function in top_level_statements(code):
        statement = code[start:end]
        host_only = function and not _CONSTEXPR.search(statement[:statement.index("{")])
        if (host_only or _NAMES_TORCH.search(statement)) and not _DEVICE_CODE.search(statement):
            pieces += [text[last:start], re.sub(r"[^\n]", " ", text[start:end])]
            last = end
    return "".join(pieces) + text[last:]


def top_level_statements(code: str) -> list[tuple[int, int, bool]]:
    """(start, end, whether it defines a function) of each statement at namespace scope in `code` (comments,
    literals and directives blanked): a declaration to its `;`, a function definition to its closing brace.
    Namespaces and extern "C" blocks are gone into, not statements themselves."""
    found: list[tuple[int, int, bool]] = []
    start = 0
    parens = 0
    braces = 0  # inside a statement's braces (a body, an initializer, a class)
    scopes = 0  # namespaces and extern "C" blocks open around here
    body_ends_statement = False
    for index, char in enumerate(code):
        if char in "([":
            parens += 1
        elif char in ")]":
            parens = max(parens - 1, 0)
        elif parens:
            continue
        elif char == "{":
            if braces == 0:
                head = code[start:index]
                if _SCOPE_HEAD.match(head):
                    scopes += 1
                    start = index + 1
                    continue
                body_ends_statement = "(" in head and "=" not in head and not _CLASS_HEAD.match(head)
            braces += 1
        elif char == "}":
            if braces == 0:
                if scopes:  # a namespace ends
                    scopes -= 1
                    if code[start:index].strip():
                        found.append((start, index, False))
                    start = index + 1
                continue
            braces -= 1
            if braces == 0 and body_ends_statement:
                found.append((start, index + 1, True))
                start = index + 1
        elif char == ";" and braces == 0:
            found.append((start, index + 1, False))
            start = index + 1
    if code[start:].strip():
        found.append((start, len(code), False))
    return found


def skeleton(unit: CompileUnit) -> str:
    """The unit with each __global__ body emptied: what an edit inside kernel bodies leaves unchanged."""
    starts = [0]
    for line in unit.lines:
        starts.append(starts[-1] + len(line) + 1)
    pieces = []
    last = 0
    for kernel, _ in sorted(unit.kernels, key=lambda k: (k[0].body_range.start.line, k[0].body_range.start.character)):
        body = kernel.body_range
        first = starts[body.start.line] + body.start.character
        end = starts[body.end.line] + body.end.character
        pieces += [unit.text[last:first], "{}"]
        last = max(end, first)
    return "".join(pieces) + unit.text[last:]


@dataclass(frozen=True)
class Output:
    """A compile's output as compared between the exact and the split run: exit status, every message (file by
    name, so the two folders compare equal), and ptxas's figures per kernel without the compile time."""
    returncode: int | None
    messages: tuple[tuple, ...]
    resources: tuple[KernelResources, ...]


def output_of(returncode: int | None, text: str, messages: list[CompilerMessage]) -> Output:
    kept = tuple((m.tool, m.severity, (m.file or "").rsplit("/", 1)[-1], m.line, m.column, m.message)
                 for m in messages if not (m.tool == "ptxas" and m.severity == "info"))
    resources = tuple(dataclasses.replace(r, compile_time_ms=None) for r in parse_ptxas_verbose(text))
    return Output(returncode, kept, resources)


def quoted_names(messages: list[CompilerMessage]) -> set[str]:
    """The identifiers the errors name: those they quote ("y" in `identifier "y" is undefined`, `namespace "std"
    has no member "max"`) and the one under EDG's caret (`at` in `at::Half`, for `name followed by "::" must be a
    class or namespace name`)."""
    names = set()
    for m in messages:
        if m.severity not in ("error", "fatal"):
            continue
        names.update(_QUOTED_NAME.findall(m.message))
        if m.echo and m.echo_column:
            at = m.echo_column - 1
            names.update(t[0] for t in _TOKEN.finditer(m.echo) if t.start() <= at < t.end())
    return names


def tokens_of(preprocessed: str) -> frozenset[str]:
    """Every identifier token of a preprocessed text (line markers included: harmless, they name files)."""
    return frozenset(_TOKEN.findall(blank_comments_and_literals(preprocessed)))


def torch_prologue(unit: CompileUnit) -> str:
    """The unit's torch include lines alone: what `nvcc -E` expands into the names torch's headers bring."""
    return "\n".join(m[0] for m in TORCH_INCLUDE.finditer(unit.text)) + "\n"
