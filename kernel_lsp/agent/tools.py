"""The tools the model calls during an optimization pass, and their executors.

Every tool that runs code goes through the same worker jobs the user sees ("verify", "profile", "sanitize") and
the same compile checks as the editor, so the model is told, and scored on, exactly what the user would be shown.
Results are short JSON texts; compile and verify problems are cut to the first few, with line numbers.

A new text that verifies is then run under compute-sanitizer (the "sanitize" job, once per text in a pass, unless the
pass verifies on the CPU or agentSanitize is off; the user's own kernel is never handed back, so never checked): its
errors on the candidate's lines make the verify answer a reject that says where (agent/safety.py). A worker that
answers it cannot sanitize (no GPU, no compute-sanitizer) is not asked again in the pass.

Profiling is delayed (CuTeGen found that it pays): `profile` is offered only once the current candidate is
verified as it stands and the last two verified versions have the same kernels (names and signatures), i.e.
its structure has stopped changing and a profile of it will still describe the next version.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import dataclasses
import hashlib
import importlib.util
import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lsp.agent import code_search, rubric, safety
from kernel_lsp.agent.evaluation import candidate_timing, report_of
from kernel_lsp.compile.check import Document
from kernel_lsp.compile.service import CompileService
from kernel_lsp.compile.toolchain import cutlass_headers, cutlass_problem
from kernel_lsp.config import Settings
from kernel_lsp.findings import Finding, Severity, path_to_uri
from kernel_lsp.kinds.cute_dsl import CuteDslOutcome, cute_dsl_job, dsl_arch
from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.options import ProfileOptions, VerifyOptions, coerce
from kernel_lsp.contracts.profile_report import NOTE_CODES, ProfileHint, ProfileReport
from kernel_lsp.kinds.profile import ProfileOutcome, profile_job
from kernel_lsp.kinds.sanitize import SanitizeOutcome, client_timeout_s, sanitize_job, sanitize_options
from kernel_lsp.kinds.verify import VerifyOutcome, verify_job
from kernel_lsp.sources import find_kernels, parse_python
from kernel_lsp.worker.client import WorkerClient
from kernel_lsp.worker.protocol import Job, Result
from profilers.ncu import CLASSIFY_SECTIONS, sections_for_bounds

MAX_PROBLEMS = 5  # errors and findings shown to the model; the rest are counted
MAX_MESSAGE_CHARS = 400
PRINTED_CHARS = 2000  # probe: the tail of what the candidate printed
MAX_HINTS = 3  # profile hints per kernel, the largest estimated gains first
QUICK_CALLS, QUICK_WARMUP = 10, 2  # time_quick: timed calls and warm-up calls (fewer when the pass asks for fewer)
# compile findings that say this machine lacks a tool, not that the code is wrong
ENVIRONMENT_CODES = {"nvcc-missing", "host-compiler-missing", "torch-missing", "compile-timeout", "compile-failed"}

CUTE_TARGETS = ("cute", "cute-dsl")  # targets offered search_cutlass
PROFILE_NOT_READY = ("not ready: profile runs once the current text is verified and its kernels are the same as in "
                     "the verified version before it (verify it; profile what you keep)")
WORKER_TOOLS = ("verify", "profile", "time_quick", "probe", "static_facts", "compile")  # may run a worker job: budgeted
TOOL_DEFINITIONS: dict[str, dict[str, Any]] = {
    "read_reference": {
        "description": "Read the reference problem (Model, get_inputs, get_init_inputs) the candidate must match.",
        "input_schema": {"type": "object", "properties": {}},
    },
    "read_candidate": {
        "description": "Read the current candidate (the file defining ModelNew), with 1-based line numbers.",
        "input_schema": {"type": "object", "properties": {}},
    },
    "read_node": {
        "description": "Read an earlier candidate of this pass by its number (#N in the list of what was tried): "
                       "its code with line numbers, its outcome and speedups, and the finding codes behind a reject. "
                       "Use it to build on the best one or to avoid repeating a failure.",
        "input_schema": {"type": "object", "properties": {"node": {"type": "integer"}}, "required": ["node"]},
    },
    "write_candidate": {
        "description": "Replace the current candidate: either the whole file (`source`) or line edits (`edits`, "
                       "1-based inclusive line ranges of the current text, applied together; end_line = "
                       "start_line - 1 inserts before start_line; empty text deletes the lines).",
        "input_schema": {
            "type": "object",
            "properties": {
                "source": {"type": "string", "description": "the whole new file"},
                "edits": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"start_line": {"type": "integer"}, "end_line": {"type": "integer"},
                                   "text": {"type": "string"}},
                    "required": ["start_line", "end_line", "text"]}},
            },
        },
    },
    "compile": {
        "description": "Check the current candidate without running it: Python syntax, ModelNew defined, and the "
                       "CUDA sources of load_inline compiled with nvcc. Returns the first errors with line numbers.",
        "input_schema": {"type": "object", "properties": {}},
    },
    "verify": {
        "description": "Run the current candidate against the reference on the worker: correctness over several "
                       "input sets, integrity checks (cheating is rejected and scores zero), and timing against "
                       "PyTorch. Only a verified candidate counts. On a GPU worker a candidate that verifies is "
                       "also run under compute-sanitizer: an out-of-bounds access, a race, an uninitialized read "
                       "or a barrier error in its kernels rejects it (scores zero), and the answer gives each "
                       "error's line.",
        "input_schema": {"type": "object", "properties": {}},
    },
    "time_quick": {
        "description": "Time the current candidate cheaply, to compare ideas before a full verify: one correctness "
                       "trial, a few timed calls, against eager only. Its answer is not a verification: only "
                       "verify makes a candidate count.",
        "input_schema": {"type": "object", "properties": {}},
    },
    "probe": {
        "description": "Run the current candidate and the reference on small inputs you choose, to see where they "
                       "differ: one correctness trial on the worker, no timing. Answers whether the outputs match, "
                       "the mismatch (worst index, expected and actual values) and what the candidate printed "
                       "(print only on the first call: the verifier calls forward several times). Not a "
                       "verification.",
        "input_schema": {"type": "object", "required": ["inputs"], "properties": {
            "inputs": {"type": "string", "description": "a Python expression (torch is imported) giving the list "
                                                        "of forward's inputs, e.g. [torch.arange(8.0) - 4]"},
            "init_inputs": {"type": "string", "description": "optional: the constructor's arguments as a list "
                                                             "expression (default: the reference's)"}}},
    },
    "static_facts": {
        "description": "What nvcc says of the current candidate's CUDA kernels without running them: per kernel the "
                       "registers, spills, shared memory and stack (ptxas), the SASS facts (width of global loads "
                       "and stores, local-memory traffic, tensor-core instructions, loops) and the static hints "
                       "on their lines. Triton kernels are not covered.",
        "input_schema": {"type": "object", "properties": {}},
    },
    "profile": {
        "description": "Profile the current candidate's kernels: what limits each one, its time, and hints with "
                       "estimated gains. Ready once the current text is verified and its kernels are the same as "
                       "in the verified version before it (until then it says so and runs nothing).",
        "input_schema": {"type": "object", "properties": {}},
    },
    "search_cutlass": {
        "description": "Search the installed CUTLASS/CuTe headers and examples (cute/, cutlass/, examples/) for how "
                       "something is done: a few words (e.g. 'SM90 TMA copy make_tma_copy' or 'local_tile "
                       "partition'). Answers up to 5 snippets with their paths and line numbers. Runs here, not "
                       "on the worker.",
        "input_schema": {"type": "object", "required": ["query"], "properties": {
            "query": {"type": "string", "description": "words to look for"}}},
    },
    "finish": {
        "description": "End the optimization pass. The best verified candidate so far is what the user gets.",
        "input_schema": {"type": "object", "properties": {
            "summary": {"type": "string", "description": "what was tried and what worked, in a few lines"}}},
    },
}


@dataclass(frozen=True)
class ToolResult:
    content: str  # the JSON text the model reads
    is_error: bool = False
    evaluation: dict[str, Any] | None = None  # set by a verify that ran: what the search tree records
    worker_jobs: int = 0  # evaluations spent on the worker (counted against the budget)
    energy: dict[str, Any] | None = None  # set by a profile that read both energies: the rubric's energy term


@dataclass
class CandidateState:
    """What the tools know about the current candidate."""

    source: str
    verified_structures: list[tuple[str, ...]] = field(default_factory=list)  # one per verified version, in order
    last_verified_source: str | None = None
    verdicts: dict[str, ToolResult] = field(default_factory=dict)  # source -> its verify result, this pass
    finished: str | None = None  # finish's summary, once called


@dataclass
class Sanitizing:
    """The pass's compute-sanitizer checks, shared by a workbench and its forks."""

    entries: dict[str, asyncio.Future] = field(default_factory=dict)  # text -> its check (in flight or finished)
    unavailable: str | None = None  # why no candidate of the pass can be checked, once the worker said so


