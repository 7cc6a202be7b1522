"""The "sanitize" job's work in the worker: a candidate under compute-sanitizer, tool by tool, its errors as
findings on the user's lines. Its handler is kernel_lsp.kinds.sanitize.handle.

The candidate runs in the profile driver (kernel_lsp/profile/driver.py), started and confined as the program ncu
profiles is (candidate/handle.py), with three changes that make the sanitizer's answers exact:
- its extensions are built with -lineinfo (nvcc reads NVCC_APPEND_FLAGS), into a build cache of their own, so an
  error names its source line and a lineinfo build never stands in for the verifier's;
- PyTorch's caching allocator is off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): each tensor is its own cudaMalloc, so
  a read one element past a tensor is past an allocation (inside the allocator's pooled segment it is not), and
  memory no kernel wrote is fresh for initcheck;
- one warm call first, outside the sanitizer (it builds the extension, loads it, autotunes), then, per tool, one
  forward call under compute-sanitizer.

A fifth check, "shared-init", is kernel-lsp's own (profile/shared_init.py): compute-sanitizer's initcheck does not
check shared memory, so the driver fills every SM's shared memory with one pattern and then another before forward
calls and compares the outputs. Output that follows the fill means a kernel read shared memory no thread wrote; the
finding sits on the candidate's `__shared__` declarations, since the check sees the output, not the access.

An error inside a file of the job (a load_inline extension's generated cuda.cu maps back into the `.py` string)
or in a kernel the candidate defines is the user's, a finding `sanitizer-<tool>` on that line. Any other (a
PyTorch kernel reading memory nobody wrote, say) is listed apart and shown once, as information, never on a line
of the user's.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lsp.compile.process import output_tail, run_process
from kernel_lsp.contracts.codec import ContractError, decode, encode
from kernel_lsp.contracts.sanitize_report import (
    FirstDependent,
    SanitizeProblem,
    SanitizeReport,
    SanitizerErrorEntry,
    SharedInitAnswer,
    ToolRunReport,
    WarmCall,
)
from kernel_lsp.findings import SOURCE, Finding, Range, Related, Severity, path_to_uri
from kernel_lsp.compile.units import CUDA_SUFFIXES
from kernel_lsp.profile.locations import (
    SharedDeclaration,
    inline_cuda,
    kernel_locations,
    original_line,
    shared_declarations,
)
from kernel_lsp.profile.ncu_run import driver_command, write_files
from kernel_lsp.profile.program import (
    build_program,
    confined_launch,
    program_header,
    run_program,
    runtime_findings,
)
from kernel_lsp.sources import find_kernels, parse_python
from kernel_lsp.candidate.handle import candidate_launch, tool_in_sandbox
from kernel_lsp.candidate.kernels import own_kernel_names
from kernel_lsp.worker.jobs import missing_package_in
from profilers.sanitizer import (
    TOOLS,
    SanitizerError,
    SanitizerNotFound,
    SanitizerReport,
    find_sanitizer,
    parse_report,
    sanitizer_command,
)

LINEINFO_CACHE = "sanitize-extensions"  # under the worker's cache folder: builds with -lineinfo
DEFAULT_TOOL_TIMEOUT_S = 300.0
WARM_TIMEOUT_S = 900.0  # the warm call builds the extension: minutes for a CUTLASS one
BUILD_FAILED = re.compile(r"Error building extension|ninja: build stopped|CalledProcessError.*ninja")
SHARED_INIT = "shared-init"  # kernel-lsp's own check of shared memory read before any thread wrote it
CHECKS = (*TOOLS, SHARED_INIT)  # what a sanitize job may run, in this order by default
NO_GPU = "compute-sanitizer needs a GPU and the worker has none visible"  # each caller adds its own remedy
NO_GPU_CODE = "sanitize-no-gpu"  # a sanitize job's Result.code when the worker has no GPU


@dataclass(frozen=True)
class SanitizePlan:
    candidate: str  # job file names, relative to the folder the files are written to
    reference: str | None
    tools: tuple[str, ...] = CHECKS
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    warm_timeout_s: float = WARM_TIMEOUT_S
    print_limit: int = 100
    allow_network: bool = False
    origins: dict[str, str] = field(default_factory=dict)  # job file name -> the user's path
    device: str = "cuda"  # the driver's; "cpu" only in tests (no tool and no fill can check a CPU run)


@dataclass
class ToolRun:
    tool: str
    report: SanitizerReport | None
    wall_s: float
    timed_out: bool = False
    problem: SanitizeProblem | None = None  # the run proves nothing clean (no log, stopped, the sanitizer failed)
    notes: list[str] = field(default_factory=list)  # failed CUDA calls it reported (no kernel site): context
    shared: SharedInitAnswer | None = None  # shared-init's answer (shared_init.run_check), for that check only

    def to_report(self) -> ToolRunReport:
        report, shared = self.report, self.shared  # a sanitizer's log, or shared-init's answer (it has no log)
        if self.tool == SHARED_INIT:
            complete, reported = shared is not None and self.problem is None, shared.dependent if shared else None
        else:
            complete, reported = bool(report and report.complete), report.reported if report else None
        return ToolRunReport(self.tool, round(self.wall_s, 2), self.timed_out, self.problem, complete, reported,
                             not_printed=bool(report and report.not_printed), notes=tuple(self.notes[:10]),
                             errors=tuple(error_entry(e) for e in report.errors) if report else (),
                             shared_init=shared)


@dataclass
class SanitizeRun:
    runs: list[ToolRun] = field(default_factory=list)
    warm: WarmCall | None = None  # the warm call: exit code, wall time, output tail
    problems: list[SanitizeProblem] = field(default_factory=list)
    runtime: list[Finding] = field(default_factory=list)  # a standalone program's plain run: its errors


def driver_argv(plan: SanitizePlan, writable: Sequence[str], warmup: int, calls: int) -> list[str]:
    return driver_command(plan.candidate, plan.reference, writable, plan.allow_network,
                          "--warmup", str(warmup), "--calls", str(calls), "--device", plan.device)


def sanitize_environment(home: Path, cache_dir: Path) -> tuple[dict[str, str], list[str]]:
    """The candidate's launch (candidate_launch) with the extension cache for -lineinfo builds, the caching
    allocator off and -lineinfo on every nvcc command."""
    environment, writable = candidate_launch(home)
    cache = cache_dir / LINEINFO_CACHE
    cache.mkdir(parents=True, exist_ok=True)
    environment["TORCH_EXTENSIONS_DIR"] = str(cache)
    environment["NVCC_APPEND_FLAGS"] = " ".join(filter(None, (environment.get("NVCC_APPEND_FLAGS"), "-lineinfo")))
    environment["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return environment, [*writable, str(cache)]


async def run_sanitizer(plan: SanitizePlan, files: dict[str, str], cache_dir: Path,
                        progress: Any = None) -> SanitizeRun:
    """The warm call, then each tool; problems (no sanitizer, a build that failed, a tool that ran too long) are
    said in the SanitizeRun, never raised. A `.cu` candidate is a standalone program (kernel_lsp/profile/program.py):
    built with nvcc, run once plainly, then once per tool."""
    outcome = SanitizeRun()
    try:
        sanitizer = find_sanitizer()
    except SanitizerNotFound as exc:
        outcome.problems.append(SanitizeProblem("sanitize-tool-missing", str(exc)))
        return outcome
    with tempfile.TemporaryDirectory(prefix="kernel-lsp-sanitize-") as directory:
        folder = Path(directory)
        write_files(folder / "task", files)
        home = folder / "home"
        home.mkdir()
        writable: list[str] = []
        standalone = plan.candidate.endswith(CUDA_SUFFIXES)
        if standalone:
            program, environment = await _warm_program(plan, files, folder, home, outcome, progress)
        else:
            environment, writable = sanitize_environment(home, cache_dir)
            program = await _warm_candidate(plan, folder, environment, writable, outcome, progress)
        if program is None:
            return outcome
        for index, tool in enumerate(plan.tools):
            if tool == SHARED_INIT and standalone:
                outcome.problems.append(SanitizeProblem(
                    "sanitize-program-shared-init", "shared-init checks a candidate's forward call: a standalone "
                    "program's kernels are not checked for reads of unwritten shared memory"))
                continue
            if progress:
                doing = ("filling shared memory before forward calls" if tool == SHARED_INIT
                         else f"compute-sanitizer --tool {tool}")
                await progress(f"{doing} on {plan.candidate}", index / len(plan.tools))
            if tool == SHARED_INIT:
                outcome.runs.append(await _shared_init(plan, folder, home, environment, writable))
            else:
                outcome.runs.append(await _one_tool(plan, tool, sanitizer, folder, program, environment,
                                                    writable or [str(home)]))
    return outcome


async def _warm_candidate(plan: SanitizePlan, folder: Path, environment: dict[str, str], writable: list[str],
                          outcome: SanitizeRun, progress: Any) -> list[str] | None:
    """The driver's warm call (build with -lineinfo, load, one forward); the argv each tool then runs, or None."""
    if progress:
        await progress(f"building {plan.candidate} with -lineinfo and running it once")
    started = time.monotonic()
    warm = await run_process(sandboxed(plan, driver_argv(plan, writable, 1, 0), folder, writable),
                             timeout_s=plan.warm_timeout_s, cwd=str(folder / "task"), env=environment)
    outcome.warm = WarmCall(warm.returncode, warm.timed_out, round(time.monotonic() - started, 2),
                            output_tail(warm.output))
    if warm.timed_out:
        outcome.problems.append(SanitizeProblem("sanitize-warm-timeout", f"the candidate's warm call (build, load, "
                                                f"one forward) ran past {plan.warm_timeout_s:.0f} s: nothing was "
                                                "sanitized"))
        return None
    if warm.returncode and (missing := missing_package_in(warm.output)) is not None:  # the worker's install
        outcome.problems.append(SanitizeProblem("sanitize-worker-package", f"{missing}: nothing was sanitized"))
        return None
    if warm.returncode and BUILD_FAILED.search(warm.output):
        outcome.problems.append(SanitizeProblem("sanitize-build-failed", f"the candidate's extension did not build: "
                                                f"{output_tail(warm.output)}"))
        return None
    if warm.returncode:  # a crash in the warm call is what memcheck explains: go on
        outcome.problems.append(SanitizeProblem("sanitize-warm-failed", f"the candidate's warm call failed (exit "
                                                f"{warm.returncode}): {output_tail(warm.output)}"))
    return driver_argv(plan, writable, 0, 1)


