"""Compile checks of one document: Python syntax, nvcc device side, host side; findings stage by stage.

`check_document` is an async generator: it yields the findings known so far after each stage, so the
editor shows device-side errors and ptxas results while the (slower) host side is still compiling.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import re
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

from kernel_lsp.compile.clangd import ClangdPass
from kernel_lsp.compile.commands import device_command, host_command
from kernel_lsp.compile.diagnostics import CompilerMessage, parse_compiler_output, source_column
from kernel_lsp.compile.process import ProcessResult, run_blocking, run_process
from kernel_lsp.compile.reuse import PRELIMINARY, Reuse, header_stamps
from kernel_lsp.compile.split import output_of, quoted_names, split_text, tokens_of, torch_prologue
from kernel_lsp.compile.toolchain import Tool, ToolProblem, TorchHeaders, cutlass_headers, cutlass_problem, \
    find_host_compiler, find_nvcc, find_torch_headers
from kernel_lsp.compile.units import CompileUnit, cuda_unit, is_cuda_document, is_python_document, \
    load_inline_units
from kernel_lsp.config import Settings
from kernel_lsp.findings import SOURCE, Finding, Range, Related, Severity, path_to_uri
from kernel_lsp.jobs.cache import cache_key
from kernel_lsp.sources import parse_python
from profilers.ptxas import KernelResources, base_name_of, demangle, parse_ptxas_verbose

log = logging.getLogger(__name__)

_SEVERITY = {"error": Severity.ERROR, "fatal": Severity.ERROR, "warning": Severity.WARNING,
             "remark": Severity.INFORMATION, "note": Severity.INFORMATION}
_CODE_PREFIX = {"nvcc-frontend": "nvcc", "nvcc": "nvcc", "host-compiler": "host", "ptxas": "ptxas"}
# the token at a compiler's column: a number (2.0f, 0x1p-3), an identifier or directive (#error), a
# multi-character operator, else one character
_WORD = re.compile(r"(?:\d|\.\d)(?:[\w.]|[eEpP][+-])*|#?[A-Za-z_]\w*|->\*?|::|<<=?|>>=?|&&|\|\||\+\+|--"
                   r"|[-+*/%&|^!=<>]=|\S")
_CLOSING = {")": "(", "]": "["}


@dataclass(frozen=True)
class Document:
    uri: str
    path: Path
    text: str
    version: int | None = None


@dataclass
class StageReport:
    stage: str  # "python", "device", "host", "done"
    findings: list[Finding]  # everything known so far, not only this stage's
    final: bool


class Scratch:
    """Per-document scratch directories where buffers are written for the compilers to read."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="kernel-lsp-"))
        weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)  # also at interpreter exit

    def directory(self, uri: str) -> Path:
        d = self.root / hashlib.sha1(uri.encode()).hexdigest()[:16]
        d.mkdir(parents=True, exist_ok=True)
        return d


