"""The reports' contracts (kernel_lsp/contracts): one definition each, decoded strictly where a report arrives (the
worker from the judge's pipe, a client from the worker's result, a keeper's parent from its report pipe) and encoded
back to the wire's names."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest

from kernel_lsp.contracts.codec import ContractError, decode, decode_verify_report, encode
from kernel_lsp.contracts.job_metrics import (BuildMetrics, CuteDslKernel, CuteDslMetrics, DeviceInfoMetrics,
                                              KernelResources, RunMetrics, VerifyMetrics)
from kernel_lsp.contracts.keeper_report import KeeperEnd, KeeperStart
from kernel_lsp.contracts.options import VerifyOptions, to_config
from kernel_lsp.findings import Severity
from kernel_lsp.contracts.verify_report import CPU_NOT_COMPARABLE, Timing, Unavailable, VerifyReport
from kernel_lsp.commands import verify as verify_command
from kernel_lsp.kinds import verify
from kernel_lsp.process.keeper import KeeperLink
from kernel_lsp.verify.checks import note_processes_left
from kernel_lsp.verify.judge import Integrity
from kernel_lsp.verify.pairing import Pairing
from kernel_lsp.worker.protocol import Job, Result
from kernel_lsp.worker.sandbox import SandboxRun, TracebackFrame
from tests.paths import REPORTS
from tests.speedup_marking import shown_ratios, unmarked_ratios

RECORDED = sorted(REPORTS.glob("*.json"))


def _recorded(name: str = "verify_cpu_honest") -> dict:
    return json.loads((REPORTS / f"{name}.json").read_text())


@pytest.mark.parametrize("path", RECORDED, ids=[path.stem for path in RECORDED])
def test_a_recorded_report_decodes_and_encodes_back_to_the_same_wire_dict(path: Path):
    wire = json.loads(path.read_text())
    report = decode_verify_report(wire)
    assert isinstance(report, VerifyReport) and report.verdict == wire["verdict"]
    assert encode(report) == wire
    assert json.loads(json.dumps(encode(report))) == wire  # JSON (bench.json, the CLI) carries it unchanged


def test_every_key_that_breaks_the_contract_is_named():
    wire = _recorded()
    wire["surprise"] = 1  # unknown
    del wire["correctness"]["passed"]  # missing
    wire["integrity"] = [{"code": "integrity-x", "message": "m"}, {"code": 3, "message": "m"}]  # 3 is no str
    wire["timing"]["candidate"]["median_ms"] = "fast"  # no number
    wire["correctness"]["trials"] = True  # a bool is no int
    wire["verdict"] = "maybe"
    with pytest.raises(ContractError) as caught:
        decode_verify_report(wire)
    message = str(caught.value)
    for named in ("unknown key(s) ['surprise']", ".correctness.passed: missing", ".integrity[1].code: expected str",
                  ".timing.candidate.median_ms: expected a number", ".correctness.trials: expected int",
                  ".verdict:"):
        assert named in message, message


def test_numbers_are_taken_as_sent_and_text_is_never_coerced():
    wire = _recorded()
    wire["timing"]["candidate"]["median_ms"] = 4  # msgpack keeps a whole float as an int: still a number
    assert decode(VerifyReport, wire).timing.candidate.median_ms == 4.0
    wire["correctness"]["trials"] = "4"  # cattrs' default would make it 4
    with pytest.raises(ContractError, match=r"\.correctness\.trials: expected int, got str"):
        decode(VerifyReport, wire)
    with pytest.raises(ContractError, match="expected a mapping"):
        decode_verify_report(["verified"])


def test_fields_added_later_are_absent_from_the_wire_when_they_hold_nothing():
    timing = decode(VerifyReport, _recorded()).timing
    assert "check_ms" not in encode(timing.eager) and "schedule" not in encode(timing)
    checked = dataclasses.replace(timing.eager, check_ms=(0.1, 0.2))
    assert encode(checked)["check_ms"] == [0.1, 0.2] and decode(Timing, encode(checked)) == checked
    assert encode(timing)["compileError"] is None and "compile_error" not in encode(timing)  # the wire's name


def test_speedups_timed_on_the_cpu_are_marked_not_comparable_on_the_wire_whatever_the_report_said():
    """The marking tools test (`speedup_comparable`, `not_comparable_reason`) follows from where the candidate ran:
    a report written before it is marked on decoding, and a wire that claims a CPU ratio comparable is not believed."""
    old = _recorded()
    del old["speedup_comparable"], old["not_comparable_reason"]
    report = decode_verify_report(old)
    assert report.speedup["eager"] and report.speedup_comparable is False
    assert report.not_comparable_reason == CPU_NOT_COMPARABLE and "CPU" in CPU_NOT_COMPARABLE
    assert (encode(report)["speedup_comparable"], encode(report)["not_comparable_reason"]) == (False,
                                                                                              CPU_NOT_COMPARABLE)
    claimed = decode_verify_report({**_recorded(), "speedup_comparable": True, "not_comparable_reason": None})
    assert claimed.speedup_comparable is False and claimed.not_comparable_reason == CPU_NOT_COMPARABLE
    on_gpu = dataclasses.replace(report, device="cuda")
    assert (on_gpu.speedup_comparable, on_gpu.not_comparable_reason) == (True, None)
    wire = encode(on_gpu)  # on a GPU too the wire says it, so a reader tests one key on every report
    assert wire["speedup_comparable"] is True and "not_comparable_reason" in wire and decode(VerifyReport, wire) == on_gpu
    with pytest.raises(ContractError, match=r"\.speedup_comparable: expected bool"):
        decode_verify_report({**_recorded(), "speedup_comparable": "no"})


def test_an_unavailable_verdict_has_its_own_shape():
    assert decode_verify_report({"verdict": "unavailable", "reason": "no GPU"}) == Unavailable("no GPU")
    with pytest.raises(ContractError, match="reason: missing"):
        decode_verify_report({"verdict": "unavailable"})


class _Sandbox:
    """The judge's child as the worker sees it: a run that returns `value`, or ends as `ran` says."""

    def __init__(self, value: object, ran: SandboxRun | None = None) -> None:
        self.value = value
        self.ran = ran

    async def run(self, task, limits) -> SandboxRun:
        return self.ran or SandboxRun("ok", "", self.value, "", "", False, 0.5, 0, None, [], None)