async def _warm_program(plan: SanitizePlan, files: dict[str, str], folder: Path, home: Path, outcome: SanitizeRun,
                        progress: Any) -> tuple[list[str] | None, dict[str, str] | None]:
    """A standalone program built (-lineinfo) and run once, confined; (the argv each tool then runs, or None; its
    environment: the candidate's, no secrets, HOME in the scratch folder)."""
    source = folder / "task" / plan.candidate
    header = program_header(files[plan.candidate])
    outcome.problems += [SanitizeProblem("sanitize-bad-header", problem.message) for problem in header.problems]
    if progress:
        await progress(f"building {plan.candidate} with nvcc -lineinfo and running it once")
    built = await build_program(source, header, folder / "program")
    if not built.built:
        outcome.problems += [SanitizeProblem("sanitize-build-failed", problem.message) for problem in built.problems]
        return None, None
    argv, environment = confined_launch([str(folder / "program"), *header.run], home, plan.allow_network)
    started = time.monotonic()
    result = await run_program(argv, folder / "task", environment, timeout_s=plan.warm_timeout_s)
    outcome.warm = WarmCall(result.returncode, result.timed_out, round(time.monotonic() - started, 2),
                            output_tail(result.output))
    outcome.runtime = runtime_findings(result, plan.origins.get(plan.candidate, plan.candidate),
                                       files[plan.candidate], Path(plan.candidate).name, plan.warm_timeout_s)
    if result.timed_out:
        outcome.problems.append(SanitizeProblem("sanitize-warm-timeout", f"the program ran past "
                                                f"{plan.warm_timeout_s:.0f} s: nothing was sanitized"))
        return None, None
    # under the sanitizer the program runs itself, with the same scrubbed environment but not confined: started
    # through the confining exec, compute-sanitizer failed at once on the H100 (exit 255 in 0.2 s, the program's
    # "CUDA error: OS call failed or operation not supported on this OS"; tests/gpu/RESULTS.md, 2026-12-05). That
    # recording allowed writes to its work folder only, not /dev and /proc as confined_launch does: whether the
    # tools work on a program confined as the plain run is has not been tried yet
    return [str(folder / "program"), *header.run], environment