class Workbench:
    """The tools' executors over one pass's candidate. A candidate's job is built from its text under a hidden
    name beside the original (never written to disk), so that the files it loads or imports relatively are found
    and carried."""

    def __init__(self, original: Path, reference: Path, start_source: str, settings: Settings,
                 worker: WorkerClient, verify_options: VerifyOptions | Mapping[str, Any], pass_id: str,
                 compile_service: CompileService | None = None) -> None:
        self.original = original
        self.reference = reference
        self.settings = settings
        self.worker = worker
        self.verify_options = coerce(VerifyOptions, verify_options)  # or its config entries ({"timedCalls": 5})
        self.pass_id = pass_id
        self.compile_service = compile_service or CompileService()
        self.state = CandidateState(start_source)
        self.original_source = start_source  # the user's kernel: never handed back, so never sanitized
        self.sanitizing = Sanitizing()
        self._scratch_numbers = itertools.count(1)
        # the pass's view of an earlier candidate by node number (set by the Optimizer): source, outcome, codes
        self.node_view: Callable[[int], dict[str, Any] | None] | None = None
        self.on_stage: Callable[[str, str], None] | None = None  # the pass's progress (stage, message)
        self.target = settings.agent.target  # what kernels are written in (auto, cuda, triton, cute, cute-dsl)

    # --- what the model is offered -------------------------------------------------------------------

    def profile_ready(self) -> bool:
        """The current text is verified and the last two verified versions have the same kernels."""
        structures = self.state.verified_structures
        return (self.state.last_verified_source == self.state.source and len(structures) >= 2
                and structures[-1] == structures[-2])

    def tool_definitions(self) -> list[dict[str, Any]]:
        # the same list for a whole pass (a changed list would break the prompt cache): a tool that is not ready
        # yet (profile) answers why
        offered = [name for name in TOOL_DEFINITIONS if name != "search_cutlass" or self.target in CUTE_TARGETS]
        return [{"name": name, **TOOL_DEFINITIONS[name]} for name in offered]

    def start_from(self, source: str) -> None:
        """The next expansion edits this node's source."""
        self.state.source = source

    def fork(self, source: str) -> Workbench:
        """A workbench for an expansion run beside others: its own current candidate (from `source`), the same
        worker, compile service and pass, and the same verdicts (a text verified by one is not sent again)."""
        other = copy.copy(self)
        other.state = CandidateState(source, verdicts=self.state.verdicts)
        return other

    # --- dispatch --------------------------------------------------------------------------------------

    async def execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        executors = {"read_reference": self.read_reference, "read_candidate": self.read_candidate,
                     "read_node": self.read_node,
                     "write_candidate": self.write_candidate, "compile": self.compile, "verify": self.verify,
                     "time_quick": self.time_quick, "probe": self.probe, "static_facts": self.static_facts,
                     "search_cutlass": self.search_cutlass,
                     "profile": self.profile, "finish": self.finish}
        executor = executors.get(name)
        if executor is None:
            return _error(f"unknown tool {name!r}; the tools are {', '.join(TOOL_DEFINITIONS)}")
        return await executor(arguments if isinstance(arguments, dict) else {})

    # --- executors -------------------------------------------------------------------------------------

    async def read_reference(self, _arguments: dict[str, Any]) -> ToolResult:
        return _ok({"path": self.reference.name, "source": _read(self.reference)})

    async def read_candidate(self, _arguments: dict[str, Any]) -> ToolResult:
        return _ok({"lines": len(self.state.source.splitlines()), "source": numbered_source(self.state.source)})

    async def read_node(self, arguments: dict[str, Any]) -> ToolResult:
        number = arguments.get("node")
        if isinstance(number, bool) or not isinstance(number, int):
            return _error("give `node`, the number of an earlier candidate (#N)")
        view = self.node_view(number) if self.node_view is not None else None
        if view is None:
            return _error(f"there is no candidate #{number} in this pass")
        lines = view.pop("source").splitlines()
        numbered = "\n".join(f"{line_number:4d}| {line}" for line_number, line in enumerate(lines, 1))
        return _ok({**view, "lines": len(lines), "source": numbered})

    async def write_candidate(self, arguments: dict[str, Any]) -> ToolResult:
        source, edits = arguments.get("source"), arguments.get("edits")
        if (source is None) == (edits is None):
            return _error("give either `source` (the whole file) or `edits` (line edits), not both or neither")
        if source is not None and not isinstance(source, str):
            return _error("`source` must be a string")
        try:
            new_text = source if source is not None else apply_line_edits(self.state.source, edits)
        except ValueError as exc:
            return _error(str(exc))
        self.state.source = new_text
        return _ok({"written": True, "lines": len(new_text.splitlines())})

    async def compile(self, _arguments: dict[str, Any]) -> ToolResult:
        source = self.state.source
        report = await self._compile_report(source)
        model = parse_python(source)
        if report["ok"] and model.cute_kernels:
            return ToolResult(_json(await self._dsl_compile(source, report)), worker_jobs=1)
        if not report["ok"] or not model.triton_kernels:
            return _ok(report)
        return ToolResult(_json(await self._first_call(source, report)), worker_jobs=1)

    async def _dsl_compile(self, source: str, report: dict[str, Any]) -> dict[str, Any]:
        """CuTe DSL code compiles when a @cute.jit function is first called: the worker's "cute-dsl-check" job
        compiles it without launching (no GPU needed), so its errors cost no verification; the kernels' figures
        (registers, local memory, tensor-core instructions) come with it."""
        outcome = CuteDslOutcome.of(await self._run_job(cute_dsl_job, dsl_arch(self.settings), source))
        errors = [_problem(f) for f in outcome.compile_errors]
        if errors:
            return {**report, "ok": False, "errors": errors[:MAX_PROBLEMS], "dsl": outcome.summary}
        kernels = [{"kernel": k.function or k.kernel, "figures": k.resources.summary}
                   for k in outcome.kernels if k.resources]
        notes = [_cut(f.message) for f in outcome.findings if f.code.startswith("cute-dsl")]
        return {**report, "dsl": outcome.summary, **({"kernels": kernels} if kernels else {}),
                **({"notes": report.get("notes", []) + notes} if notes else {})}

    async def _first_call(self, source: str, report: dict[str, Any]) -> dict[str, Any]:
        """Triton compiles a kernel at its first call, so what only that call finds (a tl.arange whose size is not
        a power of 2, a shape error in the kernel) costs one call here, not a full verification: a verify job with
        one trial, no timing and no baselines, whose run-* failures become compile errors (its verdict is ignored)."""
        outcome = VerifyOutcome.of(await self._run_job(verify_job, self._one_trial_options(), source), for_reward=True)
        failures = [_problem(f) for f in outcome.findings if f.code.startswith("run-")]
        if failures:
            return {**report, "ok": False, "errors": failures[:MAX_PROBLEMS], "first_call": "failed"}
        if not outcome.finished:
            return {**report, "first_call": f"not run: {_cut(outcome.summary)}"}
        return {**report, "first_call": "ran (one call on the worker; its result is not checked here)"}

    async def verify(self, _arguments: dict[str, Any]) -> ToolResult:
        return await self.evaluate(self.state.source)

    async def evaluate(self, source: str) -> ToolResult:
        """The verify tool on any text: compile check first (no worker job for a file that cannot build), then
        the worker's "verify" job. Several may run at once (--replay sends one per actor)."""
        previous = self.state.verdicts.get(source)
        if previous is not None:  # verified before in this pass: the same answer, no new node, no job
            return ToolResult(_json({**json.loads(previous.content), "unchanged": True}), previous.is_error)
        compiled = await self._compile_report(source)
        jobs = int(compiled["ok"])
        if compiled["ok"]:
            result = await self._run_job(verify_job, self.verify_options, source)
            evaluation = verify_evaluation(source, result)
        else:
            evaluation = compile_failure_evaluation(source, compiled)
        if rubric.score(evaluation).verified and source != self.original_source:
            evaluation["sanitize"], sent = await self.sanitize(source)
            jobs += sent
        if evaluation["verdict"] == "verified" and not safety.sanitizer_errors(evaluation):
            self.state.verified_structures.append(kernel_structure(source))
            self.state.last_verified_source = source
        outcome = ToolResult(_json(verify_feedback(evaluation)), evaluation=evaluation, worker_jobs=jobs)
        self.state.verdicts[source] = outcome
        return outcome

    async def sanitize(self, source: str) -> tuple[dict[str, Any], int]:
        """compute-sanitizer's check of a verified text (agent/safety.py's entry), and the jobs sent for it (0 or 1):
        one job per text in the pass, its answer shared by the forks; none on the CPU, with the setting off, or once
        the worker said it cannot sanitize. A check that could not run is not kept (the next verify may retry)."""
        if not self.settings.agent.sanitize:
            return safety.not_sanitized(safety.SETTING_OFF), 0
        if self.verify_options.device == "cpu":
            return safety.not_sanitized(safety.ON_CPU), 0
        shared = self.sanitizing
        if shared.unavailable is not None:
            return safety.not_sanitized(shared.unavailable), 0
        known = shared.entries.get(source)
        if known is not None:
            return dict(await known), 0
        check = asyncio.ensure_future(self._sanitize_job(source))
        shared.entries[source] = check
        try:
            entry = await check
        except BaseException:
            shared.entries.pop(source, None)
            raise
        if entry["status"] not in safety.FINISHED:  # what says the run itself went wrong is not kept
            shared.entries.pop(source, None)
            shared.unavailable = shared.unavailable or safety.lasting_reason(entry)
        return dict(entry), 1

    async def _sanitize_job(self, source: str) -> dict[str, Any]:
        """The "sanitize" job on `source` (the tools and time limits of the settings, the pass's network rule)."""
        options = sanitize_options(self.settings, allow_network=self.verify_options.allow_network)
        if self.on_stage is not None:
            self.on_stage("sanitize", f"compute-sanitizer ({', '.join(options.tools)}) on the verified candidate")
        path = self.scratch_path()
        job = sanitize_job(path, self.reference, options, {path: source})
        result = await self.worker.run(job, timeout_s=client_timeout_s(options, self.settings))
        return safety.sanitize_entry(SanitizeOutcome.of(result), path, self.original.parent)

    async def time_quick(self, _arguments: dict[str, Any]) -> ToolResult:
        """A cheap experiment: the verify job with one trial and a few calls against eager; not a node."""
        source = self.state.source
        compiled = await self._compile_report(source)
        if not compiled["ok"]:
            return ToolResult(_json({"ok": False, "errors": compiled["errors"]}), True)
        options = dataclasses.replace(
            self.verify_options, trials=1, timed_calls=min(QUICK_CALLS, self.verify_options.timed_calls),
            warmup=min(QUICK_WARMUP, self.verify_options.warmup),
            baselines=tuple(b for b in self.verify_options.baselines if b == "eager"))
        outcome = VerifyOutcome.of(await self._run_job(verify_job, options, source), for_reward=True)
        report = outcome.report
        timed = report.timing.candidate if report is not None and report.timing is not None else None
        shown = {"ok": outcome.verdict == "verified", "correct": bool(report and report.correctness.passed),
                 "median_ms": timed.median_ms if timed else None,
                 "speedup_eager": report.speedup.get("eager") if report else None, "summary": outcome.summary,
                 "problems": [_problem(f) for f in outcome.findings if f.severity == Severity.ERROR][:MAX_PROBLEMS],
                 "note": "a quick measurement (1 trial, few calls), not a verification"}
        return ToolResult(_json(shown), worker_jobs=1)

    async def probe(self, arguments: dict[str, Any]) -> ToolResult:
        """A cheap experiment on inputs the model chose: the reference's get_inputs (and get_init_inputs) replaced,
        in the job only, by its expressions; one trial, no timing, no baselines; not a node."""
        expressions = {name: arguments.get(name) for name in ("inputs", "init_inputs")}
        if not isinstance(expressions["inputs"], str) or not expressions["inputs"].strip():
            return _error("give `inputs`: a Python expression for the list of forward's inputs")
        for name, expression in expressions.items():
            if expression is None:
                continue
            if not isinstance(expression, str):
                return _error(f"`{name}` must be a string holding a Python expression")
            try:
                ast.parse(expression.strip(), mode="eval")
            except SyntaxError as exc:
                return _error(f"`{name}` is not a Python expression: {exc.msg}")
        source = self.state.source
        compiled = await self._compile_report(source)
        if not compiled["ok"]:
            return ToolResult(_json({"ok": False, "errors": compiled["errors"]}), True)
        reference = _read(self.reference) + "\n\n# kernel-lsp probe: the inputs the model chose\nimport torch\n"
        reference += f"\n\ndef get_inputs():\n    return list({expressions['inputs'].strip()})\n"
        if expressions["init_inputs"] is not None:
            reference += f"\n\ndef get_init_inputs():\n    return list({expressions['init_inputs'].strip()})\n"
        result = await self._run_job(verify_job, self._one_trial_options(), source, {self.reference: reference})
        outcome = VerifyOutcome.of(result, for_reward=True)
        shown = {"ok": outcome.finished, "outputs_match": bool(outcome.report and outcome.report.correctness.passed),
                 "problems": [_problem(f) for f in outcome.findings if f.severity == Severity.ERROR][:MAX_PROBLEMS],
                 "printed": _tail(str(result.artifacts.get("stdout") or ""), PRINTED_CHARS),
                 "note": "a probe on your inputs (1 trial, no timing), not a verification"}
        if not outcome.finished:
            shown["summary"] = _cut(outcome.summary)
        return ToolResult(_json(shown), worker_jobs=1)

    async def static_facts(self, _arguments: dict[str, Any]) -> ToolResult:
        """The static profile (nvcc's ptxas figures and SASS) of the current candidate, on the worker."""
        options = ProfileOptions(device="cpu", allow_network=self.verify_options.allow_network)
        outcome = ProfileOutcome.of(await self._run_job(profile_job, options, self.state.source))
        if outcome.report is None:
            return ToolResult(_json({"ok": False, "error": _cut(outcome.error or "no report")}), True, worker_jobs=1)
        return ToolResult(_json(static_feedback(outcome.report)), worker_jobs=1)

    async def profile(self, _arguments: dict[str, Any]) -> ToolResult:
        """Two stages on a GPU: ncu with the sections that classify each kernel (its bound), then with the analyses
        that fit the bounds found (profilers.ncu.sections_for_bounds); the second run's report is the answer. A
        pass on the CPU (the static profile) and a first stage that classified nothing take one run."""
        if not self.profile_ready():
            return _error(PROFILE_NOT_READY)
        options = self._profile_options()
        staged = options.device != "cpu"
        first = ProfileOutcome.of(await self._run_job(profile_job, dataclasses.replace(
            options, sections=CLASSIFY_SECTIONS) if staged else options, self.state.source))
        if first.report is None:
            return ToolResult(_json({"ok": False, "error": _cut(first.error or "no report")}), True, worker_jobs=1)
        bounds = {k.name: k.bound for k in first.report.kernels if k.bound}
        if not staged or not bounds:
            return ToolResult(_json(profile_feedback(first.report)), worker_jobs=1,
                              energy=rubric_energy(first.report))
        sections = sections_for_bounds(set(bounds.values()))
        second = ProfileOutcome.of(await self._run_job(profile_job, dataclasses.replace(options, sections=sections),
                                                       self.state.source))
        report = second.report if second.report is not None else first.report
        shown = profile_feedback(report)
        shown["stages"] = {"bounds": bounds, "sections": list(sections)}
        if second.report is None:
            shown["problems"].append(_cut(f"the second stage failed ({second.error or 'no report'}): the hints are "
                                          "the first stage's"))
        return ToolResult(_json(shown), worker_jobs=2, energy=rubric_energy(report))

    def _profile_options(self) -> ProfileOptions:
        """The pass's device (a pass on the CPU gets the static profile, not the GPU's) and network setting."""
        return ProfileOptions(device=self.verify_options.device, allow_network=self.verify_options.allow_network)

    async def search_cutlass(self, arguments: dict[str, Any]) -> ToolResult:
        """KernelPro's code search over the installed CUTLASS/CuTe headers and examples (agent/code_search.py)."""
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return _error("give `query`: a few words to look for in the CUTLASS/CuTe sources")
        headers = cutlass_headers(self.settings.compile.cutlass_include)
        if headers is None:
            return _error(cutlass_problem(self.settings.compile.cutlass_include))
        found = await asyncio.to_thread(code_search.search, code_search.search_roots(Path(headers.include)), query)
        return _ok({"query": query, "root": headers.include,
                    "snippets": [{"path": s.path, "line": s.line, "text": s.text} for s in found],
                    **({} if found else {"note": "nothing matched: try other words"})})

    async def finish(self, arguments: dict[str, Any]) -> ToolResult:
        self.state.finished = str(arguments.get("summary") or "")
        return _ok({"finished": True})

    # --- helpers ---------------------------------------------------------------------------------------

    def scratch_path(self) -> Path:
        """A hidden name beside the original, for a job built from a text: relative loads and imports resolve as
        they would for the original. Nothing is written there."""
        number = next(self._scratch_numbers)
        return self.original.parent / f".{self.original.stem}.kernel-lsp-agent-{self.pass_id}-{number}.py"

    async def _run_job(self, build: Callable[..., Job], options: Any, source: str,
                       texts: Mapping[Path, str] | None = None) -> Result:
        """`build` (verify_job, profile_job) on `source` under a hidden name beside the original, run on the worker;
        `texts`: other files' texts for the job only (the probe's reference)."""
        path = self.scratch_path()
        return await self.worker.run(build(path, self.reference, options, {**(texts or {}), path: source}))

    def _one_trial_options(self) -> VerifyOptions:
        """A verify job that only runs the candidate: one trial, no warm-up, no timing, no baselines."""
        return dataclasses.replace(self.verify_options, trials=1, timing=False, warmup=0, baselines=())

    async def _compile_report(self, source: str) -> dict[str, Any]:
        """Python syntax, ModelNew defined, the load_inline CUDA built by nvcc; imports resolvable here (notes)."""
        model = parse_python(source)
        if model.syntax_error is not None:
            error = model.syntax_error
            return {"ok": False, "errors": [{"line": error.range.start.line + 1, "code": "python-syntax",
                                             "message": error.message}]}
        errors = [] if model.kernelbench.model_new is not None else [{"line": None, "code": "no-model-new",
                                                                      "message": "ModelNew is not defined"}]
        findings = await self._compile_findings(source) if model.extensions else []
        errors += [_problem(f) for f in findings if f.severity == Severity.ERROR and f.code not in ENVIRONMENT_CODES]
        notes = [f"not compiled here: {_cut(f.message)}" for f in findings if f.code in ENVIRONMENT_CODES]
        notes += [f"module {name!r} is not importable here (the worker's environment may differ)"
                  for name in sorted(_missing_imports(source))]
        warnings = [_problem(f) for f in findings if f.severity == Severity.WARNING]
        report: dict[str, Any] = {"ok": not errors, "errors": errors[:MAX_PROBLEMS]}
        if len(errors) > MAX_PROBLEMS:
            report["more_errors"] = len(errors) - MAX_PROBLEMS
        return {**report, **({"warnings": warnings[:MAX_PROBLEMS]} if warnings else {}),
                **({"notes": notes} if notes else {})}

    async def _compile_findings(self, source: str) -> list[Finding]:
        # named by the text: the same text compiles from the cache, two texts compiled at once never share a file
        digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        path = self.original.parent / f".{self.original.stem}.kernel-lsp-agent-{self.pass_id}-compile-{digest}.py"
        document = Document(path_to_uri(path), path, source)
        final: list[Finding] = []
        async for report in self.compile_service.run(document, self.settings):
            final = report.findings
        return final


