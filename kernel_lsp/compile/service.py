"""Compile checks with the content-addressed cache in front: the one entry point the server and CLI use."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from kernel_lsp.compile.clangd import ClangdPass, cuda_home_for, fallback_flags, find_clangd
from kernel_lsp.compile.check import Document, Scratch, StageReport, check_document
from kernel_lsp.compile.toolchain import ToolProblem, find_host_compiler, find_nvcc, find_torch_headers
from kernel_lsp.compile.reuse import Reuse, header_stamps, quoted_dependencies
from kernel_lsp.config import Settings
from kernel_lsp.jobs.cache import ResultCache, cache_key

# results that say the run itself went wrong are not cached: the next save should try again
_TRANSIENT_CODES = {"compile-timeout", "compile-failed", "nvcc-missing", "host-compiler-missing", "torch-missing"}
CACHE_FORMAT = 1


class CompileService:
    def __init__(self, cache: ResultCache | None = None, first_pass: bool = False) -> None:
        """`first_pass`: use clangd's first squiggle on plain `.cu` files when the `clangd` setting finds one (the
        server; a CLI run checks each file once, where clang has not yet agreed with nvcc on anything)."""
        self.cache = cache or ResultCache()
        self.scratch = Scratch()
        self.reuse = Reuse(self.cache)  # unit results and fast-check calibrations (compile/reuse.py)
        self._first_pass_wanted = first_pass
        self._first_pass: tuple[tuple, ClangdPass | None] | None = None  # (what it was made for, the pass)

    async def _clangd(self, settings: Settings) -> ClangdPass | None:
        """The clangd child for these settings: looked for (PATH, the CUDA folder) once per setting, nvcc and
        include folders, not on every check; a new one when they change."""
        if not self._first_pass_wanted:
            return None
        try:
            nvcc = await find_nvcc(settings)
        except ToolProblem:
            return None
        wanted = (settings.compile.clangd, nvcc.path, settings.compile.include_dirs)
        if self._first_pass is not None and self._first_pass[0] == wanted:
            return self._first_pass[1]
        await self.close()
        clangd = find_clangd(settings.compile.clangd)
        first_pass = (ClangdPass(clangd, fallback_flags(cuda_home_for(nvcc.path), settings.compile.include_dirs))
                      if clangd is not None else None)
        self._first_pass = (wanted, first_pass)
        return first_pass

    async def close(self) -> None:
        if self._first_pass is not None and self._first_pass[1] is not None:
            await self._first_pass[1].close()

    async def run(self, doc: Document, settings: Settings) -> AsyncIterator[StageReport]:
        key = cache_key(CACHE_FORMAT, doc.uri, doc.text, settings.fingerprint(), settings.diagnostics.ignore,
                        await _tool_fingerprint(doc, settings))
        cached = self.cache.get(key)
        if cached is not None:
            yield StageReport("cache", cached, final=True)
            return
        last: StageReport | None = None
        first_pass = await self._clangd(settings) if doc.path.suffix == ".cu" else None
        async for report in check_document(doc, settings, self.scratch, self.reuse, first_pass):
            last = report
            yield report
        if last is not None and not any(f.code in _TRANSIENT_CODES for f in last.findings):
            self.cache.put(key, last.findings, quoted_dependencies(doc.path, doc.text, settings.compile.include_dirs))


async def _tool_fingerprint(doc: Document, settings: Settings) -> list[str]:
    """Versions of the tools that would compile this document (or why they are missing)."""
    finders = [find_nvcc]
    if doc.path.suffix == ".py":
        finders += [find_host_compiler, find_torch_headers]
    parts = []
    for finder in finders:
        try:
            found = await finder(settings)
        except ToolProblem as exc:
            parts.append(str(exc))
            continue
        parts.append(repr(found))
        if finder is find_torch_headers:  # an upgrade in place keeps the folders: their stamps change
            parts.append(repr(await asyncio.to_thread(header_stamps, found.include_dirs)))
    return parts