async def _shared_init(plan: SanitizePlan, folder: Path, home: Path, environment: dict[str, str] | None,
                       writable: list[str]) -> ToolRun:
    """The driver's shared-memory poison check (profile/shared_init.py), confined as the warm call: one warm
    call of its own (lazy initialisation launches kernels), then the fills and forward calls."""
    answer = home / "shared-init.json"
    argv = sandboxed(plan, [*driver_argv(plan, writable, 1, 0), "--poison-shared", str(answer)], folder, writable)
    started = time.monotonic()
    result = await run_process(argv, timeout_s=plan.tool_timeout_s, cwd=str(folder / "task"), env=environment)
    run = ToolRun(SHARED_INIT, None, time.monotonic() - started, timed_out=result.timed_out)
    run.shared = read_answer(answer)
    run.problem = shared_init_problem(run.shared, result.returncode, result.timed_out, plan.tool_timeout_s,
                                      output_tail(result.output))
    return run


def read_answer(path: Path) -> SharedInitAnswer | None:
    """The answer the confined driver wrote, or None when there is none it could have meant (no file, not JSON,
    not the contract's form: the candidate's process writes that file)."""
    try:
        return decode(SharedInitAnswer, json.loads(path.read_text())) if path.is_file() else None
    except (OSError, ValueError, ContractError):
        return None