# --- pure parts ----------------------------------------------------------------------------------------------

def apply_line_edits(text: str, edits: Any) -> str:
    """Line edits applied together on `text` (1-based inclusive ranges of the text as it is now)."""
    if not isinstance(edits, list) or not edits:
        raise ValueError("`edits` must be a non-empty list of {start_line, end_line, text}")
    lines = text.splitlines(keepends=True)
    parsed = sorted((_edit(e, len(lines)) for e in edits), key=lambda e: (e[0], e[1]))
    for (start, end, _), (next_start, _, _) in zip(parsed, parsed[1:]):
        if next_start <= end:
            raise ValueError(f"edits overlap: lines {start}-{end} and a range starting at {next_start}")
    for start, end, new in reversed(parsed):
        replacement = new.splitlines(keepends=True)
        if replacement and not replacement[-1].endswith("\n"):
            replacement[-1] += "\n"
        lines[start - 1:end] = replacement
    return "".join(lines)


def _edit(edit: Any, line_count: int) -> tuple[int, int, str]:
    if not isinstance(edit, dict):
        raise ValueError("each edit must be an object {start_line, end_line, text}")
    start, end, text = edit.get("start_line"), edit.get("end_line"), edit.get("text")
    if not isinstance(start, int) or not isinstance(end, int) or not isinstance(text, str):
        raise ValueError("each edit needs integer start_line and end_line and a string text")
    if not 1 <= start <= line_count + 1 or not start - 1 <= end <= line_count:
        raise ValueError(f"edit lines {start}-{end} are outside the candidate's 1-{line_count}")
    return start, end, text