async def check_document(doc: Document, settings: Settings, scratch: Scratch,
                         reuse: Reuse | None = None, first_pass: ClangdPass | None = None
                         ) -> AsyncIterator[StageReport]:
    """With `reuse` (compile/reuse.py): unit results from earlier checks, and the split compile's result while a
    load_inline unit's exact compile runs. With `first_pass` (compile/clangd.py): clangd's errors on a plain `.cu`
    while nvcc runs."""
    findings: list[Finding] = []
    units: list[CompileUnit] = []
    clang: asyncio.Future | None = None
    # parsing a large file takes a while: in a thread, so the server keeps answering meanwhile
    if is_python_document(doc.path):
        findings, units = await asyncio.to_thread(_python_findings_and_units, doc, settings)
        yield StageReport("python", _kept(findings, settings), final=False)
    elif is_cuda_document(doc.path):
        # clangd first: its answer is the one racing the clock (compile/clangd.py)
        clang = asyncio.ensure_future(first_pass.errors(doc.path, doc.text)) if first_pass is not None else None
        units = [await asyncio.to_thread(cuda_unit, doc.path, doc.text, settings.compile.include_dirs,
                                         settings.compile.extra_flags, _cutlass_dirs(settings))]
    units = [u for u in units if settings.check_enabled("hostCompile" if u.stage == "host" else "compile")]
    if not units:
        if clang is not None:
            clang.cancel()
        yield StageReport("done", _kept(findings, settings), final=True)
        return

    toolchain_findings, tools = await _toolchain(doc, units, settings)
    findings += toolchain_findings
    runnable = [u for u in units if u.stage in tools]
    directory = scratch.directory(doc.uri)
    runs = [_UnitRun(doc, u, settings, tools, directory, reuse) for u in runnable]
    for run in runs:
        await run.plan()
    pending: dict[asyncio.Future, tuple[str, _UnitRun]] = {}
    for run in runs:
        pending[asyncio.ensure_future(run.exact())] = ("exact", run)
        if run.fast_text is not None and run.cached is None:
            pending[asyncio.ensure_future(run.fast())] = ("fast", run)
    if clang is not None and len(runs) == 1:
        pending[clang] = ("clang", runs[0])
    elif clang is not None:  # no nvcc to compare it with
        clang.cancel()
        clang = None
    completed = False
    try:
        while any(kind != "clang" for kind, _ in pending.values()):
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                kind, run = pending.pop(future)
                if kind == "clang":
                    early = first_pass.findings(doc.uri, (None if future.exception() else future.result()) or [])
                    if early:
                        yield StageReport("fast", _kept(findings + early, settings), final=False)
                    continue
                if kind == "exact":
                    findings += [_with_header_advice(f, settings, tools.get("torch")) for f in future.result()]
                interim = {r: r.interim() for r in runs}
                shown = [f for found in interim.values() if found is not None for f in found]
                if interim[run] is not None if kind == "fast" else len(runs) > 1:  # the old result stays until news
                    yield StageReport("fast" if kind == "fast" else run.unit.stage,
                                      _kept(findings + shown, settings), final=False)
        completed = True
    finally:
        for future in pending:
            if future is not clang or not completed:
                future.cancel()
    if clang is not None:  # whether clang agreed with nvcc on this version, once clangd has answered
        nvcc_errors = sum(f.severity == Severity.ERROR for f in findings)
        clang.add_done_callback(lambda answered: first_pass.judge(
            doc.uri, None if answered.cancelled() or answered.exception() else answered.result(), nvcc_errors))
    yield StageReport("done", _kept(findings, settings), final=True)