async def _handled(value: object, ran: SandboxRun | None = None) -> Result:
    async def progress(*_args, **_kwargs) -> None:
        return None

    context = SimpleNamespace(sandbox=_Sandbox(value, ran), cache_dir=Path("/nonexistent"), progress=progress)
    config = {**to_config(VerifyOptions(device="cpu")), "candidate": "cand.py", "reference": "ref.py",
              "origins": {"cand.py": "/work/cand.py"}}
    job = Job("verify", {"cand.py": "class ModelNew:\n    pass\n", "ref.py": ""}, config, "key")
    return await verify._verify(job, VerifyOptions(device="cpu"), context, on_gpu=False)


async def test_the_worker_decodes_the_judges_report_and_sends_it_on_encoded():
    result = await _handled(_recorded("verify_cpu_rejected"))
    assert result.metrics["verdict"] == "rejected" and result.metrics["report"] == _recorded("verify_cpu_rejected")
    assert [f["code"] for f in result.findings] == ["integrity-input-mutated"]
    outcome = verify.VerifyOutcome.of(result)
    assert outcome.report == decode(VerifyReport, _recorded("verify_cpu_rejected")) and outcome.finished


async def test_verify_json_carries_the_marking_and_its_text_no_cpu_ratio(capsys):
    """`kernel-lsp verify` on the CPU: the JSON's report says `speedup_comparable: false` (even for a judge's report
    written before the marking), and the text's summary states no ratio."""
    judged = _recorded("verify_cpu_honest")
    del judged["speedup_comparable"], judged["not_comparable_reason"]
    result = await _handled(judged)
    outcome = verify.VerifyOutcome.of(result)
    pairing = Pairing(Path("cand.py"), Path("ref.py"), "command line", "--reference ref.py")
    verify_command._print("json", pairing, outcome, result)
    printed = json.loads(capsys.readouterr().out)
    assert printed["report"]["speedup_comparable"] is False and printed["report"]["speedup"]["eager"]
    assert unmarked_ratios(printed) == [] and printed["report"]["not_comparable_reason"] == CPU_NOT_COMPARABLE
    verify_command._print("text", pairing, outcome, result)
    text = capsys.readouterr().out
    assert "timings not comparable" in text and shown_ratios(text, printed) == [] and "×" not in text


