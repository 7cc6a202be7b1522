"""The "verify" job kind, both sides: a candidate's verdict against its reference.

Client side (server, CLI, agent): `verify_options` (the settings as VerifyOptions), `verify_job` (the job, its files
gathered by jobs.files from disk or from unsaved texts) and `VerifyOutcome.of` (a finished job as verdict,
one-line summary, report and findings). Worker side: `handle`, registered under "verify" by
kernel_lsp/commands/worker.py; it runs kernel_lsp.verify.run:verify_candidate in a sandboxed child and turns the
report into findings (kernel_lsp.verify.verdict).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.config import Settings
from kernel_lsp.contracts.codec import ContractError, decode, decode_verify_report, encode
from kernel_lsp.contracts.job_metrics import Verdict, VerifyMetrics
from kernel_lsp.contracts.verify_report import Unavailable, VerifyReport
from kernel_lsp.findings import Finding, Range, Severity, path_to_uri
from kernel_lsp.jobs.cache import cache_key
from kernel_lsp.jobs.files import JOB_KEYS, gather_files
from kernel_lsp.contracts.options import VerifyOptions, coerce, from_config, to_config, verify_limits
from kernel_lsp.verify.verdict import REWARD_REJECTS, report_findings
from kernel_lsp.verify.verdict import summary as verdict_summary
from kernel_lsp.worker.jobs import (SOURCE, JobContext, missing_package, on_device, sandbox_limits,
                                    sandbox_run_finding)
from kernel_lsp.worker.protocol import Job, Result
from kernel_lsp.worker.sandbox import SandboxRun, SandboxTask

KIND = "verify"


def verify_options(settings: Settings, unattended: bool = False, **overrides: Any) -> VerifyOptions:
    """The settings' verify entries as the job's options (the one place their names map), then `overrides`. The
    sandbox's wall time is a share of jobTimeoutS, so that it, not the client, ends a run that never finishes.
    `unattended`: for the agent, bench and campaign, which run many candidates no one reads first: they refuse to
    run one without its sandbox when requireIsolation is on (a person verifying one gets the warning instead)."""
    v = settings.verify
    options = VerifyOptions(device=v.device, trials=v.trials, timed_calls=v.timed_calls, warmup=v.warmup_calls,
                            baselines=v.baselines, allowed_kernels=v.allowed_kernels, allow_network=v.allow_network,
                            require_isolation=unattended and v.require_isolation, hang_timeout_s=v.hang_timeout_s,
                            limits=verify_limits(settings.worker.job_timeout_s),
                            tolerances={dtype: dict(t) for dtype, t in v.tolerances.items()})
    return dataclasses.replace(options, **overrides)


def verify_job(candidate: Path, reference: Path, options: VerifyOptions | Mapping[str, Any],
               texts: Mapping[Path, str] | None = None) -> Job:
    """The "verify" job for one candidate: its files (jobs.files.gather_files; `texts` overrides disk) and the
    options (VerifyOptions, or their camelCase config entries: `{"timedCalls": 5}`)."""
    options = coerce(VerifyOptions, options)
    files = gather_files(candidate, reference, texts)
    config = {**to_config(options), "candidate": files.candidate, "reference": files.reference,
              "origins": files.origins}
    return Job(KIND, files.texts, config, cache_key(KIND, files.texts, config))


@dataclass(frozen=True)
class VerifyOutcome:
    """A finished "verify" job as the server, the CLI, bench and the agent read it."""

    verdict: str  # verified | rejected | unavailable (also: the job did not finish)
    summary: str  # the one line a code lens shows: 'correct 5/5 · 1.84× eager · 3.1 ms', or why not
    report: VerifyReport | None  # the VerifyReport (contracts.verify_report), None without one
    findings: list[Finding]
    finished: bool  # the worker ran the job to the end (False: it failed, timed out, was cancelled)

    @classmethod
    def of(cls, result: Result, for_reward: bool = False) -> VerifyOutcome:
        """With for_reward (the agent, bench, campaign), a verified candidate with a REWARD_REJECTS finding
        (integrity-library-work, a warning for a person) is rejected."""
        findings = [Finding.from_dict(f) for f in result.findings]
        if result.status != "ok":
            message = f"job {result.status}: {result.error or 'no message'}"
            return cls("unavailable", message, None, findings, False)
        try:
            metrics = decode(VerifyMetrics, result.metrics)
        except ContractError as exc:  # a worker of another version, say: its verdict cannot be read
            message = f"the worker's report does not match this version's contract: {exc}"
            return cls("unavailable", message, None, findings, False)
        verdict, summary, report = metrics.verdict, metrics.summary or metrics.verdict, metrics.report
        rejects = [f for f in findings if f.code in REWARD_REJECTS]
        if for_reward and verdict == "verified" and rejects:
            findings = [dataclasses.replace(f, severity=Severity.ERROR) if f in rejects else f for f in findings]
            verdict, summary = "rejected", f"rejected · {rejects[0].code} (verified for a person: {summary})"
        return cls(verdict, summary, report, findings, True)

    def reason(self) -> str:
        """Why the candidate is not verified, in one line: the first error's code and message, else the summary."""
        errors = [f for f in self.findings if f.severity == Severity.ERROR] or self.findings
        if self.finished and errors:
            return f"{errors[0].code}: {' '.join(errors[0].message.split())}"
        return self.summary