class _UnitRun:
    """One unit's compile: its exact run (or the reused result of an identical one) and, for a load_inline CUDA
    unit that includes torch, the split run without torch (compile/split.py) whose result shows meanwhile: as the
    unit's full result when a certificate says it stands for the exact one, else its kernel errors, preliminary."""

    def __init__(self, doc: Document, unit: CompileUnit, settings: Settings, tools: dict, directory: Path,
                 reuse: Reuse | None) -> None:
        self.doc, self.unit, self.settings, self.directory, self.reuse = doc, unit, settings, directory, reuse
        self.tool: Tool = tools[unit.stage]
        self.torch: TorchHeaders | None = tools.get("torch")
        self.argv = (device_command(self.tool.path, unit, settings, self.torch, os.devnull) if unit.stage == "device"
                     else host_command(self.tool.path, unit, settings, self.torch))
        self.fast_text = split_text(unit) if reuse is not None else None
        self.key: str | None = None
        self.cached: ProcessResult | None = None
        self.composable = False  # the split result stands for the exact one (a certificate holds)
        self._versions: list[str] = []
        self._fast: tuple[ProcessResult, list[CompilerMessage]] | None = None
        self._exact: tuple[ProcessResult, list[CompilerMessage]] | None = None
        self._composed_shown = False

    async def plan(self) -> None:
        """Looks for an identical earlier run (reading the quoted includes' stamps: in a thread)."""
        if self.reuse is None:
            return
        self._versions = [self.tool.version, *map(str, header_stamps(self.torch.include_dirs if self.torch else ()))]
        self.key = await asyncio.to_thread(Reuse.unit_key, self.argv, self.unit, self.doc.path, self._versions)
        self.cached = self.reuse.get(self.key)
        if self.fast_text is not None:
            self.composable = self.reuse.composable(self.doc.uri, self.unit, self.argv + self._versions)

    async def exact(self) -> list[Finding]:
        result = self.cached
        if result is None:
            (self.directory / self.unit.file_name).write_text(self.unit.text, encoding="utf-8", errors="replace")
            try:
                result = await run_process(self.argv, timeout_s=self.settings.compile.timeout_s,
                                           cwd=str(self.directory))
            except OSError as exc:
                return [Finding(self.doc.uri, self.unit.fallback_range, Severity.ERROR, SOURCE, "compile-failed",
                                f"{self.argv[0]} could not be started: {exc}")]
            log.info("%s %s: exit %s in %.2fs", self.unit.stage, self.unit.label, result.returncode,
                     result.duration_s)
            if self.reuse is not None and self.key is not None:
                self.reuse.put(self.key, result)
        else:
            log.info("%s %s: the result of an identical run (exit %s)", self.unit.stage, self.unit.label,
                     result.returncode)
        messages = parse_compiler_output(result.output)
        self._exact = (result, messages)
        self._settle()
        return unit_findings(self.doc, self.unit, result, self.settings, self.directory, messages)

    async def fast(self) -> None:
        """The split unit, in its own folder (so the exact run's file stays as it is)."""
        folder = self.directory / "fast"
        folder.mkdir(exist_ok=True)
        (folder / self.unit.file_name).write_text(self.fast_text, encoding="utf-8", errors="replace")
        try:
            result = await run_process(self.argv, timeout_s=self.settings.compile.timeout_s, cwd=str(folder))
        except OSError:
            return  # the exact run says why the compiler cannot start
        log.info("split %s: exit %s in %.2fs", self.unit.label, result.returncode, result.duration_s)
        if not result.timed_out:
            self._fast = (result, parse_compiler_output(result.output))
            self._settle()

    def interim(self) -> list[Finding] | None:
        """While the exact run is going, what the split run says: the unit's full result when it stands for the
        exact one, else its kernel errors marked preliminary (None: nothing to show)."""
        if self.reuse is None or self._fast is None or self._exact is not None:
            return None
        result, messages = self._fast
        folder = self.directory / "fast"
        if self._stands_for_exact(messages):
            if not self._composed_shown:
                self._composed_shown = True
                self.reuse.composed += 1
            return [dataclasses.replace(f, data={**(f.data or {}), "composed": True})
                    for f in unit_findings(self.doc, self.unit, result, self.settings, folder, messages)]
        shown = []
        for message in self.reuse.preliminary(self.doc.uri, self.unit, messages):
            finding = message_finding(self.doc, self.unit, message, folder)
            if finding is not None:
                shown.append(dataclasses.replace(finding, message=f"{finding.message} ({PRELIMINARY})",
                                                 data={**(finding.data or {}), "preliminary": True}))
        return shown or None

    def _stands_for_exact(self, messages: list[CompilerMessage]) -> bool:
        if not self.composable:
            return False
        names = quoted_names(messages)
        if not names:
            return True
        tokens = self.reuse.torch_tokens(self._tokens_key())
        return tokens is not None and not names & tokens

    def _settle(self) -> None:
        """Once both runs of a version are in: the calibration of preliminary errors, and the certificate."""
        if self.reuse is None or self._fast is None or self._exact is None:
            return
        (exact, exact_messages), (fast, fast_messages) = self._exact, self._fast
        self.reuse.calibrate(self.doc.uri, self.unit, exact_messages, fast_messages)
        agree = self.reuse.certify(self.doc.uri, self.unit, self.argv + self._versions,  # a torch upgrade: none
                                   output_of(exact.returncode, exact.output, exact_messages),
                                   output_of(fast.returncode, fast.output, fast_messages))
        if self._composed_shown and not agree:
            self.reuse.disagreements += 1
            log.warning("%s: the split compile's result, shown before the exact one, differed from it; the split "
                        "is not trusted for this document until the two agree again", self.unit.label)
        if agree:
            self.reuse.learn_torch_tokens(self._tokens_key(), self._preprocess_torch)

    def _tokens_key(self) -> str:
        return cache_key("torch_tokens", self.argv, torch_prologue(self.unit), self._versions)

    def _preprocess_torch(self) -> frozenset[str] | None:
        """Every identifier and macro name of torch's headers as this unit includes them (`nvcc -E -dD`, flags as
        the exact run). Blocking: Reuse runs it in a thread; the process dies with ours."""
        folder = self.directory / "tokens"
        folder.mkdir(exist_ok=True)
        (folder / "torch_prologue.cu").write_text(torch_prologue(self.unit), encoding="utf-8")
        argv = list(self.argv)
        argv[argv.index("-fatbin"):argv.index("-fatbin") + 1] = ["-E", "-Xcompiler", "-dD"]  # macros' names too
        argv[argv.index("-o") + 1] = "torch_prologue.i"
        del argv[argv.index("-Xptxas"):argv.index("-Xptxas") + 2]
        argv[-1] = "torch_prologue.cu"
        try:
            done = run_blocking(argv, timeout_s=self.settings.compile.timeout_s, cwd=str(folder))
        except OSError as exc:
            log.info("torch's names for the split check could not be listed: %s", exc)
            return None
        if done.returncode != 0:
            log.info("torch's names for the split check could not be listed (exit %s)", done.returncode)
            return None
        return tokens_of((folder / "torch_prologue.i").read_text("utf-8", "replace"))