async def test_a_report_that_breaks_the_contract_is_unavailable_and_says_where():
    broken = _recorded()
    broken["kernels"]["custom"] = "relu_kernel"  # a str where the contract has a list
    result = await _handled(broken)
    assert result.metrics["verdict"] == "unavailable" and result.metrics["report"] is None
    [finding] = result.findings
    assert finding["code"] == "verify-unavailable" and ".kernels.custom" in finding["message"], finding
    assert "not your code" in finding["message"]


def _import_failed(module: str) -> SandboxRun:
    """The candidate's process stopped at the candidate's own `import` of `module`, missing where the worker runs."""
    frame = TracebackFrame("/work/cand.py", 3, "<module>", f"import {module}")
    return SandboxRun("python-exception", f"ModuleNotFoundError: No module named '{module}'", None, "", "", False,
                      0.5, 1, None, [frame], "ModuleNotFoundError")


async def test_a_package_missing_where_the_worker_runs_is_unavailable_with_its_install_command():
    """A CuTe DSL candidate on a worker without nvidia-cutlass-dsl: not rejected (the candidate did nothing
    wrong), one Information finding with the command that installs the package."""
    result = await _handled(None, _import_failed("cutlass.cute"))
    assert result.metrics["verdict"] == "unavailable", result.metrics
    [finding] = result.findings
    assert finding["code"] == "verify-unavailable" and finding["severity"] == Severity.INFORMATION, finding
    assert "no cutlass module" in finding["message"] and "pip install 'kernel-lsp[cute-dsl]'" in finding["message"]
    assert "not verified" in verify.VerifyOutcome.of(result).summary


async def test_a_missing_module_of_the_users_own_is_the_candidates_rejection():
    result = await _handled(None, _import_failed("my_kernels"))
    assert result.metrics["verdict"] == "rejected", result.metrics
    assert [f["code"] for f in result.findings] == ["run-python-exception"]


async def test_a_verdict_unavailable_is_information_not_an_error_of_the_file():
    result = await _handled({"verdict": "unavailable", "reason": "no GPU"})
    [finding] = result.findings
    assert (finding["code"], finding["severity"]) == ("verify-unavailable", Severity.INFORMATION)


def test_a_client_refuses_a_result_whose_report_breaks_the_contract():
    wire = copy.deepcopy(_recorded())
    wire["speedup"] = {"eager": "2x"}
    outcome = verify.VerifyOutcome.of(Result("ok", [], {"verdict": "verified", "summary": "s", "report": wire}))
    assert outcome.verdict == "unavailable" and not outcome.finished and outcome.report is None
    assert ".speedup" in outcome.summary and "contract" in outcome.summary