def kernel_structure(source: str) -> tuple[str, ...]:
    """The candidate's kernels, each as its name and signature: what must stay put before profiling pays."""
    model = parse_python(source)
    parts = [" ".join(_range_text(source, k.def_range).split()) for k in [*model.triton_kernels, *model.cute_kernels]]
    for extension in model.extensions:
        for string in extension.cuda_sources:
            parts += [" ".join(_range_text(string.text, k.signature_range).split()) for k in find_kernels(string.text)]
    return tuple(sorted(parts))


def verify_evaluation(source: str, result: Result) -> dict[str, Any]:
    """What the tree and the rubric record of one verify job (kernel_lsp.agent.rubric's evaluation): only the
    worker's verdict and report count."""
    outcome = VerifyOutcome.of(result, for_reward=True)
    return {"compile": {"compiled": True, "errors": 0}, "verdict": outcome.verdict, "summary": outcome.summary,
            "report": encode(outcome.report) if outcome.report is not None else None,  # kept as the trajectory's JSON
            "problems": [_problem(f) for f in outcome.findings if f.severity == Severity.ERROR][:MAX_PROBLEMS],
            "structure": list(kernel_structure(source))}


def compile_failure_evaluation(source: str, compiled: dict[str, Any]) -> dict[str, Any]:
    first = compiled["errors"][0]
    where = f"line {first['line']}: " if first.get("line") else ""
    return {"compile": {"compiled": False, "errors": len(compiled["errors"]) + compiled.get("more_errors", 0),
                        "first_error": where + first["message"]},
            "verdict": None, "summary": f"compile error: {where}{first['message']}", "report": None,
            "problems": compiled["errors"], "structure": list(kernel_structure(source))}


