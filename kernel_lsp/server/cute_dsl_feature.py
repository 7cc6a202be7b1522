"""The CuTe DSL compile check in the editor: saving a `.py` that defines @cute.kernel/@cute.jit functions (the check
runs the file's code, so only on the user's save, as verification does) runs a "cute-dsl-check" job on the worker (kernel_lsp/kinds/cute_dsl.py: compiled, never launched, so a machine
without a GPU checks it too); its findings (the compile error on its line, each kernel's figures on its name) are
published under their own producer. A newer check of a document cancels the older one; closing it clears them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lsprotocol import types

from kernel_lsp.findings import SOURCE, Finding, Range, Severity, uri_to_path
from kernel_lsp.kinds.cute_dsl import CuteDslOutcome, cute_dsl_job, dsl_arch
from kernel_lsp.server.convert import OpenDocument, code_lens, open_texts
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.settings import SettingsManager
from kernel_lsp.server.worker_feature import WorkerFeature
from kernel_lsp.sources import parse_python
from kernel_lsp.verify.pairing import Pairing
from kernel_lsp.worker.client import WorkerUnavailable

if TYPE_CHECKING:
    from kernel_lsp.server.language_server import KernelLanguageServer

log = logging.getLogger(__name__)
PRODUCER = "cute-dsl"


class CuteDslFeature(Feature):
    def __init__(self, store: DiagnosticStore, settings: SettingsManager, worker: WorkerFeature,
                 documents: Callable[[], Mapping[str, OpenDocument]],
                 refresh_lenses: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self._refresh_lenses = refresh_lenses
        self.settings = settings
        self.worker = worker
        self._documents = documents
        self._tasks: dict[str, asyncio.Task] = {}
        self._published: dict[str, set[str]] = {}  # checked URI -> URIs holding its findings

    def document_save(self, uri: str, version: int | None, text: str) -> None:
        self._check(uri, text)

    def document_close(self, uri: str) -> None:
        task = self._tasks.pop(uri, None)
        if task is not None:
            task.cancel()
        self._publish(uri, [])
        self._published.pop(uri, None)

    def code_lenses(self, uri: str) -> list[types.CodeLens]:
        """Each compiled kernel's figures as a lens on its name, as the compile check's (the resourceUsage setting)."""
        if self.settings.settings.compile.resource_usage not in ("codeLens", "both"):
            return []
        return [code_lens(f) for f in self.store.findings(uri, PRODUCER) if f.code == "ptxas-resources"]

    def _check(self, uri: str, text: str) -> None:
        try:
            path = uri_to_path(uri)
        except ValueError:
            return
        if path.suffix != ".py" or not parse_python(text).cute_kernels:
            if uri in self._published:  # it no longer uses the DSL
                self._publish(uri, [])
            return
        old = self._tasks.pop(uri, None)
        if old is not None:
            old.cancel()
        self._tasks[uri] = asyncio.ensure_future(self._run(uri, path, text))

    async def _run(self, uri: str, path: Path, text: str) -> None:
        settings = self.settings.settings
        found = self.settings.find_reference(path, text)
        reference = found.reference if isinstance(found, Pairing) and found.reference != path else None
        texts = open_texts(self._documents().values())
        try:
            job = cute_dsl_job(path, reference, dsl_arch(settings), texts)
            outcome = CuteDslOutcome.of(await self.worker.client(settings).run(job))
            findings = outcome.findings
            if outcome.status == "failed":
                findings = [self._note(uri, outcome.summary)]
        except asyncio.CancelledError:
            raise
        except WorkerUnavailable as exc:
            findings = [self._note(uri, f"the CuTe DSL check needs the worker: {exc}")]
        except OSError as exc:
            findings = [self._note(uri, f"cannot read the files to check: {exc}")]
        except Exception as exc:  # a bug here is a diagnostic, never a dead server
            log.exception("the CuTe DSL check of %s failed", uri)
            findings = [self._note(uri, f"kernel-lsp could not check the CuTe DSL code ({type(exc).__name__}: "
                                        f"{exc})")]
        if self._tasks.get(uri) is asyncio.current_task():
            self._tasks.pop(uri)
            self._publish(uri, findings)
            self._refresh_lenses()

    def _note(self, uri: str, message: str) -> Finding:
        return Finding(uri, Range.line(0), Severity.INFORMATION, SOURCE, "cute-dsl-unavailable", message)

    def _publish(self, checked_uri: str, findings: list[Finding]) -> None:
        settings = self.settings.settings
        self._published[checked_uri] = self.store.set_per_file(
            PRODUCER, checked_uri, [f for f in findings if not settings.is_ignored(f.code)],
            self._published.get(checked_uri, set()), self._documents())


def setup(server: KernelLanguageServer) -> CuteDslFeature:
    return CuteDslFeature(server.diagnostics, server.settings, server.get_feature(WorkerFeature),
                          documents=server.open_documents, refresh_lenses=server.refresh_code_lenses)