def _cutlass_dirs(settings: Settings) -> tuple[str, ...]:
    """The CUTLASS/CuTe include folder, as a system include of every unit (a file that includes none of its headers
    never reads it)."""
    headers = cutlass_headers(settings.compile.cutlass_include)
    return (headers.include,) if headers is not None else ()


_MISSING_CUTLASS_HEADER = re.compile(r'cannot open source file "(?:cute|cutlass)/|(?:cute|cutlass)/\S+: No such file')


# a header of torch's CUDA side, or of a CUDA library it includes, that a CPU build of torch does not ship
_MISSING_TORCH_CUDA_HEADER = re.compile(
    r'(?:cannot open source file "|^)(?P<header>(?:c10/cuda|ATen/cuda)/\S+?'
    r'|cu(?:sparse|blas|blasLt|blas_v2|solverDn|rand|fft|dnn)\.h)(?:"|: No such file)')
TORCH_CPU_BUILD = ("{header} comes with a CUDA build of torch, and this one is a CPU build ({include} has no "
                   "c10/cuda/impl/cuda_cmake_macros.h): not a fault of this file; check it where torch has CUDA")


def _with_header_advice(finding: Finding, settings: Settings, torch: TorchHeaders | None = None) -> Finding:
    """nvcc's "cannot open source file" for a CuTe or CUTLASS header says where kernel-lsp looked and what to do;
    for a CUDA header of torch's that a CPU build of torch lacks, that this is the cause (not the user's code): a
    `torch-cpu-build` finding of Information severity, the machine's limit, which must not count among the file's
    errors (the compiler's own code stays in its data)."""
    if _MISSING_CUTLASS_HEADER.search(finding.message):
        problem = cutlass_problem(settings.compile.cutlass_include)
        return dataclasses.replace(finding, message=f"{finding.message}: {problem}")
    missing = _MISSING_TORCH_CUDA_HEADER.search(finding.message)
    cpu_build = torch_cpu_build(torch) if missing else None
    if cpu_build is None:
        return finding
    advice = TORCH_CPU_BUILD.format(include=cpu_build, header=missing["header"])
    return dataclasses.replace(finding, severity=Severity.INFORMATION, code="torch-cpu-build",
                               message=f"{finding.message}: {advice}",
                               data={**(finding.data or {}), "torchBuild": "cpu", "compilerCode": finding.code})


