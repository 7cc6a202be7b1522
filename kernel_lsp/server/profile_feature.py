"""Profiles in the editor: hover cards on kernel names, hint diagnostics, and the "Profile this kernel" action.

Profiles (KernelProfiles of contracts.profile_report) are kept in memory per kernel base name for this server's
workspace. They come from `kernel-lsp.importProfile` [details CSV, raw CSV?] (an `ncu --csv` export read here: no
worker, no GPU) or from `kernel-lsp.profile` [uri, kernel] (the code action), which runs the worker's "profile" job;
the static profile of a `.cu` file (ptxas and SASS, all a `.cu` gets) runs in the server itself, in one of the
compile slots, with no worker to start.
Hints are placed on every open document that defines the kernel, again on each open and edit (names move), so a
profile made from one file also marks the kernel where another file defines it. A hover is answered from memory:
the chart is drawn when a profile arrives, never on hover.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncContextManager, Callable

from lsprotocol import types

from kernel_lsp.compile.units import CUDA_SUFFIXES
from kernel_lsp.config import cache_dir
from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.profile_report import NOTE_CODES, KernelProfile, ProfileProblem, ProfileReport
from kernel_lsp.findings import Finding, Position, uri_to_path
from kernel_lsp.jobs.cache import ResultCache
from kernel_lsp.kinds.profile import ProfileOutcome, profile_job, profile_options
from kernel_lsp.profile.locations import Location, kernel_locations
from kernel_lsp.profile.report import (
    imported_report,
    problem_messages,
    profile_findings,
    received_report,
    summary_line,
)
from kernel_lsp.profile.static import CHECK_POINTER
from kernel_lsp.profile.program import has_main
from kernel_lsp.profile.worker_job import CUDA_FILE, static_result
from kernel_lsp.server import compile_feature
from kernel_lsp.server.convert import (
    STALE,
    CannotRun,
    OpenDocument,
    ago,
    command_action,
    kind_requested,
    lsp_range,
)
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.hover_card import NO_PROFILE, CardFacts, hover_card
from kernel_lsp.server.profile_report import ceilings_from, point_from
from kernel_lsp.server.settings import SettingsManager, diagnostics_place
from kernel_lsp.server.work_progress import WorkProgress
from kernel_lsp.server.worker_feature import WorkerFeature
from kernel_lsp.sources import parse_python
from kernel_lsp.verify.pairing import Pairing, ReferenceProblem
from kernel_lsp.worker.client import WorkerUnavailable
from kernel_lsp.worker.protocol import Job, Result
from profilers.roofline import Ceilings, KernelPoint, roofline_svg

if TYPE_CHECKING:
    from kernel_lsp.server.language_server import KernelLanguageServer

log = logging.getLogger(__name__)

PRODUCER = "profile"
PROFILE_COMMAND = "kernel-lsp.profile"
IMPORT_COMMAND = "kernel-lsp.importProfile"
PROFILE_ACTION_KIND = "refactor.inspect.profileKernel"  # in the lightbulb and Ctrl+. beside Optimize (not Source)
PROFILE_ACTION_TITLE = "Profile this kernel"
REMEMBERED = "profile-report"  # the kind of a profile's entry in the on-disk cache
STATIC_SOURCE = "static: ptxas and SASS, no GPU run"


@dataclass(frozen=True)
class ProfiledKernel:
    profile: KernelProfile
    ceilings: Ceilings | None
    point: KernelPoint | None
    chart: Path | None
    source: str  # for the card: "ncu on NVIDIA H200", "import-csv ncu_details.csv"
    uri: str | None = None  # the document profiled (None: an import), and its text then: an edit since is said
    text: str | None = None


class ProfileFeature(Feature):
    code_action_kinds = (PROFILE_ACTION_KIND,)

    def __init__(self, store: DiagnosticStore, settings: SettingsManager, worker: WorkerFeature,
                 documents: Callable[[], Mapping[str, OpenDocument]], progress: WorkProgress,
                 tell_user: Callable[..., None], verify_summary: Callable[[str], str | None],
                 chart_dir: Path, refresh_lenses: Callable[[], None] = lambda: None,
                 compile_slot: Callable[[str], AsyncContextManager[None]] | None = None,
                 compile_failed: Callable[[str], bool] = lambda _uri: False,
                 results: ResultCache | None = None) -> None:
        self.store = store
        self._results = results  # its `disk` (the workspace's on-disk cache) keeps profiles across restarts
        self.settings = settings
        self.worker = worker
        self._documents = documents
        self._progress = progress
        self._tell_user = tell_user
        self._verify_summary = verify_summary  # VerifyFeature.result_summary: correctness, speedups, time
        self._chart_dir = chart_dir
        self._kernels: dict[str, ProfiledKernel] = {}
        self._locations: dict[str, tuple[str, dict[str, Location]]] = {}  # uri -> (text, kernel -> name range)
        self._energy: dict[str, tuple[str | None, float, float | None]] = {}  # uri -> (text, mJ/call, reference's)
        self._refresh_lenses = refresh_lenses
        # CompileFeature's scheduler.slot: the static profile runs nvcc here (none given: no limit of its own)
        self._compile_slot = compile_slot or (lambda _uri: contextlib.nullcontext())
        self._compile_failed = compile_failed  # CompileFeature.failed: a file that does not compile is not profiled
        self._restoring: set[asyncio.Task] = set()

    # --- document hooks -------------------------------------------------------------------------------------

    def document_open(self, uri: str, version: int | None, text: str) -> None:
        self._publish(uri, version, text)
        if self._results is not None and self._results.disk is not None:
            task = asyncio.ensure_future(self._restore(uri, text))
            self._restoring.add(task)
            task.add_done_callback(self._restoring.discard)

    def document_change(self, uri: str, version: int | None, text: str) -> None:
        if self._kernels:  # the hints follow the kernel names as they move
            self._publish(uri, version, text)

    def document_close(self, uri: str) -> None:
        self._locations.pop(uri, None)

    def settings_changed(self) -> None:
        self.republish()  # the ignore list may have changed

    def commands(self) -> dict[str, Callable[[tuple[Any, ...]], Any]]:
        return {IMPORT_COMMAND: self.import_command, PROFILE_COMMAND: self.profile_command}

    def republish(self) -> None:
        """Settings (the ignore list) or the profiles changed: every open document's hints again."""
        for document in list(self._documents().values()):
            self._publish(document.uri, document.version, document.source)

    # --- hover and code action ------------------------------------------------------------------------------

    def hover(self, uri: str, position: types.Position) -> types.Hover | None:
        document = self._documents().get(uri)
        if document is None:
            return None
        found = self._kernel_at(uri, document.source, Position(position.line, position.character))
        if found is None:
            return None
        name, location = found
        markdown = hover_card(self._card_facts(uri, name))
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=markdown),
                           range=lsp_range(location.range))

    def code_actions(self, uri: str, span: types.Range, only: Sequence[str] | None,
                     disabled_shown: bool) -> list[types.CodeAction]:
        if not kind_requested(PROFILE_ACTION_KIND, only):
            return []
        document = self._documents().get(uri)
        if document is None:
            return []
        return [command_action(f"{PROFILE_ACTION_TITLE} ({name})", PROFILE_ACTION_KIND, PROFILE_COMMAND, [uri, name],
                               self._cannot_profile(uri, document.source, name), disabled_shown)
                for name, location in self._locations_of(uri, document.source).items()
                if span.start.line <= location.range.start.line <= span.end.line]

    def _cannot_profile(self, uri: str, text: str, kernel: str | None) -> CannotRun | None:
        """Why a kernel (None: every kernel of the file) cannot be profiled, known before any job: the file's last
        compile failed (the static profile and ncu both build it); or it is a Python kernel (Triton, CuTe DSL),
        which ncu profiles on a GPU, and the worker has none (the static profile reads CUDA C++ only)."""
        if self._compile_failed(uri):
            return CannotRun("does not compile", "the file's last compile failed, and a profile builds and runs it: "
                                                 "fix its errors first")
        if not uri.endswith(".py"):
            return None
        model = parse_python(text)
        python_kernels = {k.name for k in model.triton_kernels} | {k.name for k in model.cute_kernels}
        asked = {kernel} if kernel else set(self._locations_of(uri, text))
        if not asked or not asked <= python_kernels:
            return None
        settings = self.settings.settings
        if settings.verify.device == "cpu" or self.worker.gpu_missing(settings):
            return CannotRun("needs a GPU", "needs a GPU: Python kernels (Triton, CuTe DSL) are profiled by ncu, and "
                                            "this worker has none; a CPU machine profiles CUDA C++ statically")
        return None

    # --- commands -------------------------------------------------------------------------------------------

    async def import_command(self, args: tuple[Any, ...]) -> dict[str, Any]:
        """kernel-lsp.importProfile [details CSV, raw CSV?] or [{"details", "raw"}]: paths relative to the
        workspace folder; the raw page adds the DRAM bytes and the ceilings the roofline needs."""
        details, raw = self._import_paths(args)
        if details is None:
            return {"status": "error", "message": f"{IMPORT_COMMAND} needs the path of an 'ncu --csv --page "
                                                  "details' export (and, for the roofline, its raw page)"}
        try:
            report = await asyncio.to_thread(_read_import, details, raw)
        except OSError as exc:
            return {"status": "error", "message": f"cannot read {exc.filename}: {exc.strerror}"}
        except (KeyError, ValueError, IndexError) as exc:
            return {"status": "error", "message": f"{details.name} is not an 'ncu --csv --page details' export "
                                                  f"({type(exc).__name__}: {exc})"}
        kept = await self._keep(report, f"import-csv {details.name}")
        return {"status": "ok" if kept else "empty", "kernels": kept, "problems": problem_messages(report),
                "summary": summary_line(report)}

    async def profile_command(self, args: tuple[Any, ...]) -> dict[str, Any]:
        """kernel-lsp.profile [uri, kernel?]: the worker's "profile" job on the file as the editor shows it (an
        unsaved buffer's text, not the file on disk), with $/progress."""
        uri, kernel = _profile_args(args)
        if uri is None:
            return {"status": "error", "message": f"{PROFILE_COMMAND} needs the document URI (and a kernel name)"}
        document = self._documents().get(uri)
        try:
            path = uri_to_path(uri)
            text = document.source if document else path.read_text(encoding="utf-8", errors="replace")
            cannot = self._cannot_profile(uri, text, kernel)  # asked before any job, as the menu asked it
            if cannot is None:
                reference = self._reference(uri, path)
                options = profile_options(self.settings.settings, **({"kernels": (kernel,)} if kernel else {}))
                job = profile_job(path, reference, options, texts={path: text} if document else None)
        except (ValueError, OSError) as exc:
            return {"uri": uri, "status": "error", "message": f"cannot profile {uri}: {exc}"}
        if cannot is not None:
            return self._unavailable(uri, f"cannot profile {kernel or path.name}: {cannot.reason}")
        token = await self._progress.begin("profile", f"Profiling {kernel or path.name}", path.name)
        try:
            if path.suffix in CUDA_SUFFIXES and not self._live_program(job.source_files[job.config["candidate"]]):
                result = await self._static_here(uri, job, kernel, token)
            else:
                result = await self.worker.client(self.settings.settings).run(
                    job, progress=lambda message, fraction: self._progress.report(token, message, fraction))
        except WorkerUnavailable as exc:
            self._progress.end(token, "worker unavailable")
            return self._unavailable(uri, str(exc))
        except asyncio.CancelledError:
            self._progress.end(token, "cancelled")
            raise
        text = document.source if document else None
        report = ProfileOutcome.of(result).report  # read once; None: the job did not finish
        outcome = await self._outcome(uri, result, report, text)
        if report is not None and outcome.get("kernels"):
            await self._remember(path, reference, text, report)
        self._keep_energy(uri, report, text)
        self._progress.end(token, outcome["message"])
        return outcome

    async def _static_here(self, uri: str, job: Job, kernel: str | None, token: str | None) -> Result:
        """A `.cu` file's static profile, run by the server (nvcc, nvdisasm) in a compile slot: the worker would
        do the same with no GPU, after seconds of starting; with one, ncu has no ModelNew of a `.cu` to run. A
        `.cu` with its own main() goes to the worker, which builds and profiles it live on a GPU."""
        self._progress.report(token, "static profile: nvcc and nvdisasm", None)
        note = PROGRAM_STATIC if has_main(job.source_files[job.config["candidate"]]) else CUDA_FILE
        async with self._compile_slot(uri):
            return await static_result(job, (kernel,) if kernel else (), note, self.settings.settings)

    def _live_program(self, text: str) -> bool:
        """A program (its own main()) goes to the worker when it is known to be connected to a GPU; otherwise the
        server profiles it statically (starting a local worker only to learn it has no GPU took 8-11 s)."""
        status = self.worker.known_status
        return has_main(text) and status is not None and status.state == "connected" and bool(status.gpu)

    def lens_note(self, uri: str, text: str | None) -> str | None:
        """'41.2 mJ/call (0.81× the reference's)' when the last profile of `uri` read its energy (NVML, a GPU) and
        profiled this same text (None: not open, shown as it was); None otherwise."""
        kept = self._energy.get(uri)
        if kept is None or (text is not None and kept[0] is not None and kept[0] != text):
            return None
        _, candidate, reference = kept
        ratio = f" ({candidate / reference:.2g}× the reference's)" if reference else ""
        return f"{candidate:.3g} mJ/call{ratio}"

    def _keep_energy(self, uri: str, report: ProfileReport | None, text: str | None) -> None:
        candidate = report.energy if report is not None else None
        if candidate is not None and candidate.mj_per_call > 0:
            reference = report.reference_energy
            self._energy[uri] = (text, candidate.mj_per_call, reference.mj_per_call if reference is not None
                                 and reference.mj_per_call > 0 else None)
            self._refresh_lenses()

    # --- profiles -------------------------------------------------------------------------------------------

    async def _outcome(self, uri: str, result: Result, report: ProfileReport | None,
                       text: str | None) -> dict[str, Any]:
        if report is None:
            return self._unavailable(uri, f"profiling did not finish ({result.status}): "
                                          f"{result.error or 'no reason given'}")
        kept = await self._keep(report, _source_label(report), uri, text) if report.kernels else []
        problems = [_in_the_editor(p.message, self.settings.client) for p in report.problems]
        status = "ok" if report.source == "ncu" and kept else "not-profiled"
        message = said_once(report, problems)
        if problems:  # one message for the profile: a note (why it is static) alone is no warning
            warned = any(p.code not in NOTE_CODES for p in report.problems)
            self._tell_user(f"kernel-lsp: profile: {message}",
                            types.MessageType.Warning if warned else types.MessageType.Info)
        return {"uri": uri, "status": status, "source": report.source, "kernels": kept,
                "problems": problems, "message": message}

    def _unavailable(self, uri: str, message: str) -> dict[str, Any]:
        self._tell_user(f"kernel-lsp: {message}")
        return {"uri": uri, "status": "unavailable", "message": message}

    async def _keep(self, report: ProfileReport, source: str, uri: str | None = None,
                    text: str | None = None) -> list[str]:
        """Each kernel's profile replaces the one before it; charts are drawn now so hovers only read."""
        ceilings = ceilings_from(report)
        arrived = {}
        for profile in report.kernels:
            point = point_from(profile)
            chart = await asyncio.to_thread(self._draw_chart, ceilings, point)
            arrived[profile.kernel] = ProfiledKernel(profile, ceilings, point, chart, source, uri, text)
        self._kernels.update(arrived)  # all at once: a publish meanwhile never shows half a report
        self.republish()
        return list(arrived)

    def _draw_chart(self, ceilings: Ceilings | None, point: KernelPoint | None) -> Path | None:
        """The kernel's roofline as an SVG file in the cache folder, named by its content."""
        if ceilings is None or point is None:
            return None
        svg = roofline_svg(ceilings, [point])
        path = self._chart_dir / f"{point.kernel}-{hashlib.sha256(svg.encode()).hexdigest()[:16]}.svg"
        try:
            self._chart_dir.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_text(svg, encoding="utf-8")
        except OSError as exc:  # an unwritable cache costs the chart, not the card
            log.warning("cannot write the roofline chart %s: %s", path, exc)
            return None
        return path

    def _card_facts(self, uri: str, name: str) -> CardFacts:
        kept = self._kernels.get(name)
        resources = tuple(entry for f in self.store.findings(uri, compile_feature.PRODUCER)
                          if f.code == "ptxas-resources" and f.data and f.data.get("kernel") == name
                          for entry in f.data.get("resources", []))
        document = self._documents().get(uri)
        cannot = self._cannot_profile(uri, document.source, name) if document is not None else None
        common = dict(kernel=name, resources=resources, verify_summary=self._verify_summary(uri),
                      no_profile=f"no profile: {cannot.reason}" if cannot else NO_PROFILE)
        if kept is None:
            return CardFacts(**common)
        # a file:// link, not a data: URI: the hover stays a few hundred bytes, clients that show markdown as
        # text (Neovim) print a short path instead of kilobytes of base64, and VS Code renders local SVGs
        chart = kept.chart.as_uri() if kept.chart is not None else None
        edited = (kept.uri == uri and kept.text is not None and document is not None
                  and document.source != kept.text)
        return CardFacts(**common, profile=kept.profile, ceilings=kept.ceilings, point=kept.point, chart_uri=chart,
                         source=kept.source + (STALE if edited else ""))

    # --- profiles across restarts ---------------------------------------------------------------------------

    def _memory_key(self, path: Path, reference: Path | None, text: str | None) -> str | None:
        """The profiles of these files, as the editor shows them, under these settings: the "profile" job's
        content-addressed key for the whole file (whichever kernel was asked for), in its own namespace."""
        try:
            job = profile_job(path, reference, profile_options(self.settings.settings),
                              texts={path: text} if text is not None else None)
        except (ValueError, OSError):
            return None
        return hashlib.sha256(f"{REMEMBERED}\0{job.content_hash}".encode()).hexdigest()

    async def _remember(self, path: Path, reference: Path | None, text: str | None, report: ProfileReport) -> None:
        """The kernels just profiled, added to those kept for the same text (profiling one kernel, then another,
        keeps both). On disk the report is its wire form; an entry of another version keeps the kernels it can."""
        disk = self._results.disk if self._results is not None else None
        if disk is None or not report.kernels:
            return
        key = await asyncio.to_thread(self._memory_key, path, reference, text)  # reads the files: off the loop
        if key is None:
            return
        earlier = disk.get(key) or {}
        before = received_report(earlier.get("report")).kernels if earlier.get("kind") == REMEMBERED else []
        kept = {k.kernel: k for k in before}
        kept.update({k.kernel: k for k in report.kernels})
        disk.put(key, {"kind": REMEMBERED, "at": time.time(), "source": _source_label(report),
                       "report": encode(dataclasses.replace(report, kernels=list(kept.values())))})

    async def _restore(self, uri: str, text: str) -> None:
        """On open: the profiles kept on disk for exactly this text (after a restart) are shown again, with their
        age, unless this server holds a newer profile of the same kernels."""
        disk = self._results.disk if self._results is not None else None
        try:
            path = uri_to_path(uri)
            if disk is None or path.suffix not in (".py", *CUDA_SUFFIXES):
                return
            key = await asyncio.to_thread(self._memory_key, path, self._reference(uri, path), text)
            value = disk.get(key) if key else None
            if not value or value.get("kind") != REMEMBERED:
                return
            report = received_report(value["report"])
            fresh = {k.kernel: k for k in report.kernels if k.kernel not in self._kernels}
            if fresh:
                source = f"{value['source']} · profiled {ago(time.time() - float(value['at']))}"
                await self._keep(dataclasses.replace(report, kernels=list(fresh.values())), source, uri, text)
        except (KeyError, TypeError, ValueError, OSError) as exc:  # an entry of another layout: profiled again
            log.info("no remembered profile for %s: %s", uri, exc)

    # --- hint diagnostics -----------------------------------------------------------------------------------

    def _publish(self, uri: str, version: int | None, text: str) -> None:
        findings = self._hint_findings(uri, text)
        if findings != self.store.findings(uri, PRODUCER):  # unchanged: no publish on every keystroke
            self.store.set(uri, PRODUCER, version, findings)

    def _hint_findings(self, uri: str, text: str) -> list[Finding]:
        """The profiled kernels this document defines: each hint on its source line when the profile gives one
        in this file, else on the kernel's name."""
        try:
            path = uri_to_path(uri)
        except ValueError:
            return []
        locations = {name: location for name, location in self._locations_of(uri, text).items()
                     if name in self._kernels}
        if not locations:
            return []
        kernels = [self._kernels[name].profile for name in locations]
        settings, here = self.settings.settings, path.resolve()
        return [dataclasses.replace(f, uri=uri) for f in profile_findings(kernels, locations, str(path), {str(path): text})
                if _path_of(f.uri) == here and not settings.is_ignored(f.code)]

    # --- kernels in documents -------------------------------------------------------------------------------

    def _locations_of(self, uri: str, text: str) -> dict[str, Location]:
        """Kernel name -> where the document defines it, parsed once per text."""
        cached = self._locations.get(uri)
        if cached is not None and cached[0] == text:
            return cached[1]
        try:
            path = uri_to_path(uri)
        except ValueError:
            return {}
        found = kernel_locations({path.name: text}, {path.name: str(path)})
        self._locations[uri] = (text, found)
        return found

    def _kernel_at(self, uri: str, text: str, position: Position) -> tuple[str, Location] | None:
        for name, location in self._locations_of(uri, text).items():
            if location.range.start <= position <= location.range.end:
                return name, location
        return None

    def _reference(self, uri: str, path: Path) -> Path | None:
        """A .py candidate's reference (as verification pairs it); a .cu is profiled on its own."""
        if path.suffix != ".py":
            return None
        document = self._documents().get(uri)
        text = document.source if document is not None else path.read_text(encoding="utf-8", errors="replace")
        found = self.settings.find_reference(path, text)
        if isinstance(found, ReferenceProblem):
            raise ValueError(found.message)
        return found.reference if isinstance(found, Pairing) and found.reference != path else None

    def _import_paths(self, args: tuple[Any, ...]) -> tuple[Path | None, Path | None]:
        first = args[0] if args else None
        if isinstance(first, dict):
            details, raw = first.get("details"), first.get("raw")
        else:
            details, raw = first, args[1] if len(args) > 1 else None
        return self._workspace_path(details), self._workspace_path(raw)

    def _workspace_path(self, value: Any) -> Path | None:
        if not isinstance(value, str) or not value:
            return None
        path = uri_to_path(value) if value.startswith("file:") else Path(value).expanduser()
        workspace = self.settings.folders[0] if self.settings.folders else None
        return path if path.is_absolute() or workspace is None else workspace / path