def candidate_ms(evaluation: dict[str, Any]) -> float | None:
    """The verified candidate's median time, None when it was not verified, not timed, or compute-sanitizer found
    errors in it."""
    if evaluation.get("verdict") != "verified" or safety.sanitizer_errors(evaluation):
        return None
    timing = candidate_timing(evaluation)
    return timing.median_ms if timing is not None else None


def verify_feedback(evaluation: dict[str, Any]) -> dict[str, Any]:
    report = report_of(evaluation)
    shown: dict[str, Any] = {"verdict": evaluation["verdict"] or "compile-error", "summary": evaluation["summary"],
                             "problems": evaluation["problems"]}
    errors = safety.sanitizer_errors(evaluation)
    if errors:  # correct on every trial, but its kernels read or write what they must not: a reject
        shown.update(verdict="rejected", summary=rubric.unsafe_reason(errors))
    elif evaluation["verdict"] == "verified":
        shown.update(speedup=dict(report.speedup) if report else None, median_ms=candidate_ms(evaluation))
    shown.update(safety.feedback(evaluation.get("sanitize")))
    integrity = [problem.code for problem in report.integrity] if report else []
    if integrity:
        shown["integrity"] = integrity
        shown["note"] = "an integrity reject scores zero: the candidate must compute the result itself"
    return shown