def _keeper_said(*lines: dict) -> KeeperLink:
    """A KeeperLink whose keeper wrote `lines` on its report pipe and exited."""
    link = KeeperLink()
    _control_read, report_write = link.child_fds
    os.write(report_write, b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    link.started()  # the keeper's ends closed here, as once it runs: the report then reads to its end
    return link


KEEPER_END = {"status": 0, "reason": None, "left": ["4242 sleep 60"], "leftCount": 1, "unkilled": [],
              "diskBytes": 4096, "diskLimit": None}


def test_a_keepers_lines_are_decoded_under_its_own_names():
    link = _keeper_said({"child": 17, "subreaper": None}, KEEPER_END)
    end = link.end()
    assert link.start(0) == KeeperStart(child=17, subreaper=None)
    assert end == KeeperEnd(status=0, reason=None, left=["4242 sleep 60"], left_count=1, unkilled=[], disk_bytes=4096,
                            disk_limit=None)
    assert encode(end) == KEEPER_END
    link.close()


@pytest.mark.parametrize("forged", [{**KEEPER_END, "leftCount": "0"}, {**KEEPER_END, "reason": "done"},
                                    {**KEEPER_END, "extra": True}, {"status": 0}],
                         ids=["count-as-text", "unknown-reason", "unknown-key", "missing-keys"])
def test_a_keepers_last_line_that_breaks_the_contract_accounts_for_nothing(forged: dict):
    link = _keeper_said({"child": 17, "subreaper": None}, forged)
    kept = link.end()
    link.close()
    assert kept is None  # as if the keeper was killed before it said: the judge rejects on it
    integrity = Integrity(device="cpu")
    rejected = note_processes_left(kept, integrity)
    assert rejected and [p.code for p in integrity.problems] == ["integrity-process-left"]


# --- the sanitize report -------------------------------------------------------------------------------------

def _sanitize_wire(name: str) -> dict:
    """The report the worker's own code makes from candidate `name`'s four recorded logs (every tool's parse, the
    errors on the candidate's lines and those apart, a stopped run), encoded as the worker sends it."""
    from kernel_lsp.contracts.sanitize_report import SanitizeProblem
    from kernel_lsp.profile.sanitize import SanitizeRun, ToolRun, sanitize_findings, sanitize_report
    from profilers.sanitizer import parse_report
    from tests.gpu.sanitizer_candidates import CANDIDATES
    from tests.unit.test_sanitizer_report import RECORDED as LOGS, recorded

    runs = [ToolRun(tool, parse_report(recorded(f"{name}.{tool}.log"), tool), 2.5)
            for tool in ("memcheck", "racecheck", "initcheck", "synccheck")
            if (LOGS / f"{name}.{tool}.log").is_file() or (LOGS / f"{name}.{tool}.log.gz").is_file()]
    runs[-1].timed_out, runs[-1].problem = True, SanitizeProblem("sanitize-tool-stopped", "stopped")
    run = SanitizeRun(runs)
    files = {"cand.py": CANDIDATES[name]}
    findings, library = sanitize_findings(run, files, files, {"cand.py": "/work/cand.py"}, "cand.py")
    return encode(sanitize_report(run, findings, library))


@pytest.mark.parametrize("name", ["race", "library", "many", "clean"])
def test_a_sanitize_report_decodes_and_encodes_back_to_the_same_wire_dict(name: str):
    from kernel_lsp.contracts.sanitize_report import SanitizeReport

    wire = _sanitize_wire(name)
    report = decode(SanitizeReport, wire)
    assert (sum(len(run.errors) for run in report.tools) + len(report.library) > 0) == (name != "clean")
    assert encode(report) == wire and json.loads(json.dumps(wire)) == wire
    assert {"wallS", "timedOut", "notPrinted"} <= set(wire["tools"][0]) and "sharedInit" not in wire["tools"][0]
    assert wire["tools"][-1]["problem"] == {"code": "sanitize-tool-stopped", "message": "stopped"}


def test_every_key_of_a_sanitize_report_that_breaks_the_contract_is_named():
    from kernel_lsp.contracts.sanitize_report import SanitizeReport

    wire = _sanitize_wire("race")
    wire["tools"][0]["problem"] = "memcheck ran past 300 s"  # a sentence, as reports were before codes
    wire["tools"][1]["errors"][0]["site"]["line"] = "12"
    wire["tools"][2]["verdict"] = "clean"  # unknown
    wire["clean"] = 1
    del wire["errors"]
    with pytest.raises(ContractError) as caught:
        decode(SanitizeReport, wire)
    message = str(caught.value)
    for named in (".tools[0].problem:", ".tools[1].errors[0].site.line: expected int", ".tools[2]: unknown key(s) "
                  "['verdict']", ".clean: expected bool", ".errors: missing"):
        assert named in message, message


def test_a_client_says_a_sanitize_report_it_cannot_read_and_never_calls_it_clean():
    from kernel_lsp.kinds.sanitize import SanitizeOutcome

    wire = _sanitize_wire("race")
    wire["clean"], wire["tools"] = True, [{"tool": "memcheck", "clean": True}]  # another version's, or forged
    outcome = SanitizeOutcome.of(Result("ok", [], {"sanitize": wire, "summary": "clean: memcheck 0"}))
    assert not outcome.clean and outcome.report is None and outcome.code == "sanitize-contract"
    assert "not in the form this client reads" in outcome.error and ".tools[0]" in outcome.error


@pytest.mark.parametrize("written", [
    {"elements": 8, "dependent": 0, "unstable": 0, "first": None, "verdict": "clean"},  # a key of its own
    {"elements": 8, "dependent": "0", "unstable": 0, "first": None},  # a count as text
    ["clean"],
])
def test_a_shared_init_answer_in_another_form_is_no_answer(tmp_path: Path, written):
    """The answer file is written inside the candidate's process: what does not fit its contract is no answer,
    and the run is incomplete, never clean."""
    from kernel_lsp.profile.sanitize import read_answer, shared_init_problem

    path = tmp_path / "shared-init.json"
    path.write_text(json.dumps(written))
    assert read_answer(path) is None
    assert shared_init_problem(read_answer(path), 0, False, 60, "").code == "sanitize-no-answer"
    path.write_text(json.dumps({**{"elements": 8, "dependent": 0, "unstable": 0, "first": None},
                                "patterns": ["0x5a5a5a5a", "0x3f803f80"], "fillBytes": 32}))
    assert read_answer(path).fill_bytes == 32 and shared_init_problem(read_answer(path), 0, False, 60, "") is None


def test_the_cute_dsl_report_crosses_once_each_way_and_a_forged_one_is_refused():
    from kernel_lsp.contracts.cute_dsl_report import CompiledFunction, CuteDslReport, FailureFrame

    report = CuteDslReport("compile-error", "rank mismatch", "4.8.1", [CompiledFunction("add", ["kernel_0"], b"\x7fELF")],
                           "forward", "DSLRuntimeError", [FailureFrame("add.py", 12, "forward", "add(x)")])
    wire = encode(report)
    assert wire["errorType"] == "DSLRuntimeError" and "error_type" not in wire and wire["kernels"][0]["cubin"] == b"\x7fELF"
    assert decode(CuteDslReport, msgpack.unpackb(msgpack.packb(wire))) == report
    for forged in ({**wire, "status": "verified"}, {**wire, "frames": [{"file": "add.py", "line": "12",
                                                                        "function": "f", "text": ""}]},
                   {**wire, "kernels": [{"function": "add", "kernels": "kernel_0", "cubin": None}]},
                   {**wire, "trusted": True}):
        with pytest.raises(ContractError):
            decode(CuteDslReport, forged)


async def test_a_verify_jobs_metrics_keep_their_wire_names_and_a_verdict_outside_the_contract_is_refused():
    result = await _handled(_recorded("verify_cpu_rejected"))
    assert set(result.metrics) == {"durationS", "verdict", "summary", "report"}
    assert result.metrics["durationS"] == 0.5 and decode(VerifyMetrics, result.metrics).report is not None
    odd = verify.VerifyOutcome.of(Result("ok", [], {"verdict": "great", "summary": "s"}))
    assert (odd.verdict, odd.finished, odd.report) == ("unavailable", False, None)
    assert ".verdict" in odd.summary and "contract" in odd.summary


def test_each_job_kinds_metrics_cross_under_the_names_they_always_had():
    resources = KernelResources("sm_90a", 32, 0, 16, 0, {"HMMA": 2}, None, "sm_90a: 32 registers")
    cute = CuteDslMetrics("ok", "1 kernel(s)", [CuteDslKernel("kernel_0", "add_kernel", resources)], "4.8.1")
    wire = encode(cute)
    assert "isolation" not in wire and wire["kernels"][0]["resources"]["localBytes"] == 16
    assert decode(CuteDslMetrics, msgpack.unpackb(msgpack.packb(wire))) == cute
    assert encode(CuteDslMetrics("stopped", "why")) == {"status": "stopped", "summary": "why", "kernels": []}
    assert encode(DeviceInfoMetrics({"torch": "2.5"}, False, None)) == {
        "versions": {"torch": "2.5"}, "cudaAvailable": False, "device": None}
    assert encode(BuildMetrics(1.5, "ok", True, "/cache/x")) == {
        "durationS": 1.5, "status": "ok", "cached": True, "buildDirectory": "/cache/x"}
    assert encode(RunMetrics(0.25, "timeout")) == {"durationS": 0.25, "status": "timeout"}
    with pytest.raises(ContractError, match=r"\.kernels\[0\]\.resources\.local_bytes"):
        decode(CuteDslMetrics, {**wire, "kernels": [{**wire["kernels"][0], "resources": {
            **wire["kernels"][0]["resources"], "localBytes": "16"}}]})


def test_no_reader_takes_a_results_metrics_for_a_dict():
    """A job's metrics are read through its kind's class (contracts.job_metrics), decoded where the Result arrives:
    no `.get` or subscript on a Result's `metrics` anywhere in kernel_lsp."""
    read_as_dict = re.compile(r"\.metrics(\.get\(|\[)")
    package = Path(verify.__file__).resolve().parents[1]
    offenders = [f"{path.relative_to(package.parent)}:{number}" for path in sorted(package.rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1) if read_as_dict.search(line)]
    assert offenders == [], offenders
