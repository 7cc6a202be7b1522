"""The SanitizeReport: what a "sanitize" job's result carries in `metrics.sanitize` (profile/sanitize.sanitize_report
builds it in the worker; kinds.sanitize.SanitizeOutcome decodes it in the server, the CLI and the agent), and the
shared-memory check's answer, which the sandboxed driver writes as JSON for the worker to read. Defined once, here;
`contracts.codec` decodes a received dict into these classes (refusing unknown keys and wrong types, naming them)
and encodes them back under the wire's names (camelCase where the report always had them: `wallS`, `timedOut`).

Problems carry a code (what a reader branches on) and a message (what a person reads), as a profile's do.
Stdlib only, as the other contracts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SanitizeProblem:
    code: str  # one of PROBLEM_CODES
    message: str  # a sentence for a person: never compared by code that reads it


# code -> what it means (docs/reference/findings.md lists them, generated from it)
PROBLEM_CODES: dict[str, str] = {
    "sanitize-tool-missing": "no compute-sanitizer was found (its message says where it was looked for)",
    "sanitize-cannot-run": "compute-sanitizer could not be started",
    "sanitize-warm-timeout": "the warm call (build, load, one forward) or the program's plain run ran past its time",
    "sanitize-build-failed": "the candidate's extension or program did not build (or nvcc could not run): nothing "
                             "was sanitized",
    "sanitize-warm-failed": "the candidate's warm call failed (the tools still run: memcheck explains crashes)",
    "sanitize-worker-package": "a package the candidate imports is missing where the worker runs (the message gives "
                               "its install command): the environment's problem, not the candidate's; nothing was "
                               "sanitized",
    "sanitize-bad-header": "a `// kernel-lsp:` header line of a program does not parse",
    "sanitize-program-shared-init": "shared-init checks a candidate's forward call, not a standalone program",
    "sanitize-tool-stopped": "a tool ran past sanitizeTimeoutS and was stopped: what it printed is kept",
    "sanitize-no-summary": "a tool printed no summary line: its output was cut short",
    "sanitize-tool-complaint": "compute-sanitizer could not check the program (\"Device not supported\", ...)",
    "sanitize-program-failed": "the program failed under a tool that found no error in any kernel",
    "sanitize-no-answer": "the shared-memory check wrote no answer",
    "sanitize-fill-failed": "the shared-memory check could not run its fill or the forward call raised under it",
    "sanitize-nondeterministic": "the output changed between two runs with the same shared-memory fill",
}


@dataclass(frozen=True)
class Site:
    """Where an access happened (profilers.sanitizer.Site on the wire)."""

    symbol: str
    kernel: str  # the base name
    offset: str | None
    file: str | None
    line: int | None


@dataclass(frozen=True)
class SanitizerErrorEntry:
    """One error a tool printed (profilers.sanitizer.SanitizerError on the wire, with its sentence)."""

    tool: str
    kind: str  # out-of-bounds, misaligned, invalid-access, race, uninitialized, barrier, api-error, other
    title: str
    severity: str
    site: Site | None
    other: Site | None  # a race's second access
    space: str | None
    access: str | None
    other_access: str | None
    size: int | None
    thread: tuple[int, ...] | None
    block: tuple[int, ...] | None
    address: str | None
    relation: str | None
    hazards: int | None
    message: str  # SanitizerError.describe()


@dataclass(frozen=True)
class FirstDependent:
    output: int  # which output leaf
    index: int  # its first element that followed the fill


@dataclass(frozen=True)
class SharedInitAnswer:
    """The shared-memory check's answer (profile/shared_init.run_check), as the driver writes it: counts over the
    outputs, or only `problem` when the fill or the forward call could not run."""

    elements: int = 0
    dependent: int = 0  # stable per pattern, different between patterns: read shared memory nobody wrote
    unstable: int = 0  # changed under one pattern: the output is not deterministic
    first: FirstDependent | None = None
    problem: str | None = None
    patterns: tuple[str, ...] | None = None  # the fill words, '0x...'
    fill_bytes: int | None = None


@dataclass(frozen=True)
class ToolRunReport:
    """One tool's run."""

    tool: str
    wall_s: float
    timed_out: bool
    problem: SanitizeProblem | None  # why the run proves nothing clean
    complete: bool
    reported: int | None  # the count in the tool's summary (shared-init: the dependent elements)
    not_printed: bool  # the print limit was reached
    notes: tuple[str, ...]  # failed CUDA calls it reported (no kernel site), the first ten
    errors: tuple[SanitizerErrorEntry, ...]
    shared_init: SharedInitAnswer | None = None  # shared-init's answer, for that check only (else absent)


@dataclass(frozen=True)
class WarmCall:
    """The warm call (a candidate's build, load and one forward; a program's plain run)."""

    exit_code: int | None
    timed_out: bool
    wall_s: float
    tail: str  # the end of its output


@dataclass(frozen=True)
class SanitizeReport:
    tools: tuple[ToolRunReport, ...]
    warm: WarmCall | None
    problems: tuple[SanitizeProblem, ...]  # what kept the job from running a tool, or from running all of them
    library: tuple[SanitizerErrorEntry, ...]  # errors in kernels not the candidate's own
    errors: int  # the errors on the candidate's own lines
    runtime: tuple[str, ...]  # a standalone program's plain run: its errors' messages
    clean: bool  # every tool ran to its end and found nothing of the candidate's
