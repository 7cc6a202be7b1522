"""The "sanitize" job kind, both sides: a candidate under compute-sanitizer (memcheck, racecheck, initcheck,
synccheck) and kernel-lsp's own shared-memory check (shared-init), its errors as findings on the user's lines.

Client side (server, CLI, agent): `SanitizeOptions`, `sanitize_job` (the same files as a "verify" job, gathered by
jobs.files, from disk or from unsaved texts) and `SanitizeOutcome.of`. Worker side: `handle`, registered under
"sanitize" by kernel_lsp/commands/worker.py; the work itself is kernel_lsp/profile/sanitize.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lsp.config import Settings
from kernel_lsp.findings import Finding
from kernel_lsp.jobs.cache import cache_key
from kernel_lsp.jobs.files import JOB_KEYS, gather_files
from kernel_lsp.contracts.codec import ContractError, decode, encode
from kernel_lsp.contracts.options import coerce, from_config, limit_problems, to_config
from kernel_lsp.contracts.job_metrics import SanitizeMetrics
from kernel_lsp.contracts.sanitize_report import SanitizeReport
from kernel_lsp.profile.sanitize import (
    CHECKS,
    DEFAULT_TOOL_TIMEOUT_S,
    NO_GPU,
    NO_GPU_CODE,
    WARM_TIMEOUT_S,
    SanitizePlan,
    run_sanitizer,
    sanitize_findings,
    sanitize_report,
    summary_line,
)
from kernel_lsp.profile.worker_job import candidate_files
from kernel_lsp.worker.jobs import JobContext, on_device
from kernel_lsp.worker.protocol import Job, Result

KIND = "sanitize"
SANITIZER_CODES = tuple(f"sanitizer-{tool}" for tool in CHECKS)


@dataclass(frozen=True)
class SanitizeOptions:
    """What a caller may set on a "sanitize" job."""

    tools: tuple[str, ...] = CHECKS  # in this order; each tool is one forward call under compute-sanitizer
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S  # per tool: a sanitized run is 10-100x slower than a plain one
    print_limit: int = 100  # errors each tool prints at most (its summary still counts them all)
    allow_network: bool = False  # as VerifyOptions.allow_network
    limits: dict[str, Any] = field(default_factory=dict)  # wallTimeS: the warm call (build and one forward)

    def __post_init__(self) -> None:
        problems = []
        unknown = [tool for tool in self.tools if tool not in CHECKS]
        if unknown or self.tools == ():
            problems.append(f"tools: expected some of {', '.join(CHECKS)}, got {list(self.tools)!r}")
        if not self.timeout_s > 0:
            problems.append(f"timeoutS: must be more than 0, got {self.timeout_s!r}")
        problems += limit_problems(self.limits)
        if problems:
            raise ValueError(f"invalid sanitize options: {'; '.join(problems)}")


def sanitize_options(settings: Settings, **overrides: Any) -> SanitizeOptions:
    """The settings' entries that apply (sanitizeTools, sanitizeTimeoutS, the candidate's network), then
    `overrides`."""
    values: dict[str, Any] = {"tools": settings.sanitize.tools, "timeout_s": settings.sanitize.timeout_s,
                              "allow_network": settings.verify.allow_network}
    return SanitizeOptions(**{**values, **overrides})


def client_timeout_s(options: SanitizeOptions, settings: Settings) -> float:
    """A client's limit on a whole sanitize job: the worker's own (the warm call's, then each tool's), never less
    than jobTimeoutS. Four tools at their default 300 s each are past the 600 s of a verification."""
    warm = float(options.limits.get("wallTimeS", WARM_TIMEOUT_S))
    return max(settings.worker.job_timeout_s, warm + len(options.tools) * float(options.timeout_s) + 60.0)


def sanitize_job(candidate: Path, reference: Path | None, options: SanitizeOptions | Mapping[str, Any],
                 texts: Mapping[Path, str] | None = None) -> Job:
    """The "sanitize" job: the candidate's files, its reference's (for get_inputs; None: the candidate defines
    them) and the options (SanitizeOptions, or their camelCase config entries: `{"tools": ["memcheck"]}`)."""
    options = coerce(SanitizeOptions, options)
    files = gather_files(candidate, reference, texts)
    config = files.config(to_config(options))
    return Job(KIND, files.texts, config, cache_key(KIND, files.texts, config))


@dataclass(frozen=True)
class SanitizeOutcome:
    """A finished "sanitize" job as the server, the CLI and the agent read it."""

    report: SanitizeReport | None  # tools (each run's errors), library, problems, errors, clean; None: no result
    summary: str
    findings: list[Finding]  # sanitizer-<tool> on the user's lines, sanitizer-library once
    error: str | None  # why the job did not finish, or why nothing could be sanitized (no GPU, no tool)
    code: str | None = None  # the failed job's Result.code: NO_GPU_CODE, "unknown-job-kind", ...

    @classmethod
    def of(cls, result: Result) -> SanitizeOutcome:
        findings = [Finding.from_dict(f) for f in result.findings]
        if result.status != "ok":
            error = f"the sanitize job {result.status}: {result.error or 'no message'}"
            return cls(None, error, findings, error, result.code)
        try:
            metrics = decode(SanitizeMetrics, result.metrics)
        except ContractError as exc:  # a worker of another version
            error = f"the worker's sanitize report is not in the form this client reads: {exc}"
            return cls(None, error, findings, error, "sanitize-contract")
        report = metrics.sanitize
        error = None if report.tools else ("; ".join(p.message for p in report.problems) or "no tool ran")
        return cls(report, metrics.summary, findings, error)

    @property
    def user_errors(self) -> list[Finding]:
        """The errors on the user's own lines (what makes a candidate unsafe; a standalone program's failed run)."""
        return [f for f in self.findings if f.code in (*SANITIZER_CODES, "program-error") and f.severity == 1]

    @property
    def clean(self) -> bool:
        return bool(self.report and self.report.clean)


async def handle(job: Job, context: JobContext) -> Result:
    """On a GPU, holding the GPU slot: the warm call, then each tool. Without one: a failed result saying so."""
    try:
        options = from_config(SanitizeOptions, job.config, ignore=JOB_KEYS)
    except ValueError as exc:
        return Result("failed", [], {}, {}, str(exc))
    await context.startup.wait()
    if not context.startup.cuda_available:
        return Result("failed", [], {}, {}, NO_GPU, NO_GPU_CODE)
    return await on_device(context, True, lambda: sanitize_result(job, options, context))


async def sanitize_result(job: Job, options: SanitizeOptions, context: JobContext) -> Result:
    config = job.config
    candidate = config["candidate"]
    origins = config.get("origins") or {}
    plan = SanitizePlan(candidate=candidate, reference=config.get("reference"), tools=options.tools,
                        tool_timeout_s=float(options.timeout_s), print_limit=options.print_limit,
                        warm_timeout_s=float(options.limits.get("wallTimeS", WARM_TIMEOUT_S)),
                        allow_network=options.allow_network, origins=origins)
    run = await run_sanitizer(plan, job.source_files, context.cache_dir, context.progress)
    own_files = candidate_files(job)
    findings, library = sanitize_findings(run, job.source_files, own_files, origins, candidate)
    report = sanitize_report(run, findings, library)
    metrics = SanitizeMetrics(report, summary_line(run, findings, library))
    return Result("ok", [f.to_dict() for f in findings], encode(metrics), {})