def shared_init_problem(answer: SharedInitAnswer | None, exit_code: int | None, timed_out: bool, timeout_s: float,
                        tail: str) -> SanitizeProblem | None:
    """Why the shared-memory check proves nothing, or None: stopped, no answer, the fill could not run, or an
    output that changed between runs with the same fill (nondeterminism: no verdict either way)."""
    if timed_out:
        return SanitizeProblem("sanitize-tool-stopped", f"{SHARED_INIT} ran past {timeout_s:.0f} s and was stopped "
                               "(raise sanitizeTimeoutS)")
    if answer is None:
        return SanitizeProblem("sanitize-no-answer", f"the shared-memory check gave no answer (exit {exit_code}): "
                               f"{tail}")
    if answer.problem:
        return SanitizeProblem("sanitize-fill-failed", f"{SHARED_INIT} could not check the candidate: "
                               f"{answer.problem}")
    if answer.unstable:
        followed = (f"; {answer.dependent} others followed the fill, which may be chance" if answer.dependent
                    else "")
        return SanitizeProblem("sanitize-nondeterministic", f"{SHARED_INIT} is inconclusive: {answer.unstable} of "
                               f"{answer.elements} output elements changed between two runs with the same "
                               "shared-memory fill (the output is not deterministic, beyond the verifier's "
                               f"tolerance){followed}")
    return None


def sandboxed(plan: SanitizePlan, argv: list[str], folder: Path, writable: Sequence[str]) -> list[str]:
    """`argv` with the candidate it runs in the candidate's sandbox where one starts here (tool_in_sandbox): the
    run's task files and program read-only; `writable` and the tools' log folder writable (a driver confines
    itself to `writable` inside, so it cannot write the logs)."""
    logs = folder / "logs"
    logs.mkdir(exist_ok=True)
    readable = tuple(str(path) for path in (folder / "task", folder / "program") if path.exists())
    tool = os.path.dirname(os.path.realpath(argv[0]))  # compute-sanitizer's installation, or Python's
    return tool_in_sandbox(argv, [*writable, str(logs)], (*readable, tool), plan.allow_network)[0]


async def _one_tool(plan: SanitizePlan, tool: str, sanitizer: str, folder: Path, program: list[str],
                    environment: dict[str, str] | None, writable: Sequence[str]) -> ToolRun:
    log = folder / "logs" / f"{tool}.log"  # written by compute-sanitizer itself, outside the driver's reach
    argv = sandboxed(plan, sanitizer_command(tool, program, log, sanitizer, plan.print_limit), folder, writable)
    started = time.monotonic()
    try:
        result = await run_process(argv, timeout_s=plan.tool_timeout_s, cwd=str(folder / "task"), env=environment)
    except OSError as exc:
        return ToolRun(tool, None, 0.0, problem=SanitizeProblem("sanitize-cannot-run",
                                                                 f"cannot run {sanitizer}: {exc}"))
    wall = time.monotonic() - started
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    if not text.strip():
        text = result.output  # it failed before opening its log: its complaint is on the terminal
    report = parse_report(text, tool)
    run = ToolRun(tool, report, wall, timed_out=result.timed_out)
    run.problem = tool_problem(tool, report, result.returncode, result.timed_out, plan.tool_timeout_s,
                               output_tail(result.output))
    return run