def torch_cpu_build(torch: TorchHeaders | None) -> str | None:
    """torch's include folder when it is a CPU build's (no CUDA configuration header), else None."""
    include = next((Path(d) for d in (torch.include_dirs if torch else ()) if (Path(d) / "c10").is_dir()), None)
    if include is None or (include / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists():
        return None
    return str(include)


def _kept(findings: list[Finding], settings: Settings) -> list[Finding]:
    return [f for f in findings if not settings.is_ignored(f.code)]


def _python_findings_and_units(doc: Document, settings: Settings) -> tuple[list[Finding], list[CompileUnit]]:
    model = parse_python(doc.text)
    findings: list[Finding] = []
    if model.syntax_error is not None and settings.check_enabled("pythonSyntax"):
        findings.append(Finding(doc.uri, model.syntax_error.range, Severity.ERROR, SOURCE, "python-syntax",
                                model.syntax_error.message))
    units: list[CompileUnit] = []
    for ext in model.extensions:
        for problem in ext.problems:
            findings.append(Finding(doc.uri, ext.call_range, Severity.INFORMATION, SOURCE, "extension-unresolved",
                                    f"{problem} (this part is not compiled by kernel-lsp)"))
        if ext.kind == "load":
            findings += _missing_source_files(doc, ext)
        else:
            units += load_inline_units(ext, doc.path, settings.compile.include_dirs, _cutlass_dirs(settings))
    return findings, units


def _missing_source_files(doc: Document, ext) -> list[Finding]:
    missing = [s for s in ext.source_files if not (doc.path.parent / s).is_file()]
    return [Finding(doc.uri, ext.call_range, Severity.WARNING, SOURCE, "extension-source-missing",
                    f"cpp_extension.load source '{s}' does not exist (relative to {doc.path.parent})")
            for s in missing]


async def _toolchain(doc: Document, units: list[CompileUnit], settings: Settings
                     ) -> tuple[list[Finding], dict[str, object]]:
    """The tools each stage needs; a missing one becomes a finding and its stage is skipped."""
    tools: dict[str, object] = {}
    findings: list[Finding] = []
    needs_torch = any(u.torch_flags for u in units)
    torch: TorchHeaders | None = None
    if needs_torch:
        try:
            torch = await find_torch_headers(settings)
        except ToolProblem as exc:
            findings.append(_tool_finding(doc, units, str(exc), "torch-missing"))
            return findings, tools
    for stage, finder, code in (("device", find_nvcc, "nvcc-missing"), ("host", find_host_compiler, "host-compiler-missing")):
        if any(u.stage == stage for u in units):
            try:
                tools[stage] = await finder(settings)
            except ToolProblem as exc:
                findings.append(_tool_finding(doc, units, str(exc), code))
    tools["torch"] = torch
    return findings, tools


def _tool_finding(doc: Document, units: list[CompileUnit], message: str, code: str) -> Finding:
    return Finding(doc.uri, units[0].fallback_range, Severity.ERROR, SOURCE, code, message,
                   data={"toolProblem": True})


def unit_findings(doc: Document, unit: CompileUnit, result: ProcessResult, settings: Settings,
                  directory: Path, messages: list[CompilerMessage] | None = None) -> list[Finding]:
    if result.timed_out:
        return [Finding(doc.uri, unit.fallback_range, Severity.ERROR, SOURCE, "compile-timeout",
                        f"{Path(result.argv[0]).name} did not finish {unit.label} within "
                        f"{settings.compile.timeout_s:g} s and was stopped (setting 'compileTimeoutS')")]
    if messages is None:
        messages = parse_compiler_output(result.output)
    findings = _one_per_instantiation([f for m in messages
                                       if (f := message_finding(doc, unit, m, directory)) is not None])
    if unit.stage == "device" and settings.check_enabled("resourceUsage") and result.returncode == 0:
        findings += resource_findings(doc, unit, parse_ptxas_verbose(result.output))
    if result.returncode != 0 and not any(f.severity == Severity.ERROR for f in findings):
        tail = (result.stderr.strip() or result.stdout.strip())[-800:]
        findings.append(Finding(doc.uri, unit.fallback_range, Severity.ERROR, SOURCE, "compile-failed",
                                f"{Path(result.argv[0]).name} failed on {unit.label} (exit status "
                                f"{result.returncode}):\n{tail}"))
    return findings


def message_finding(doc: Document, unit: CompileUnit, msg: CompilerMessage, directory: Path) -> Finding | None:
    severity = _SEVERITY.get(msg.severity, Severity.WARNING)
    code = f"{_CODE_PREFIX.get(msg.tool, 'nvcc')}-{'error' if severity == Severity.ERROR else msg.severity}"
    text = msg.message + (f" [#{msg.code}]" if msg.code and msg.tool == "nvcc-frontend" else "")
    data = {"tool": msg.tool, "diagnostic": msg.code} if msg.code else {"tool": msg.tool}
    related = tuple(r for r in (_related(unit, rel, directory) for rel in msg.related) if r is not None)
    if msg.file is None or msg.line is None or msg.tool == "ptxas":  # a ptxas position is in a temporary .ptx
        rng = _symbol_range(unit, msg.symbol) or unit.fallback_range
        return Finding(doc.uri, rng, severity, SOURCE, code, text, related, data)
    if _is_unit_file(msg.file, unit, directory):
        rng = _unit_range(unit, msg.line - 1, _unit_column(unit, msg), whole_line=_no_column(msg))
        return Finding(doc.uri, rng or unit.fallback_range, severity, SOURCE, code, text, related, data)
    header = Path(msg.file) if Path(msg.file).is_absolute() else directory / msg.file
    instantiated = _instantiated_here(doc, unit, msg, header, directory, severity, code, data)
    if instantiated is not None:
        return instantiated
    # inside an included file: shown on the #include line that leads there, the header itself as related
    where = Related(path_to_uri(header), Range.of(msg.line - 1, max((msg.column or 1) - 1, 0)), msg.message)
    rng = _include_line_range(unit, header.name) or unit.fallback_range
    return Finding(doc.uri, rng, severity, SOURCE, code, f"In included file {header.name}:{msg.line}: {text}",
                   (where,) + related, data)


_STATIC_ASSERT_TEXT = re.compile(r'static_assert\s*\(.*,\s*"(?P<text>(?:[^"\\]|\\.)*)"\s*\)')
_TEMPLATE_LIBRARIES = ("cute", "cutlass", "cub", "thrust", "cuda")  # header folders whose frames are collapsed
MAX_TEMPLATE_MESSAGE = 300


def _instantiated_here(doc: Document, unit: CompileUnit, msg: CompilerMessage, header: Path, directory: Path,
                       severity: Severity, code: str, data: dict) -> Finding | None:
    """An error inside a header that the user's code instantiated (EDG's "detected during ... at line N of
    x.cu"): one finding on the innermost line of the user's file in the chain, with the essential message (a
    static_assert's text, the error's first line shortened), and as related the header's line and the chain,
    frames inside template libraries (CuTe, CUTLASS, CUB, Thrust) collapsed into one entry each run."""
    user = next((r for r in msg.related if r.file and r.line and _is_unit_file(r.file, unit, directory)), None)
    if user is None:
        return None
    rng = _unit_range(unit, user.line - 1, _indent(unit, user.line - 1))
    if rng is None:
        return None
    first = msg.message.split("\n", 1)[0]
    asserted = _STATIC_ASSERT_TEXT.search(msg.echo or "")
    where = f"{_short_header(header)}:{msg.line}"
    essential = (f'static_assert failed: "{asserted["text"]}" ({where}: {first})' if asserted
                 else f"{first} (in {where}, instantiated here)")
    if len(essential) > MAX_TEMPLATE_MESSAGE:
        essential = essential[:MAX_TEMPLATE_MESSAGE - 1] + "…"
    related = [Related(path_to_uri(header), Range.of(msg.line - 1, max((msg.column or 1) - 1, 0)), first)]
    run: list = []  # consecutive frames inside template libraries, shown as one entry
    for frame in [*msg.related[:msg.related.index(user)], None]:
        if frame is not None and frame.file and _in_template_library(frame.file):
            run.append(frame)
            continue
        if run:
            related.append(_collapsed(run, related[0], unit, directory))
            run = []
        converted = _related(unit, frame, directory) if frame is not None else None
        if converted is not None:
            related.append(converted)
    return Finding(doc.uri, rng, severity, SOURCE, code, essential, tuple(related),
                   {**data, "instantiated": True, "header": str(header), "headerLine": msg.line})


def _one_per_instantiation(findings: list[Finding]) -> list[Finding]:
    """Errors in headers that the same user line instantiated are one finding: the first (the cause; the others
    follow from it), the others' messages added as related entries at their header lines."""
    kept: list[Finding] = []
    for finding in findings:
        previous = kept[-1] if kept else None
        if (previous is not None and (finding.data or {}).get("instantiated")
                and (previous.data or {}).get("instantiated") and previous.range == finding.range
                and previous.severity == finding.severity):
            also = Related(finding.related[0].uri, finding.related[0].range, f"then: {finding.related[0].message}")
            kept[-1] = dataclasses.replace(previous, related=previous.related + (also,))
            continue
        kept.append(finding)
    return kept


def _collapsed(run: list, fallback: Related, unit: CompileUnit, directory: Path) -> Related:
    """One entry for a run of instantiation frames inside template library headers, at the run's first frame."""
    first = _related(unit, run[0], directory) or fallback
    return Related(first.uri, first.range,
                   f"… {len(run)} instantiation frame{'s' if len(run) != 1 else ''} inside template library headers")


def _in_template_library(file: str) -> bool:
    return any(part in _TEMPLATE_LIBRARIES for part in Path(file).parts[:-1])


def _short_header(header: Path) -> str:
    """'cute/stride.hpp' for a header inside a library folder, else its name."""
    parts = header.parts
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] in _TEMPLATE_LIBRARIES:
            return "/".join(parts[index:])
    return header.name


