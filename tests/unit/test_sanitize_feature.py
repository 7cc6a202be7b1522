"""The sanitize feature's own logic, without a server or a worker: which findings a finished check may place, what a
check after verification is built from, the keys of content checked, and the feature with a fake worker (a check
replaces its own earlier findings only; a missing GPU is said once after verification)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.sanitize_report import SanitizeReport, ToolRunReport
from kernel_lsp.config import resolve_settings
from kernel_lsp.findings import Finding, Range, Severity, path_to_uri
from kernel_lsp.kinds.sanitize import client_timeout_s, sanitize_job, sanitize_options
from kernel_lsp.kinds.verify import verify_job, verify_options
from kernel_lsp.profile.sanitize import NO_GPU, NO_GPU_CODE
from kernel_lsp.server.diagnostics import DiagnosticStore
from kernel_lsp.server.sanitize_feature import (
    NO_GPU_HERE,
    RecentKeys,
    SanitizeFeature,
    job_texts,
    not_sanitized_reason,
    placeable,
    verified_files,
)
from kernel_lsp.server.settings import SettingsManager
from kernel_lsp.server.work_progress import WorkProgress
from kernel_lsp.verify.pairing import Pairing
from kernel_lsp.worker.protocol import Result

REFERENCE = "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n\n" \
            "def get_inputs():\n    return [torch.randn(4)]\n\ndef get_init_inputs():\n    return []\n"
CANDIDATE = "# kernel-lsp: reference=relu.py\nimport torch\n\nclass ModelNew(torch.nn.Module):\n" \
            "    def forward(self, x):\n        return x\n"


def finding(path: Path, line: int, code: str = "sanitizer-memcheck") -> Finding:
    return Finding(path_to_uri(path), Range.line(line), Severity.ERROR, "kernel-lsp", code, f"{code} on {line}")


def test_recent_keys_forget_the_oldest_first():
    keys = RecentKeys(2)
    keys.add("a")
    keys.add("b")
    keys.add("a")  # used again: the newest
    keys.add("c")
    assert "a" in keys and "c" in keys and "b" not in keys and len(keys) == 2
    keys.discard("a")
    keys.discard("never")
    assert "a" not in keys and len(keys) == 1


def test_a_file_edited_since_the_check_gets_none_of_its_findings(tmp_path: Path):
    candidate, helper, closed = tmp_path / "relu_new.py", tmp_path / "kernels.cu", tmp_path / "other.cu"
    findings = [finding(candidate, 3), finding(helper, 7), finding(closed, 1), finding(candidate, 0, "sanitizer-library")]
    checked = {candidate: "text checked", helper: "cu checked", closed: "closed"}
    placed, held, edited = placeable(findings, checked, {candidate: "text checked", helper: "cu edited since"})
    assert placed == [findings[0], findings[2], findings[3]]  # unchanged, and not open: placed
    assert held == [findings[1]] and edited == [helper.resolve()]
    placed, held, edited = placeable(findings, checked, {candidate: "typed meanwhile", helper: "cu checked"})
    assert held == [findings[0], findings[3]] and edited == [candidate.resolve()]
    assert placeable(findings, checked, {}) == (findings, [], [])


def test_a_check_after_verification_carries_the_texts_verified(tmp_path: Path):
    (tmp_path / "relu.py").write_text(REFERENCE)
    candidate = tmp_path / "relu_new.py"
    candidate.write_text(CANDIDATE)
    settings = resolve_settings()[0]
    verified = verify_job(candidate, tmp_path / "relu.py", verify_options(settings))
    candidate.write_text(CANDIDATE + "# saved again since\n")
    path, reference, texts = verified_files(verified)
    assert (path, reference) == (candidate.resolve(), (tmp_path / "relu.py").resolve())
    job = sanitize_job(path, reference, sanitize_options(settings), texts)
    assert job.kind == "sanitize" and job.source_files == verified.source_files  # what was verified, not the disk
    assert job_texts(job) == {candidate.resolve(): CANDIDATE, (tmp_path / "relu.py").resolve(): REFERENCE}

    same_file = tmp_path / "both.py"
    same_file.write_text(REFERENCE + "\nclass ModelNew(Model):\n    pass\n")
    _, reference, _ = verified_files(verify_job(same_file, same_file, verify_options(settings)))
    assert reference is None  # the candidate is its own reference: the sanitize job gets none


def test_the_client_waits_for_every_tool_and_never_less_than_the_job_timeout():
    settings = resolve_settings({"sanitizeTimeoutS": 100, "jobTimeoutS": 600})[0]
    every = sanitize_options(settings)  # compute-sanitizer's four tools and shared-init
    assert client_timeout_s(every, settings) == 900 + 5 * 100 + 60
    short = sanitize_options(settings, tools=("memcheck",), limits={"wallTimeS": 10})
    assert client_timeout_s(short, settings) == 600


def test_the_reason_without_a_gpu_is_the_workers_sentence_with_the_editors_remedy():
    assert not_sanitized_reason(f"the sanitize job failed: {NO_GPU}", NO_GPU_CODE) == NO_GPU_HERE
    assert NO_GPU_HERE.startswith(NO_GPU) and "the `worker` setting" in NO_GPU_HERE
    # decided by the result's code: the same sentence from elsewhere (a candidate's output) is kept as said
    assert not_sanitized_reason(f"the candidate printed: {NO_GPU}") == f"the candidate printed: {NO_GPU}"
    assert not_sanitized_reason("compute-sanitizer not found") == "compute-sanitizer not found"


# ---- the feature, with a fake worker ------------------------------------------------------------------------


@dataclass
class Document:
    uri: str
    version: int | None
    source: str


class FakeRunner:
    def __init__(self, results: list[Result]) -> None:
        self.results = results
        self.jobs = []
        self.gate: asyncio.Event | None = None  # set: the run waits for it

    async def run(self, job, progress=None, timeout_s=None):
        self.jobs.append(job)
        if self.gate is not None:
            await self.gate.wait()
        return self.results.pop(0)


class FakeWorker:
    def __init__(self, runner: FakeRunner) -> None:
        self.runner = runner
        self.known_status = None

    def client(self, settings):
        return self.runner

    def gpu_missing(self, settings) -> bool:
        """As for a remote worker: known once it connected (WorkerFeature.gpu_missing)."""
        status = self.known_status
        return status is not None and status.state == "connected" and not status.gpu


def feature(tmp_path: Path, results: list[Result], config: dict | None = None):
    settings = SettingsManager(warn=lambda m: None)
    settings.folders = [tmp_path]
    settings.set_client_config(config or {})
    published = []
    store = DiagnosticStore(published.append)
    documents: dict[str, Document] = {}
    told: list[str] = []
    runner = FakeRunner(results)
    worker = FakeWorker(runner)
    sanitize = SanitizeFeature(store, settings, worker, documents=lambda: documents,
                               progress=WorkProgress(None, lambda: False),
                               tell_user=lambda message, kind=None: told.append(message))
    return SimpleNamespace(feature=sanitize, store=store, documents=documents, told=told, runner=runner,
                           worker=worker, published=published)


def ok(findings: list[Finding], summary: str) -> Result:
    report = SanitizeReport((ToolRunReport("memcheck", 1.0, False, None, True, len(findings), False, (), ()),),
                            None, (), (), len(findings), (), not findings)
    return Result("ok", [f.to_dict() for f in findings], {"sanitize": encode(report), "summary": summary})


def candidate_files(tmp_path: Path, text: str = CANDIDATE) -> tuple[Path, str]:
    (tmp_path / "relu.py").write_text(REFERENCE)
    path = tmp_path / "relu_new.py"
    path.write_text(text)
    return path, path_to_uri(path)


async def test_a_check_replaces_its_own_earlier_findings_and_nothing_else(tmp_path: Path):
    path, uri = candidate_files(tmp_path)
    first, second = finding(path, 4), finding(path, 5, "sanitizer-racecheck")
    fake = feature(tmp_path, [ok([first], "errors found: memcheck 1"), ok([second], "errors found: racecheck 1")])
    fake.documents[uri] = Document(uri, 3, CANDIDATE)
    compile_finding = finding(path, 0, "python-syntax")
    fake.store.set(uri, "compile", 3, [compile_finding])

    answer = await fake.feature.sanitize_command((uri,))
    assert answer["status"] == "ok" and answer["findings"] == 1 and answer["summary"] == "errors found: memcheck 1"
    assert fake.runner.jobs[0].kind == "sanitize" and fake.runner.jobs[0].config["reference"] == "relu.py"
    await fake.feature.sanitize_command([{"uri": uri}])
    shown = fake.published[-1]
    assert shown.version == 3 and sorted(str(d.code) for d in shown.diagnostics) == ["python-syntax",
                                                                                    "sanitizer-racecheck"]
    assert fake.store.findings(uri, "compile") == [compile_finding]
    assert fake.told == [f"kernel-lsp: relu_new.py: {s}" for s in ("errors found: memcheck 1",
                                                                 "errors found: racecheck 1")]  # no progress shown


async def test_findings_of_a_text_edited_during_the_check_are_held_back(tmp_path: Path):
    path, uri = candidate_files(tmp_path)
    fake = feature(tmp_path, [ok([finding(path, 4)], "errors found: memcheck 1")])
    fake.documents[uri] = Document(uri, 1, CANDIDATE)
    fake.runner.gate = asyncio.Event()
    running = asyncio.ensure_future(fake.feature.sanitize_command((uri,)))
    await asyncio.sleep(0.05)
    fake.documents[uri] = Document(uri, 2, "# a line typed above\n" + CANDIDATE)
    fake.runner.gate.set()
    answer = await running
    assert answer["findings"] == 0 and answer["heldBack"] == 1
    assert fake.store.findings(uri, f"sanitize:{uri}") == []
    assert any("relu_new.py shows another text than compute-sanitizer checked: 1 of its findings are not shown" in m
               for m in fake.told), fake.told


async def test_a_failed_check_says_why_and_publishes_nothing(tmp_path: Path):
    path, uri = candidate_files(tmp_path)
    fake = feature(tmp_path, [Result("failed", [], {}, {}, NO_GPU, NO_GPU_CODE)])
    fake.documents[uri] = Document(uri, 1, CANDIDATE)
    answer = await fake.feature.sanitize_command((uri,))
    assert answer == {"uri": uri, "status": "unavailable", "message": NO_GPU_HERE}
    assert fake.told == [f"kernel-lsp: relu_new.py not checked for memory safety: {NO_GPU_HERE}"]
    assert not fake.published


async def test_after_verification_only_when_asked_for_and_a_missing_gpu_is_said_once(tmp_path: Path):
    path, uri = candidate_files(tmp_path)
    settings = resolve_settings()[0]
    pairing = Pairing(path, tmp_path / "relu.py", "header", "")

    def verified(text: str):
        return verify_job(path, pairing.reference, verify_options(settings), {path: text})

    off = feature(tmp_path, [])
    off.feature.after_verify(uri, pairing, verified(CANDIDATE))
    assert not off.feature._tasks and not off.told  # sanitizeAfterVerify is off by default

    failed = Result("failed", [], {}, {}, NO_GPU, NO_GPU_CODE)  # as kinds.sanitize.handle answers
    fake = feature(tmp_path, [failed, failed], {"sanitizeAfterVerify": True})
    fake.feature.after_verify(uri, pairing, verified(CANDIDATE))
    await fake.feature._tasks[uri]
    fake.feature.after_verify(uri, pairing, verified(CANDIDATE + "# saved again\n"))  # new content: checked
    await fake.feature._tasks[uri]
    assert len(fake.runner.jobs) == 2
    assert fake.told == [f"kernel-lsp: relu_new.py not checked for memory safety: {NO_GPU_HERE}"]  # once
    fake.feature.after_verify(uri, pairing, verified(CANDIDATE))  # content checked before: not again
    assert uri not in fake.feature._tasks and len(fake.runner.jobs) == 2

    fake.worker.known_status = SimpleNamespace(state="connected", gpu=None)
    fake.feature.after_verify(uri, pairing, verified(CANDIDATE + "# a third text\n"))
    assert uri not in fake.feature._tasks and len(fake.runner.jobs) == 2 and len(fake.told) == 1

    fresh = feature(tmp_path, [], {"sanitizeAfterVerify": True})
    fresh.worker.known_status = SimpleNamespace(state="connected", gpu=None)
    fresh.feature.after_verify(uri, pairing, verified(CANDIDATE))  # known before any check: said, no job sent
    assert fresh.told == [f"kernel-lsp: relu_new.py not checked for memory safety: {NO_GPU_HERE}"] and not fresh.runner.jobs