def _read_import(details: Path, raw: Path | None) -> ProfileReport:
    raw_text = raw.read_text(encoding="utf-8", errors="replace") if raw is not None else None
    return imported_report(details.read_text(encoding="utf-8", errors="replace"), raw_text)


def _source_label(report: ProfileReport) -> str:
    """Where a job's profile came from, for the card: "ncu on NVIDIA H200", or a static profile said plainly."""
    if report.source == "static":
        return STATIC_SOURCE
    return f"{report.source} on {report.gpu}" if report.gpu else report.source


def _profile_args(args: tuple[Any, ...]) -> tuple[str | None, str | None]:
    first = args[0] if args else None
    if isinstance(first, dict):
        uri, kernel = first.get("uri"), first.get("kernel")
    else:
        uri, kernel = first, args[1] if len(args) > 1 else None
    return (uri if isinstance(uri, str) else None), (kernel if isinstance(kernel, str) and kernel else None)


def _path_of(uri: str) -> Path | None:
    try:
        return uri_to_path(uri).resolve()
    except ValueError:
        return None


PROGRAM_STATIC = ProfileProblem("profile-program-static",
                                f"{CUDA_FILE.message}; this one is a program (its own main()): a worker connected to "
                                "a GPU builds, runs and profiles it live under ncu, and none is connected yet")