def tool_problem(tool: str, report: SanitizerReport, exit_code: int | None, timed_out: bool, timeout_s: float,
                 tail: str) -> SanitizeProblem | None:
    """Why a tool's run proves nothing clean, or None: stopped by its time limit, no summary, the sanitizer's own
    complaint (an error with no kernel that is no failed CUDA call: "Device not supported"), or a program that
    failed while the tool found nothing in any kernel."""
    if timed_out:
        return SanitizeProblem("sanitize-tool-stopped", f"{tool} ran past {timeout_s:.0f} s and was stopped: "
                               f"{len(report.errors)} errors printed before that are shown (raise sanitizeTimeoutS)")
    if not report.complete:
        return SanitizeProblem("sanitize-no-summary", f"{tool} printed no summary (exit {exit_code}): {tail}")
    complaint = next((e.title for e in report.errors if e.site is None and e.kind != "api-error"), None)
    if complaint is not None:
        return SanitizeProblem("sanitize-tool-complaint", f"{tool} could not check the program: {complaint}")
    if exit_code and not any(e.site for e in report.errors):
        return SanitizeProblem("sanitize-program-failed", f"the program failed under {tool} (exit {exit_code}) and "
                               f"{tool} found no error in a kernel: {tail}")
    return None


def error_entry(error: SanitizerError, tool: str | None = None) -> SanitizerErrorEntry:
    """One error as the report carries it (`tool`: the run's, where the error is listed apart from it): its
    `to_dict`, the one list of its fields (the findings' data carry it too), held to the report's contract."""
    return decode(SanitizerErrorEntry, {**error.to_dict(), "tool": tool or error.tool})


# --- findings --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExtensionSource:
    path: str  # the user's file
    generated: Any  # GeneratedFile of load_inline's cuda.cu
    kernels: frozenset[str] = frozenset()  # base names of the kernels its CUDA defines


def user_line(file: str | None, line: int | None, files: dict[str, str], origins: dict[str, str],
              extensions: dict[str, ExtensionSource], kernel: str | None = None) -> tuple[str, int] | None:
    """(user's path, 0-based line) of a sanitizer site's FILE:LINE: a file of the job by its path under the
    task folder, or load_inline's cuda.cu of an extension. torch builds from the extension's folder, so the
    path is a bare `cuda.cu` (recorded): the extension is the one whose CUDA defines `kernel`, else the one
    named by a folder in the path."""
    if not file or not line:
        return None
    path = Path(file)
    if path.name == "cuda.cu":
        ext = next((e for e in extensions.values() if kernel and kernel in e.kernels), None)
        ext = ext or extensions.get(path.parent.name) or extensions.get(re.sub(r"_v\d+$", "", path.parent.name))
        if ext is not None:
            mapped = original_line(ext.generated.map, ext.generated.text.splitlines(), line)
            return (ext.path, mapped) if mapped is not None else None
    parts = path.parts  # the job's files are written under a "task" folder; nvcc records the path it was given
    for name in sorted(files, key=lambda n: -len(Path(n).parts)):  # the longest match first: "a/k.cu" before "k.cu"
        name_parts = Path(name).parts
        if tuple(parts[-len(name_parts):]) == name_parts:
            return origins.get(name, name), line - 1
    return None


def inline_extensions(files: dict[str, str], origins: dict[str, str]) -> dict[str, ExtensionSource]:
    found: dict[str, ExtensionSource] = {}
    for name, text in files.items():
        if not name.endswith(".py"):
            continue
        for ext, cuda in inline_cuda(parse_python(text).extensions):
            if ext.name:
                kernels = frozenset(k.name for k in find_kernels(cuda.text) if k.has_body)
                found.setdefault(ext.name, ExtensionSource(origins.get(name, name), cuda, kernels))
    return found


