"""Where a compiler message lands in the unit: the token at its column, the call a `)` closes, the line's code
when the message has no column. The real-nvcc cases are in tests/cli/test_check_command.py."""

from __future__ import annotations

from pathlib import Path

from kernel_lsp.compile.check import Document, message_finding
from kernel_lsp.compile.diagnostics import CompilerMessage
from kernel_lsp.compile.units import CompileUnit

TEXT = "__global__ void k(float* x) {\n    x[0] = scale(x[1], 2) >> 3;\n}\n"
LINE = TEXT.splitlines()[1]


def covered(column: int | None) -> str:
    unit = CompileUnit("device", "k.cu", TEXT, ())
    doc = Document("file:///w/k.cu", Path("/w/k.cu"), TEXT)
    msg = CompilerMessage("k.cu", 2, column, "error", "something is wrong", tool="nvcc-frontend")
    finding = message_finding(doc, unit, msg, Path("/w"))
    rng = finding.range
    assert rng.start.line == rng.end.line == 1
    return LINE[rng.start.character:rng.end.character]


def test_no_column_covers_the_line_code_without_indentation():
    assert covered(None) == "x[0] = scale(x[1], 2) >> 3;"


def test_a_column_covers_its_token_or_bracketed_call():
    assert covered(LINE.index("scale") + 1) == "scale"
    assert covered(LINE.index(">>") + 1) == ">>"
    assert covered(LINE.index("2)") + 2) == "scale(x[1], 2)"
    assert covered(LINE.index("],") + 1) == "x[1]"