def _indent(unit: CompileUnit, line: int) -> int:
    text = unit.lines[line] if 0 <= line < len(unit.lines) else ""
    return len(text) - len(text.lstrip())


def _is_unit_file(file: str, unit: CompileUnit, directory: Path) -> bool:
    p = Path(file)
    return p.name == unit.file_name and (not p.is_absolute() or p.parent == directory)


def _unit_column(unit: CompileUnit, msg: CompilerMessage) -> int:
    lines = unit.lines
    line = msg.line - 1
    if msg.echo is not None and msg.echo_column and 0 <= line < len(lines):
        return source_column(msg.echo, msg.echo_column, lines[line]) - 1
    if msg.column:
        return msg.column - 1
    if 0 <= line < len(lines):
        return len(lines[line]) - len(lines[line].lstrip())
    return 0


def _no_column(msg: CompilerMessage) -> bool:
    return not msg.column and not (msg.echo is not None and msg.echo_column)


def _unit_range(unit: CompileUnit, line: int, col: int, whole_line: bool = False) -> Range | None:
    """The token at (line, col) of the unit, in document coordinates: a closing bracket widened to the call or
    subscript it closes (`add(1)` for "too few arguments" at its `)`); `whole_line`: the line's code without its
    indentation (a message with no column)."""
    lines = unit.lines
    if not 0 <= line < len(lines):
        return None
    text = lines[line]
    if whole_line and text.strip():
        col, end = len(text) - len(text.lstrip()), len(text.rstrip())
    else:
        match = _WORD.match(text, col) if col < len(text) else None
        end = match.end() if match else col + 1
        if match and match.group() in _CLOSING:
            col = _bracketed_start(text, col)
    rng = Range.of(line, col, line, end)
    if unit.source_map is None:
        return rng
    return unit.source_map.range_to_original(rng)