def sanitize_findings(run: SanitizeRun, files: dict[str, str], own_files: dict[str, str], origins: dict[str, str],
                      candidate: str) -> tuple[list[Finding], list[SanitizerErrorEntry]]:
    """(findings on the user's lines, one per distinct error site and tool; the errors in others' kernels)."""
    extensions = inline_extensions(own_files, origins)
    own = {name.rsplit("::", 1)[-1] for name in own_kernel_names(own_files)}
    grouped: dict[tuple, list[SanitizerError]] = {}
    library: list[SanitizerErrorEntry] = []
    placed: dict[tuple, tuple[str, int]] = {}
    for tool_run in run.runs:
        for error in tool_run.report.errors if tool_run.report else []:
            site = error.site
            if site is None:  # a failed CUDA call ("Program hit cudaErrorLaunchFailure ..."): what followed an error
                tool_run.notes.append(error.title)
                continue
            where = user_line(site.file, site.line, own_files, origins, extensions, site.kernel)
            if where is None and site.kernel in own:
                where = _kernel_line(site.kernel, own_files, origins)
            if where is None:
                library.append(error_entry(error, tool_run.tool))
                continue
            other = error.other
            other_where = (user_line(other.file, other.line, own_files, origins, extensions, other.kernel)
                           if other else None)
            key = (tool_run.tool, error.kind, where, other_where)
            grouped.setdefault(key, []).append(error)
            placed[key] = where
    findings = [*run.runtime, *(_finding(key[0], errors, placed[key], key[3]) for key, errors in grouped.items())]
    for tool_run in run.runs:
        answer = tool_run.shared
        if tool_run.tool == SHARED_INIT and tool_run.problem is None and answer is not None and answer.dependent:
            findings.append(_shared_finding(answer, own_files, origins, files, candidate))
    if library:
        findings.append(_library_finding(library, files, origins, candidate))
    return findings, library


def _finding(tool: str, errors: list[SanitizerError], where: tuple[str, int],
             other: tuple[str, int] | None) -> Finding:
    first = errors[0]
    message = f"compute-sanitizer {tool}: {first.describe()}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more like it)"
    severity = Severity.WARNING if first.severity != "error" else Severity.ERROR
    related = ()
    if other is not None and other != where:
        related = (Related(path_to_uri(other[0]), Range.line(other[1]),
                           f"the other access of the race ({first.other_access or 'access'})"),)
    return Finding(path_to_uri(where[0]), Range.line(where[1]), severity, SOURCE, f"sanitizer-{tool}", message,
                   related, data={"tool": tool, "kind": first.kind, "count": len(errors),
                                  "errors": [e.to_dict() for e in errors[:5]]})


def _shared_finding(answer: SharedInitAnswer, own_files: dict[str, str], origins: dict[str, str],
                    files: dict[str, str], candidate: str) -> Finding:
    """shared-init's error: on the first `__shared__` declaration of the candidate's kernels (the others related),
    else on `class ModelNew`."""
    declarations = shared_declarations(own_files, origins)
    in_kernels = [d for d in declarations if d.kernel] or declarations
    first = answer.first or FirstDependent(0, 0)
    patterns = answer.patterns or ()
    message = (f"{SHARED_INIT}: {answer.dependent} of {answer.elements} output elements changed with "
               f"what was in shared memory before the forward call (every SM's shared memory filled with "
               f"{' then '.join(patterns) or 'two patterns'}; each fill twice gave the same output, within "
               f"tolerance): a kernel reads shared memory no thread of its block wrote (first at output "
               f"{first.output}, element {first.index})")
    if in_kernels:
        where = in_kernels[0].location
        kernels = sorted({d.kernel for d in in_kernels if d.kernel})
        which = (f"the kernel with shared memory, {kernels[0]}" if len(kernels) == 1 else
                 f"one of the kernels with shared memory ({', '.join(kernels)})" if kernels else
                 "a kernel using this shared memory")
        message += (f"; the read is in {which}: the check sees the output, not the read, so this marks the "
                    "declaration")
        uri, rng = path_to_uri(where.file), where.range
        related = _shared_related(in_kernels)
    else:
        message += ("; no `__shared__` declaration of the candidate's was found (shared memory a library or the "
                    "compiler declares)")
        uri, related = path_to_uri(origins.get(candidate, candidate)), ()
        rng = Range.line(_model_line(files.get(candidate, "")))
    return Finding(uri, rng, Severity.ERROR, SOURCE, f"sanitizer-{SHARED_INIT}", message, related,
                   data={"tool": SHARED_INIT, "kind": "uninitialized-shared-read", "count": 1,
                         "answer": encode(answer)})