# ---- the worker's side ---------------------------------------------------------------------------------------


async def handle(job: Job, context: JobContext) -> Result:
    """A candidate's verdict against its reference; GPU runs wait for the GPU slot, so timings never share it."""
    try:
        options = from_config(VerifyOptions, job.config, ignore=JOB_KEYS)
    except ValueError as exc:
        return Result("failed", [], {}, {}, str(exc))
    await context.startup.wait()
    on_gpu = options.device == "cuda" or (options.device == "auto" and context.startup.cuda_available)
    return await on_device(context, on_gpu, lambda: _verify(job, options, context, on_gpu))


async def _verify(job: Job, options: VerifyOptions, context: JobContext, on_gpu: bool) -> Result:
    config = job.config
    origins = config.get("origins") or {}
    candidate = config["candidate"]
    task = SandboxTask(entry="kernel_lsp.verify.run:verify_candidate", files=job.source_files, origins=origins,
                       args={"reference": config["reference"], "candidate": candidate, "options": to_config(options),
                             "cache_dir": str(context.cache_dir), "files": job.source_files, "uses_cuda": on_gpu})
    await context.progress(f"verifying {candidate} against {config['reference']}")
    ran = await context.sandbox.run(task, sandbox_limits(options.limits))
    uri = path_to_uri(origins.get(candidate, candidate))
    missing = missing_package(ran)
    if missing is not None:
        return _unavailable(uri, missing, ran)
    if ran.status == "python-exception" and not any(f.file in set(origins.values()) for f in ran.traceback):
        return _unavailable(uri, f"the verifier itself failed (not your code): {ran.message}", ran)
    if ran.status != "ok":
        return _ended(ran, "rejected", [sandbox_run_finding(ran, task)], {"sandbox_run": ran.to_dict()},
                      reason=f"{ran.status} (see problems)")
    try:
        report = decode_verify_report(ran.value)
    except ContractError as exc:
        report = Unavailable(f"the verifier's report does not match its contract (not your code): {exc}")
    if isinstance(report, Unavailable):
        return _unavailable(uri, report.reason, ran)
    findings = report_findings(report, uri, job.source_files.get(candidate, ""))
    return _ended(ran, report.verdict, findings, {"stdout": ran.stdout[-4000:], "stderr": ran.stderr[-4000:]},
                  report=report)


def _unavailable(uri: str, reason: str, ran: SandboxRun) -> Result:
    """No verdict, and why: one verify-unavailable finding of Information severity, since what is missing (a GPU,
    a package where the worker runs, a reference that works) is the machine's or the setup's, not a fault of the
    candidate, and must not count among the file's errors."""
    finding = Finding(uri, Range.line(0), Severity.INFORMATION, SOURCE, "verify-unavailable", reason)
    return _ended(ran, "unavailable", [finding], {"sandbox_run": ran.to_dict()}, reason=reason)


def _ended(ran: SandboxRun, verdict: Verdict, findings: list[Finding], artifacts: dict[str, Any],
           report: VerifyReport | None = None, reason: str = "") -> Result:
    """The job's Result: its VerifyMetrics, built here alone (the summary from the verdict and the report, else the
    reason), encoded into `metrics`."""
    metrics = VerifyMetrics(verdict, verdict_summary(verdict, report, reason), report, ran.duration_s)
    return Result("ok", [f.to_dict() for f in findings], encode(metrics), artifacts)