def _bracketed_start(text: str, close: int) -> int:
    """Where the bracketed expression closed at `close` starts on its line: its opening bracket, and the name
    before it (a call, a subscript); `close` itself when the opening bracket is on another line."""
    depth, opening = 0, _CLOSING[text[close]]
    for index in range(close, -1, -1):
        if text[index] == text[close]:
            depth += 1
        elif text[index] == opening:
            depth -= 1
            if depth == 0:
                name = re.search(r"[A-Za-z_][\w:.]*(?:->[A-Za-z_]\w*)*\s*$", text[:index])
                return name.start() if name else index
    return close


def _related(unit: CompileUnit, rel, directory: Path) -> Related | None:
    if rel.file is None or rel.line is None:
        return None
    if _is_unit_file(rel.file, unit, directory):
        return None  # positions inside the scratch copy mean nothing to the editor; the message keeps the text
    path = Path(rel.file) if Path(rel.file).is_absolute() else directory / rel.file
    return Related(path_to_uri(path), Range.of(rel.line - 1, max((rel.column or 1) - 1, 0)), rel.message)


def _include_line_range(unit: CompileUnit, header_name: str) -> Range | None:
    pattern = re.compile(r'^\s*#\s*include\s*[<"]([^>"]*)[>"]')
    for number, line in enumerate(unit.lines):
        m = pattern.match(line)
        if m and Path(m.group(1)).name == header_name:
            return _unit_range(unit, number, m.start(1))
    return None