def static_feedback(report: ProfileReport) -> dict[str, Any]:
    kernels = []
    for kernel in report.kernels:
        ptxas = kernel.metrics.ptxas
        kernels.append({"name": kernel.name, "ptxas": encode(ptxas) if ptxas is not None else None,
                        "sass": encode(kernel.sass) if kernel.sass is not None else None, "line": kernel.line,
                        "hints": [{"code": h.code, "line": h.line, "message": _cut(h.message)}
                                  for h in _largest_gains(kernel.findings)]})
    problems = [_cut(p.message) for p in report.problems if p.code not in NOTE_CODES]  # asked for: no news
    return {"ok": bool(kernels), "kernels": kernels, "problems": problems}


def profile_feedback(report: ProfileReport) -> dict[str, Any]:
    kernels = []
    for kernel in report.kernels:
        kernels.append({"name": kernel.name, "bound": kernel.bound, "duration_ms": kernel.duration_ms,
                        "registers": kernel.registers, "occupancy_pct": kernel.occupancy_pct,
                        "hints": [{"code": h.code, "line": h.line, "message": _cut(h.message),
                                   "estimated_speedup": h.estimated_speedup} for h in _largest_gains(kernel.findings)]})
    shown = {"ok": bool(kernels), "kernels": kernels, "problems": [_cut(p.message) for p in report.problems]}
    energy = rubric_energy(report)
    if energy:
        shown["energy"] = energy
    return shown