def _shared_related(declarations: list[SharedDeclaration]) -> tuple[Related, ...]:
    """The reads of the declared arrays (one per line, the first eight), then the other declarations."""
    reads: dict[tuple[str, int], Related] = {}
    for declaration in declarations:
        for read in declaration.reads:
            key = (read.file, read.range.start.line)
            names = "/".join(f"`{n}`" for n in declaration.names) or "it"
            reads.setdefault(key, Related(path_to_uri(read.file), read.range,
                                          f"a read of {names} (one of the reads the check cannot tell apart)"))
    others = [Related(path_to_uri(d.location.file), d.location.range,
                      f"shared memory of {d.kernel or 'a device function'}") for d in declarations[1:4]]
    return (*list(reads.values())[:8], *others)


def library_kernels(errors: Sequence[SanitizerErrorEntry]) -> str:
    """The kernels of errors kept apart, the first three by name: 'a, b, c, ...'."""
    kernels = sorted({(e.site.kernel if e.site else "") or "an unnamed kernel" for e in errors})
    return ", ".join(kernels[:3]) + (", ..." if len(kernels) > 3 else "")


def _library_finding(library: list[SanitizerErrorEntry], files: dict[str, str], origins: dict[str, str],
                     candidate: str) -> Finding:
    tools = sorted({e.tool for e in library})
    line = _model_line(files.get(candidate, ""))
    message = (f"compute-sanitizer ({', '.join(tools)}) found {len(library)} errors in kernels that are not the "
               f"candidate's own ({library_kernels(library)}): PyTorch's or a library's, shown apart; the inputs "
               "the candidate gives them may be the cause")
    return Finding(path_to_uri(origins.get(candidate, candidate)), Range.line(line), Severity.INFORMATION, SOURCE,
                   "sanitizer-library", message, data={"errors": [encode(e) for e in library[:20]]})


def _model_line(text: str) -> int:
    for number, line in enumerate(text.splitlines()):
        if line.startswith("class ModelNew"):
            return number
    return 0


def _kernel_line(kernel: str, own_files: dict[str, str], origins: dict[str, str]) -> tuple[str, int] | None:
    location = kernel_locations(own_files, origins).get(kernel)
    return (location.file, location.range.start.line) if location else None


def summary_line(run: SanitizeRun, findings: Sequence[Finding], library: Sequence[SanitizerErrorEntry]) -> str:
    """`memcheck 1 · racecheck 0 · initcheck 0 · synccheck 0` errors of the candidate's, then what is apart."""
    if not run.runs:
        return "not sanitized: " + ("; ".join(p.message for p in run.problems) or "no tool ran")
    own = {tool_run.tool: 0 for tool_run in run.runs}
    for finding in findings:
        if finding.code.startswith("sanitizer-") and finding.code != "sanitizer-library":
            own[finding.code.removeprefix("sanitizer-")] += (finding.data or {}).get("count", 1)
    parts = []
    for tool_run in run.runs:
        mark = " (stopped)" if tool_run.timed_out else " (incomplete)" if tool_run.problem else ""
        parts.append(f"{tool_run.tool} {own[tool_run.tool]}{mark}")
    failed = bool(run.runtime)  # a standalone program's own run failed
    verdict = "clean" if not any(own.values()) and not failed and all(not r.problem for r in run.runs) else (
        "errors found" if any(own.values()) or failed else "incomplete")
    tail = f" · {len(library)} in others' kernels" if library else ""
    return f"{verdict}: " + " · ".join(parts) + tail


def sanitize_report(run: SanitizeRun, findings: Sequence[Finding],
                    library: Sequence[SanitizerErrorEntry]) -> SanitizeReport:
    own_errors = sum((f.data or {}).get("count", 1) for f in findings
                     if f.code.startswith("sanitizer-") and f.code != "sanitizer-library")
    clean = bool(run.runs) and own_errors == 0 and not run.runtime and not any(r.problem for r in run.runs)
    return SanitizeReport(tuple(r.to_report() for r in run.runs), run.warm, tuple(run.problems), tuple(library),
                          own_errors, tuple(f.message for f in run.runtime), clean)