_CHECK_POINTER = re.compile(re.escape(CHECK_POINTER).replace(re.escape("{path}"), ".+?") + "$")


def _in_the_editor(problem: str, client: str) -> str:
    """A profile problem as the editor says it: compile errors are among the client's diagnostics, not behind a
    command."""
    return _CHECK_POINTER.sub(f"its errors are on their lines in {diagnostics_place(client)}", problem)


def said_once(report: ProfileReport, problems: list[str]) -> str:
    """The profile in one line, its problems (as the editor words them) in it: what was profiled, then why it is
    not more; or that nothing was, and why."""
    if not report.kernels:
        return f"no kernel profiled: {'; '.join(problems) or 'none found'}"
    line = summary_line(report)
    return f"{line} ({'; '.join(problems)})" if problems else line


def setup(server: KernelLanguageServer) -> ProfileFeature:
    from kernel_lsp.server.verify_feature import VerifyFeature

    verify = server.get_feature(VerifyFeature)
    compiles = server.get_feature(compile_feature.CompileFeature)
    profile = ProfileFeature(server.diagnostics, server.settings, server.get_feature(WorkerFeature),
                             documents=server.open_documents,
                             progress=WorkProgress(server.work_done_progress, server.supports_work_done_progress),
                             tell_user=lambda m, kind=types.MessageType.Warning: server.show(m, kind),
                             verify_summary=verify.result_summary, chart_dir=cache_dir() / "charts",
                             refresh_lenses=server.refresh_code_lenses,
                             compile_slot=compiles.scheduler.slot, compile_failed=compiles.failed,
                             results=server.results)
    return profile  # its lens_note: the verify lens shows the energy a profile of the same text read
