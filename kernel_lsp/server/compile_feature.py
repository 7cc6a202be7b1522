"""Compile diagnostics feature: document open/change/save/close hooks feeding the scheduler; closed workspace
files (server/workspace_feature.py) are checked from disk at the lowest priority, publishing their final report."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

from lsprotocol import types

from kernel_lsp.compile.check import SOURCE, Document
from kernel_lsp.compile.service import CompileService
from kernel_lsp.compile.units import is_cuda_document, is_python_document
from kernel_lsp.findings import Finding, Range, Severity, uri_to_path
from kernel_lsp.jobs.scheduler import DocumentScheduler, Priority
from kernel_lsp.paths import read_regular_text
from kernel_lsp.server.convert import code_lens
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.settings import SettingsManager

if TYPE_CHECKING:
    from kernel_lsp.server.language_server import KernelLanguageServer

log = logging.getLogger(__name__)
PRODUCER = "compile"
INTERNAL_ERROR = "internal-error"  # a checker broke: no finding of the file's


class CompileFeature(Feature):
    def __init__(self, store: DiagnosticStore, settings: SettingsManager, service: CompileService,
                 tell_user: Callable[[str], None], refresh_lenses: Callable[[], None],
                 priority_of: Callable[[str], int] = lambda uri: Priority.OPEN,
                 documents: Callable[[], Mapping[str, Any]] = dict) -> None:
        self.store = store
        self.settings = settings
        self.service = service
        self.scheduler = DocumentScheduler(settings.settings.compile.max_parallel, priority_of)
        self._documents = documents
        self.closed_checks = 0  # closed files checked from disk (the workspace summary shows it)
        self._tell_user = tell_user
        self._refresh_lenses = refresh_lenses
        self._told: set[str] = set()

    def document_open(self, uri: str, version: int | None, text: str) -> None:
        self._schedule(uri, version, text, delay_s=0)

    def document_change(self, uri: str, version: int | None, text: str) -> None:
        s = self.settings.settings
        if s.compile.on_change:
            self._schedule(uri, version, text, delay_s=s.compile.debounce_ms / 1000)

    def document_save(self, uri: str, version: int | None, text: str) -> None:
        if self.scheduler.is_started(uri, version):
            return  # this exact version is being checked right now
        self._schedule(uri, version, text, delay_s=0)

    def recheck(self, uri: str, version: int | None, text: str) -> None:
        self._schedule(uri, version, text, delay_s=0)

    def document_close(self, uri: str) -> None:
        self.scheduler.cancel(uri)
        self.store.clear(uri)

    def _is_open(self, uri: str) -> bool:
        return uri in self._documents()

    def settings_changed(self) -> None:
        """Settings decide what a check finds, so every open document is checked again."""
        for document in list(self._documents().values()):
            self.recheck(document.uri, document.version, document.source)

    def check_closed(self, uri: str, path: Path) -> "asyncio.Task | None":
        """Checks a file that is not open, from disk, when the job's turn comes (so it reads the newest text)."""
        if self._is_open(uri):
            return None
        return self.scheduler.submit(uri, None, 0, lambda: self._check_closed(uri, path))

    def forget(self, uri: str) -> None:
        """A closed file that is gone: its job cancelled, its diagnostics cleared."""
        if not self._is_open(uri):
            self.scheduler.cancel(uri)
            self.store.clear(uri)

    async def _check_closed(self, uri: str, path: Path) -> None:
        if self._is_open(uri):
            return  # opened while it waited: didOpen checked the buffer
        text = await asyncio.to_thread(read_regular_text, path)  # off the loop; None for a pipe, a loop, a missing file
        if text is None:
            log.info("not checking %s: not a readable regular file", path)
            return
        doc = Document(uri, path, text, None)
        final = None
        async for report in self.service.run(doc, self.settings.settings):
            final = report
        if final is None or self._is_open(uri) or not self.scheduler.is_current(uri, None):
            return
        self.closed_checks += 1
        self.store.set(uri, PRODUCER, None, final.findings)  # one publish per closed file and check
        self._tell_tool_problems(final.findings)

    def failed(self, uri: str) -> bool:
        """Whether the document's last compile check found an error in it (a missing tool or a check that broke is
        no error of the file's)."""
        return any(f.severity == Severity.ERROR and not (f.data or {}).get("toolProblem") and f.code != INTERNAL_ERROR
                   for f in self.store.findings(uri, PRODUCER))

    def code_lenses(self, uri: str) -> list[types.CodeLens]:
        if self.settings.settings.compile.resource_usage not in ("codeLens", "both"):
            return []
        return [code_lens(f) for f in self.store.findings(uri, PRODUCER) if f.code == "ptxas-resources"]

    def _schedule(self, uri: str, version: int | None, text: str, delay_s: float) -> None:
        try:
            path = uri_to_path(uri)
        except ValueError:
            log.info("not checking %s: only file URIs are compiled", uri)
            return
        if not (is_cuda_document(path) or is_python_document(path)):
            return
        doc = Document(uri, path, text, version)
        self.scheduler.submit(uri, version, delay_s, lambda: self._check(doc))

    async def _check(self, doc: Document) -> None:
        try:
            await self._publish_reports(doc)
        except Exception as exc:  # a bug in a checker becomes a diagnostic, not a dead server
            log.exception("checking %s failed", doc.uri)
            if self.scheduler.is_current(doc.uri, doc.version):
                self.store.set(doc.uri, PRODUCER, doc.version, [Finding(
                    doc.uri, Range.line(0), Severity.ERROR, SOURCE, INTERNAL_ERROR,
                    f"kernel-lsp could not check this file ({type(exc).__name__}: {exc}); "
                    "details are in the server log")])

    async def _publish_reports(self, doc: Document) -> None:
        settings = self.settings.settings
        async for report in self.service.run(doc, settings):
            if not self.scheduler.is_current(doc.uri, doc.version):
                return  # a newer version is on its way; never publish over it
            self.store.set(doc.uri, PRODUCER, doc.version, report.findings)
            self._tell_tool_problems(report.findings)
            if report.final:
                log.info("%s v%s: %d findings (%s)", doc.path.name, doc.version, len(report.findings), report.stage)
            elif any((f.data or {}).get("composed") for f in report.findings):
                self._refresh_lenses()  # the split compile's ptxas figures, seconds before the exact ones
        self._refresh_lenses()

    async def shutdown(self) -> None:
        await self.service.close()  # its clangd child, if it started one

    def shows_finding(self, f: Finding) -> bool:
        """Whether a finding shows as a diagnostic (resources may be meant for code lenses only)."""
        return f.code != "ptxas-resources" or self.settings.settings.compile.resource_usage in ("diagnostic", "both")

    def _tell_tool_problems(self, findings: list[Finding]) -> None:
        for f in findings:
            if f.data and f.data.get("toolProblem") and f.message not in self._told:
                self._told.add(f.message)  # once per session; the diagnostic on the file stays
                self._tell_user(f.message)


def setup(server: KernelLanguageServer) -> CompileFeature:
    def priority_of(uri: str) -> int:  # the workspace feature's (set up later), asked through the server
        said = server.priority_of(uri)
        return Priority.OPEN if said is None else said

    return CompileFeature(server.diagnostics, server.settings, CompileService(server.results, first_pass=True),
                          tell_user=lambda m: server.show(m, types.MessageType.Error),
                          refresh_lenses=server.refresh_code_lenses, priority_of=priority_of,
                          documents=server.open_documents)
