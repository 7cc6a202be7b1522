"""Where a candidate's kernels and their instructions sit in the user's own files (torch-free).

A kernel is found by its base name in `.cu`/`.cuh` files, in load_inline CUDA strings of `.py` files (mapped
back through the generated cuda.cu's source map) and among @triton.jit and @cute.kernel functions. Positions are 0-based Ranges.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kernel_lsp.compile.units import CUDA_SUFFIXES, CompileUnit
from kernel_lsp.findings import Range
from kernel_lsp.sources import assemble_load_inline, find_kernels, parse_python
from kernel_lsp.sources.cuda import blank_comments_and_literals
from kernel_lsp.sources.sourcemap import SourceMap


@dataclass(frozen=True)
class Location:
    file: str  # the user's path (the job's origins), or the job's file name where no origin is known
    range: Range


def kernel_locations(files: dict[str, str], origins: dict[str, str]) -> dict[str, Location]:
    """Kernel base name -> the range of its name where it is defined, over every file of the job."""
    found: dict[str, Location] = {}
    for name, text in files.items():
        path = origins.get(name, name)
        for kernel, rng in _kernels_in(name, text):
            found.setdefault(kernel, Location(path, rng))
    return found


def _kernels_in(name: str, text: str) -> list[tuple[str, Range]]:
    if name.endswith(CUDA_SUFFIXES):
        return [(k.name, k.name_range) for k in find_kernels(text) if k.has_body]
    if not name.endswith(".py"):
        return []
    model = parse_python(text)
    kernels = [(k.name, k.name_range) for k in model.triton_kernels]
    kernels += [(k.name, k.name_range) for k in model.cute_kernels if k.role == "kernel"]
    for ext in model.extensions:
        if ext.kind != "load_inline" or not ext.cuda_sources:
            continue
        cuda_file, _ = assemble_load_inline(ext)
        for kernel in find_kernels(cuda_file.text):
            mapped = cuda_file.map.range_to_original(kernel.name_range) if kernel.has_body else None
            if mapped is not None:
                kernels.append((kernel.name, mapped))
    return kernels


SHARED = re.compile(r"\b__shared__\b")


@dataclass(frozen=True)
class SharedDeclaration:
    kernel: str | None  # the kernel whose body holds it; None: a device function's or the file's
    location: Location  # the declaration's `__shared__`


def shared_declarations(files: dict[str, str], origins: dict[str, str]) -> list[SharedDeclaration]:
    """Every `__shared__` in the CUDA of the job's files (`.cu`/`.cuh` files, load_inline strings mapped back), in
    file order; comments and string literals do not count."""
    found: list[SharedDeclaration] = []
    for name, text in files.items():
        path = origins.get(name, name)
        if name.endswith(CUDA_SUFFIXES):
            found += [SharedDeclaration(kernel, Location(path, rng)) for kernel, rng in _shared_in(text)]
        elif name.endswith(".py"):
            for ext in parse_python(text).extensions:
                if ext.kind != "load_inline" or not ext.cuda_sources:
                    continue
                cuda_file, _ = assemble_load_inline(ext)
                for kernel, rng in _shared_in(cuda_file.text):
                    mapped = cuda_file.map.range_to_original(rng)
                    if mapped is not None:
                        found.append(SharedDeclaration(kernel, Location(path, mapped)))
    return found


def _shared_in(text: str) -> list[tuple[str | None, Range]]:
    code = blank_comments_and_literals(text)
    bodies = [(k.name, k.body_range) for k in find_kernels(text) if k.body_range is not None]
    found = []
    for match in SHARED.finditer(code):
        line = code.count("\n", 0, match.start())
        column = match.start() - (code.rfind("\n", 0, match.start()) + 1)
        kernel = next((name for name, body in bodies if body.start.line <= line <= body.end.line), None)
        found.append((kernel, Range.of(line, column, line, column + len("__shared__"))))
    return found


def document_line(unit: CompileUnit, line: int) -> int | None:
    """A 1-based line of the compiled unit as a 1-based line of the user's file; None for generated text
    (torch's headers, the module definition)."""
    if unit.source_map is None:
        return line
    mapped = original_line(unit.source_map, unit.lines, line)
    return None if mapped is None else mapped + 1


def original_line(source_map: SourceMap, lines: Sequence[str], line: int) -> int | None:
    """A 1-based line of a generated text (its `lines`, its `source_map`) as a 0-based line of the original; None
    for generated text."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    for column in (len(text) - len(text.lstrip()), 0):  # the first character of the code, else the line start
        mapped = source_map.to_original(line - 1, column)
        if mapped is not None:
            return mapped[0]
    return None