def _largest_gains(hints: list[ProfileHint]) -> list[ProfileHint]:
    return sorted(hints, key=lambda h: -(h.estimated_speedup or 0.0))[:MAX_HINTS]


def rubric_energy(report: ProfileReport) -> dict[str, float] | None:
    """The candidate's and the reference's energy per forward call from one profile run, when both were read."""
    if report.energy is None or report.reference_energy is None:
        return None
    return {"candidate_mj_per_call": report.energy.mj_per_call,
            "reference_mj_per_call": report.reference_energy.mj_per_call}


def numbered_source(source: str) -> str:
    """The source with its line numbers, as read_candidate shows it (and the expansion prompt, its start's)."""
    return "\n".join(f"{number:4d}| {line}" for number, line in enumerate(source.splitlines(), 1))


def _problem(finding: Finding) -> dict[str, Any]:
    return {"line": finding.range.start.line + 1, "code": finding.code, "message": _cut(finding.message)}


def _missing_imports(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
    return {name for name in names if importlib.util.find_spec(name) is None}


def _range_text(text: str, span) -> str:
    lines = text.splitlines()
    start, end = span.start, span.end
    if start.line == end.line:
        return lines[start.line][start.character:end.character]
    middle = lines[start.line + 1:end.line]
    return "\n".join([lines[start.line][start.character:], *middle, lines[end.line][:end.character]])


def _cut(message: str) -> str:
    message = " ".join(str(message).split())
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 3] + "..."


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "..." + text[-(chars - 3):]


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _ok(value: dict[str, Any]) -> ToolResult:
    return ToolResult(_json(value))


def _error(message: str) -> ToolResult:
    return ToolResult(_json({"error": message}), is_error=True)


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")
