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
from kernel_lsp.sources import GeneratedFile, InlineExtension
from kernel_lsp.sources.cuda import LineIndex, blank_comments_and_literals
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
    for _, cuda_file in inline_cuda(model.extensions):
        for kernel in find_kernels(cuda_file.text):
            mapped = cuda_file.map.range_to_original(kernel.name_range) if kernel.has_body else None
            if mapped is not None:
                kernels.append((kernel.name, mapped))
    return kernels


def inline_cuda(extensions: Sequence[InlineExtension]) -> list[tuple[InlineExtension, GeneratedFile]]:
    """The load_inline calls among a file's extensions that have CUDA sources, each with the cuda.cu it writes."""
    found = []
    for ext in extensions:
        if ext.kind == "load_inline" and ext.cuda_sources:
            cuda_file, _ = assemble_load_inline(ext)
            if cuda_file is not None:
                found.append((ext, cuda_file))
    return found


SHARED = re.compile(r"\b__shared__\b")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class SharedDeclaration:
    kernel: str | None  # the kernel whose body holds it; None: a device function's or the file's
    location: Location  # the declaration's `__shared__`
    names: tuple[str, ...] = ()  # the arrays or variables it declares
    reads: tuple[Location, ...] = ()  # later uses of them in the kernel's body that are not plain stores


def shared_declarations(files: dict[str, str], origins: dict[str, str]) -> list[SharedDeclaration]:
    """Every `__shared__` in the CUDA of the job's files (`.cu`/`.cuh` files, load_inline strings mapped back), in
    file order, with what it declares and where the kernel reads it; comments and string literals do not count."""
    found: list[SharedDeclaration] = []
    for name, text in files.items():
        path = origins.get(name, name)
        if name.endswith(CUDA_SUFFIXES):
            found += [SharedDeclaration(kernel, Location(path, rng), names, tuple(Location(path, r) for r in reads))
                      for kernel, rng, names, reads in _shared_in(text)]
        elif name.endswith(".py"):
            for _, cuda_file in inline_cuda(parse_python(text).extensions):
                for kernel, rng, names, reads in _shared_in(cuda_file.text):
                    mapped = cuda_file.map.range_to_original(rng)
                    if mapped is None:
                        continue
                    places = (cuda_file.map.range_to_original(r) for r in reads)
                    found.append(SharedDeclaration(kernel, Location(path, mapped), names,
                                                   tuple(Location(path, r) for r in places if r is not None)))
    return found


def _shared_in(text: str) -> list[tuple[str | None, Range, tuple[str, ...], list[Range]]]:
    """(kernel, the `__shared__` keyword's range, the names declared, the ranges of their reads) per declaration.
    A read is any later use in the kernel's body that is not the target of a plain `=` (`tile[i] = x` stores;
    `tile[i] += x`, `f(tile)` and `float* p = tile` read)."""
    code = blank_comments_and_literals(text)
    lines = LineIndex(text)
    bodies = [(k.name, k.body_range) for k in find_kernels(text) if k.body_range is not None]
    found = []
    for match in SHARED.finditer(code):
        keyword = lines.range(match.start(), match.end())
        line = keyword.start.line
        kernel, body = next(((name, body) for name, body in bodies if body.start.line <= line <= body.end.line),
                            (None, None))
        end = code.find(";", match.end())
        names = _declared_names(code[match.end():end if end >= 0 else len(code)])
        reads: list[Range] = []
        if body is not None and end >= 0:
            body_end = lines.offset(body.end)
            for name in names:
                for use in re.finditer(rf"\b{re.escape(name)}\b", code[end:body_end]):
                    offset = end + use.start()
                    if not _is_store(code, offset + len(name)):
                        reads.append(lines.range(offset, offset + len(name)))
        reads.sort(key=lambda r: (r.start.line, r.start.character))
        found.append((kernel, keyword, names, reads))
    return found


def _declared_names(declaration: str) -> tuple[str, ...]:
    """The declarators' names of `float tile[256]`, `float a[16], b[16]`, `__align__(16) T smem[]`: the last
    identifier of each comma-separated part, with brackets, parentheses and templates' arguments emptied."""
    flat = declaration
    for pattern in (r"\[[^\[\]]*\]", r"\([^()]*\)", r"<[^<>]*>"):
        while True:
            emptied = re.sub(pattern, "", flat)
            if emptied == flat:
                break
            flat = emptied
    names = []
    for part in flat.split(","):
        words = IDENTIFIER.findall(part.split("=")[0])
        if words:
            names.append(words[-1])
    return tuple(names)


def _is_store(code: str, offset: int) -> bool:
    """Whether the name ending at `offset` is the target of a plain assignment: `name[...]... = ` or
    `name.field = `, not `==`."""
    i = offset
    while True:
        while i < len(code) and code[i] in " \t\r\n":
            i += 1
        if i < len(code) and code[i] == "[":
            depth = 0
            while i < len(code):
                depth += code[i] == "["
                depth -= code[i] == "]"
                i += 1
                if depth == 0:
                    break
            continue
        member = re.match(r"\.\s*[A-Za-z_]\w*", code[i:i + 200])
        if member:
            i += member.end()
            continue
        break
    return i < len(code) and code[i] == "=" and code[i + 1:i + 2] != "="


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