def _symbol_range(unit: CompileUnit, symbol: str | None) -> Range | None:
    """The name range of the kernel a mangled symbol (from ptxas or nvlink) belongs to."""
    if not symbol:
        return None
    name = base_name_of(demangle([symbol]).get(symbol, symbol))
    return next((rng for kernel, rng in unit.kernels if kernel.name == name), None)


def resource_findings(doc: Document, unit: CompileUnit, resources: list[KernelResources]) -> list[Finding]:
    """Per kernel: one Information finding with its ptxas figures, and a Warning when it spills."""
    by_name: dict[str, list[KernelResources]] = {}
    for r in resources:
        if r.is_entry:
            by_name.setdefault(r.base_name, []).append(r)
    findings: list[Finding] = []
    for kernel, rng in unit.kernels:
        entries = by_name.get(kernel.name, [])
        if not entries:
            continue
        summary = "; ".join(resource_summary(r, len(entries) > 1) for r in entries)
        findings.append(Finding(doc.uri, rng, Severity.INFORMATION, SOURCE, "ptxas-resources",
                                f"{kernel.name}: {summary}",
                                data={"kernel": kernel.name, "resources": [_resource_data(r) for r in entries]}))
        for r in entries:
            if r.spill_stores or r.spill_loads:
                findings.append(Finding(
                    doc.uri, rng, Severity.WARNING, SOURCE, "ptxas-spill",
                    f"{r.name} spills registers on {r.arch}: {r.spill_stores} bytes spill stores, "
                    f"{r.spill_loads} bytes spill loads ({r.registers} registers used); spilled values "
                    "live in local memory, which is as slow as global memory",
                    data={"kernel": kernel.name, "arch": r.arch, "spillStores": r.spill_stores,
                          "spillLoads": r.spill_loads, "registers": r.registers}))
    return findings


def resource_summary(r: KernelResources, with_name: bool) -> str:
    parts = [f"{r.registers} registers"]
    if r.stack_frame:
        parts.append(f"{r.stack_frame} B stack")
    if r.spill_stores or r.spill_loads:
        parts.append(f"{r.spill_stores}/{r.spill_loads} B spill stores/loads")
    parts.append(f"{r.shared_bytes} B smem")
    parts.append(f"{r.barriers} barrier{'s' if r.barriers != 1 else ''}")
    head = f"{r.name} on {r.arch}" if with_name else r.arch
    return f"{head}: " + ", ".join(parts)


def _resource_data(r: KernelResources) -> dict:
    return {"name": r.name, "arch": r.arch, "registers": r.registers, "stackFrame": r.stack_frame,
            "spillStores": r.spill_stores, "spillLoads": r.spill_loads, "sharedBytes": r.shared_bytes,
            "barriers": r.barriers}
