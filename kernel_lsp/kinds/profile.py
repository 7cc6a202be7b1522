"""The "profile" job kind, both sides: a candidate's ProfileReport (ncu, SASS, reference kernels, energy on a GPU;
the static profile of ptxas and SASS without one).

Client side (server, CLI, agent): `profile_options`, `profile_job` (the same files as a "verify" job, gathered by
jobs.files, from disk or from unsaved texts) and `ProfileOutcome.of`. Worker side: `handle`, registered under
"profile" by kernel_lsp/commands/worker.py; the work itself is kernel_lsp/profile/worker_job.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.config import Settings
from kernel_lsp.contracts.profile_report import ProfileReport
from kernel_lsp.findings import Finding
from kernel_lsp.jobs.cache import cache_key
from kernel_lsp.jobs.files import JOB_KEYS, gather_files
from kernel_lsp.contracts.options import ProfileOptions, coerce, from_config, to_config
from kernel_lsp.profile.report import received_metrics, summary_line
from kernel_lsp.profile.worker_job import profile_result
from kernel_lsp.worker.jobs import JobContext, on_device
from kernel_lsp.worker.protocol import Job, Result

KIND = "profile"


def profile_options(settings: Settings, **overrides: Any) -> ProfileOptions:
    """The settings' entries that apply to profiling (the candidate's network), then `overrides`."""
    return dataclasses.replace(ProfileOptions(allow_network=settings.verify.allow_network), **overrides)


def profile_job(candidate: Path, reference: Path | None, options: ProfileOptions | Mapping[str, Any],
                texts: Mapping[Path, str] | None = None) -> Job:
    """The "profile" job: the candidate's files (jobs.files.gather_files; `texts` overrides disk), its reference's
    (None: the candidate defines Model itself, or has none) and the options (ProfileOptions, or their camelCase
    config entries: `{"launchCount": 1}`)."""
    options = coerce(ProfileOptions, options)
    files = gather_files(candidate, reference, texts)
    config = files.config(to_config(options))
    return Job(KIND, files.texts, config, cache_key(KIND, files.texts, config))


@dataclass(frozen=True)
class ProfileOutcome:
    """A finished "profile" job as the server, the CLI and the agent read it."""

    report: ProfileReport | None  # decoded where it arrives (received_metrics); None: the job did not finish
    summary: str  # one line: the source (ncu or static) and each kernel's bound, or why there is no report
    findings: list[Finding]  # the hints on the kernels' lines, and the candidate's own crash (run-*)
    error: str | None  # why the job did not finish

    @classmethod
    def of(cls, result: Result) -> ProfileOutcome:
        """The job's result as it arrives: its report decoded once (one a worker of another version sent in
        another form keeps what it can and says the rest in a `profile-contract` problem)."""
        findings = [Finding.from_dict(f) for f in result.findings]
        if result.status != "ok":
            error = f"the profile job {result.status}: {result.error or 'no message'}"
            return cls(None, error, findings, error)
        metrics = received_metrics(result.metrics)
        return cls(metrics.profile, metrics.summary or summary_line(metrics.profile), findings, None)

    def run_failures(self) -> list[str]:
        """The candidate's own crash or hang while it was measured (run-* findings), as messages."""
        return [f.message for f in self.findings if f.code.startswith("run-")]


async def handle(job: Job, context: JobContext) -> Result:
    """On a GPU, holding the GPU slot: ncu, SASS, reference kernels and energy; the static profile without one."""
    try:
        options = from_config(ProfileOptions, job.config, ignore=JOB_KEYS)
    except ValueError as exc:
        return Result("failed", [], {}, {}, str(exc))
    await context.startup.wait()
    on_gpu = options.device != "cpu" and context.startup.cuda_available
    return await on_device(context, on_gpu, lambda: profile_result(job, options, context, on_gpu))
