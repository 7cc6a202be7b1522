"""The agent's reading of a sanitize job's answer (agent/safety.py) and what it does to a candidate's score, its
verify answer, its time and its place among the best (no worker: the answers are Results as the job builds them)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.sanitize_report import (
    SanitizeProblem,
    SanitizeReport,
    SanitizerErrorEntry,
    ToolRunReport,
    WarmCall,
)
from kernel_lsp.agent import rubric, safety
from kernel_lsp.agent.loop import best_candidate, problem_codes
from kernel_lsp.agent.search import FAILURE_LIMIT, SearchTree
from kernel_lsp.agent.tools import candidate_ms, verify_feedback
from kernel_lsp.findings import Finding, Range, Related, Severity, path_to_uri
from kernel_lsp.kinds.sanitize import SanitizeOutcome
from kernel_lsp.profile.sanitize import NO_GPU, NO_GPU_CODE
from kernel_lsp.worker.protocol import Result
from tests.gpu.sanitizer_candidates import CANDIDATES
from tests.reports import verify_report

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "sanitizer"
FOLDER = Path("/work/problem")
CANDIDATE = FOLDER / ".relu.kernel-lsp-agent-p1-3.py"  # the hidden name the job gave the candidate's text
OOB = ("compute-sanitizer memcheck: Invalid __global__ read of size 4 bytes, in relu_peek, thread (255,0,0) of "
       "block (4095,0,0), 4 bytes past the end of a 4194304-byte allocation")


def finding(path: Path, line: int, code: str = "sanitizer-memcheck", message: str = OOB,
            severity: Severity = Severity.ERROR, related: tuple[Related, ...] = ()) -> dict:
    return Finding(path_to_uri(path), Range.line(line), severity, "kernel-lsp", code, message, related).to_dict()


def answer(findings: list[dict], tools: list[dict] | None = None, library: int = 0, clean: bool = False,
           summary: str = "errors found: memcheck 1 · racecheck 0", problems: list[tuple[str, str]] = (),
           warm: bool = True) -> SanitizeOutcome:
    """A finished job's answer, as kinds.sanitize.sanitize_result shapes it (warm: the warm call ran)."""
    tools = tools if tools is not None else [{"tool": "memcheck", "problem": None}, {"tool": "racecheck",
                                                                                     "problem": None}]
    runs = tuple(ToolRunReport(t["tool"], 1.0, False, SanitizeProblem("sanitize-tool-stopped", t["problem"])
                               if t["problem"] else None, t["problem"] is None, 0, False, (), ()) for t in tools)
    other = SanitizerErrorEntry("initcheck", "uninitialized", "Uninitialized __global__ memory read", "error", None,
                                None, "global", "read", None, 4, None, None, None, None, None, "an initcheck error")
    report = SanitizeReport(runs, WarmCall(0, False, 3.0, "") if warm else None,
                            tuple(SanitizeProblem(code, message) for code, message in problems), (other,) * library,
                            len(findings), (), clean)
    return SanitizeOutcome.of(Result("ok", findings, {"sanitize": encode(report), "summary": summary}, {}))


def failed(status: str, error: str, code: str | None = None) -> SanitizeOutcome:
    return SanitizeOutcome.of(Result(status, [], {}, {}, error, code))


def verified(eager: float = 2.0, sanitize: dict | None = None) -> dict:
    """A verify job's evaluation that counts, and its sanitize entry."""
    report = verify_report(verdict="verified", device="cuda", correctness={"trials": 3, "passed": 3}, integrity=[],
                           speedup={"eager": eager, "compile": None}, timing={"candidate": {"median_ms": 1.0 / eager}})
    evaluation = {"compile": {"compiled": True, "errors": 0}, "verdict": "verified", "summary": "correct 3/3",
                  "report": report, "problems": [], "structure": []}
    return {**evaluation, "sanitize": sanitize} if sanitize is not None else evaluation


def entry(outcome: SanitizeOutcome) -> dict:
    return safety.sanitize_entry(outcome, CANDIDATE, FOLDER)


# --- the entry ------------------------------------------------------------------------------------------------

def test_errors_on_the_candidate_are_given_by_their_1_based_line_and_others_by_file():
    race = Related(path_to_uri(CANDIDATE), Range.line(13), "the other access of the race (read)")
    found = entry(answer([finding(CANDIDATE, 12), finding(FOLDER / "kernels" / "sum.cu", 3, "sanitizer-racecheck",
                                                         "compute-sanitizer racecheck: race", related=(race,)),
                          finding(CANDIDATE, 20, "sanitizer-racecheck", "a warning", Severity.WARNING),
                          finding(CANDIDATE, 0, "sanitizer-library", "in PyTorch's kernels", Severity.INFORMATION)],
                         library=2))
    assert found["status"] == "errors" and found["others"] == 2
    assert found["errors"] == [
        {"line": 13, "code": "sanitizer-memcheck", "tool": "memcheck", "message": OOB},
        {"line": 4, "code": "sanitizer-racecheck", "tool": "racecheck", "message": "compute-sanitizer racecheck: race",
         "file": "kernels/sum.cu",
         "related": [{"line": 14, "message": "the other access of the race (read)"}]}]  # warnings, others: not errors
    assert rubric.unsafe_reason(found["errors"]) == f"unsafe: line 13: {OOB} (and 1 more error)"


def test_a_clean_run_and_one_stopped_before_it_found_anything():
    assert entry(answer([], clean=True, summary="clean: memcheck 0 · racecheck 0"))["status"] == "clean"
    stopped = entry(answer([], [{"tool": "memcheck", "problem": "memcheck ran past 300 s and was stopped"}],
                           summary="incomplete: memcheck 0 (stopped)"))
    assert stopped["status"] == "incomplete" and stopped["errors"] == []
    assert stopped["reason"] == "memcheck ran past 300 s and was stopped"
    assert safety.lasting_reason(stopped) is None  # the next candidate may finish


def test_what_stops_every_check_of_the_pass_and_what_stops_one():
    no_gpu = entry(failed("failed", NO_GPU, NO_GPU_CODE))  # as kinds.sanitize.handle answers without a GPU
    assert no_gpu["status"] == "not-run" and NO_GPU in no_gpu["reason"] and no_gpu["summary"].startswith("not sanit")
    assert safety.lasting_reason(no_gpu) == no_gpu["reason"]
    older = entry(failed("failed", "unknown-job-kind: unknown job kind 'sanitize' (known: profile, verify)",
                         "unknown-job-kind"))  # as the client makes a worker's error message a Result
    assert safety.lasting_reason(older) is not None
    # the sentence alone decides nothing: a candidate that prints the no-GPU sentence is no lasting failure
    assert safety.lasting_reason(entry(failed("failed", f"the candidate said: {NO_GPU}"))) is None
    missing = "compute-sanitizer is not on PATH nor under CUDA_HOME/bin or /usr/local/cuda/bin"
    no_tool = entry(answer([], [], summary=f"not sanitized: {missing}", problems=[("sanitize-tool-missing", missing)],
                           warm=False))
    assert no_tool["status"] == "not-run" and no_tool["reason"] == missing
    assert safety.lasting_reason(no_tool) == missing
    unbuilt = entry(answer([], [], problems=[("sanitize-build-failed", "the candidate's extension did not build: ...")],
                           warm=True))
    assert unbuilt["status"] == "not-run" and safety.lasting_reason(unbuilt) is None  # that candidate's fault
    timeout = entry(failed("timeout", "the job ran past its time limit (2420 s) and was cancelled"))
    assert timeout["status"] == "not-run" and safety.lasting_reason(timeout) is None
    lost = entry(failed("lost", "the worker connection failed while sending the job"))
    assert safety.lasting_reason(lost) is None


# --- the score and the answer ---------------------------------------------------------------------------------------

def test_errors_score_zero_and_a_check_that_did_not_run_changes_nothing():
    errors = entry(answer([finding(CANDIDATE, 12)]))
    unsafe = rubric.score(verified(sanitize=errors))
    assert unsafe.score == 0 and unsafe.outcome == "unsafe" and not unsafe.verified
    assert unsafe.reason == f"unsafe: line 13: {OOB}"
    plain = rubric.score(verified())
    for check in (safety.not_sanitized(safety.ON_CPU), entry(failed("failed", NO_GPU, NO_GPU_CODE)),
                  entry(answer([], clean=True)), entry(answer([], [{"tool": "memcheck", "problem": "stopped"}]))):
        assert rubric.score(verified(sanitize=check)) == plain and plain.verified


def test_an_unsafe_candidate_has_no_time_and_its_answer_is_a_reject_that_says_where():
    evaluation = verified(sanitize=entry(answer([finding(CANDIDATE, 12)])))
    assert candidate_ms(evaluation) is None and candidate_ms(verified()) == 0.5
    shown = verify_feedback(evaluation)
    assert shown["verdict"] == "rejected" and shown["summary"] == f"unsafe: line 13: {OOB}"
    assert shown["sanitizer_errors"][0]["line"] == 13 and "speedup" not in shown and "scores zero" in shown["note"]
    assert problem_codes(evaluation) == ["sanitizer-memcheck"]
    many = verify_feedback(verified(sanitize=entry(answer([finding(CANDIDATE, line) for line in range(8)]))))
    assert [e["line"] for e in many["sanitizer_errors"]] == [1, 2, 3, 4, 5] and many["more_sanitizer_errors"] == 3
    assert many["summary"].endswith("(and 7 more errors)")
    clean = verify_feedback(verified(sanitize=entry(answer([], clean=True, summary="clean: memcheck 0"))))
    assert clean["verdict"] == "verified" and clean["sanitizer"] == "clean: memcheck 0" and clean["speedup"]
    skipped = verify_feedback(verified(sanitize=safety.not_sanitized(safety.ON_CPU)))
    assert not {"sanitizer", "sanitizer_errors", "note"} & set(skipped) and json.dumps(skipped)


def test_an_unsafe_candidate_is_never_the_best_however_fast():
    tree = SearchTree("original")
    for source, evaluation in (("fast but unsafe", verified(9.0, entry(answer([finding(CANDIDATE, 12)])))),
                               ("slower, not sanitized", verified(1.5, safety.not_sanitized(safety.ON_CPU)))):
        node = tree.add_child(tree.root, source)
        tree.record(node, evaluation, rubric.score(evaluation), "")
    assert best_candidate(tree).source == "slower, not sanitized"
    assert best_candidate(tree, "energy").source == "slower, not sanitized"
    assert tree.nodes[1].reward == 0


def test_unsafe_candidates_in_a_row_end_a_branch():
    tree = SearchTree("original")
    node = tree.root
    unsafe = verified(sanitize=entry(answer([finding(CANDIDATE, 12)])))
    for _ in range(FAILURE_LIMIT):
        node = tree.add_child(node, f"attempt {node.id}")
        tree.record(node, unsafe, rubric.score(unsafe), "")
    assert node.dead and "failures in a row" in node.dead_reason


def _recorded_outcome(log: str, tool: str, text: str) -> SanitizeOutcome:
    """A job's answer made by the worker's own code from a recorded log, the candidate's text named cand.py."""
    from kernel_lsp.profile.sanitize import SanitizeRun, ToolRun, sanitize_findings, sanitize_report, summary_line
    from profilers.sanitizer import parse_report

    run = SanitizeRun(runs=[ToolRun(tool, parse_report(log, tool), 1.0)])
    files = {"cand.py": text}
    findings, library = sanitize_findings(run, files, files, {"cand.py": str(CANDIDATE)}, "cand.py")
    report = sanitize_report(run, findings, library)
    return SanitizeOutcome.of(Result("ok", [f.to_dict() for f in findings],
                                     {"sanitize": encode(report), "summary": summary_line(run, findings, library)},
                                     {}))


def test_invalid_accesses_in_a_kernel_whose_name_the_text_hides_are_unsafe():
    """A cheat: the candidate builds its out-of-bounds kernel at run time (NVRTC, a cubin) under a name its text
    does not show, so the errors cannot be placed on its lines and would count as a library's. The recorded
    memcheck log of the `many` candidate, its kernel renamed and without line information, as such a kernel's."""
    log = gzip.decompress((RECORDED / "many.memcheck.log.gz").read_bytes()).decode()
    hidden = log.replace("relu_far(const float *, float *, int)", "k_7f3a(const float *, float *, int)")
    hidden = hidden.replace(" in cuda.cu:11", "")
    outcome = _recorded_outcome(hidden, "memcheck", CANDIDATES["many"])
    assert not outcome.user_errors and outcome.report.library  # the editor keeps them apart
    found = entry(outcome)
    assert found["status"] == "errors", found
    [error] = found["errors"]
    model_line = CANDIDATES["many"].splitlines().index("class ModelNew(nn.Module):") + 1
    assert error["line"] == model_line and error["tool"] == "memcheck" and "k_7f3a" in error["message"], error
    assert rubric.unsafe_reason(found["errors"]).startswith(f"unsafe: line {model_line}: compute-sanitizer memcheck")

    # the same log as recorded: its kernel is the candidate's own, on its line
    own = entry(_recorded_outcome(log, "memcheck", CANDIDATES["many"]))
    assert own["status"] == "errors" and all(e["code"] == "sanitizer-memcheck" for e in own["errors"]), own


def test_pytorchs_uninitialised_reads_do_not_make_a_candidate_unsafe():
    """initcheck's errors in PyTorch's own kernel (the recorded `library` run): apart, not counted."""
    log = gzip.decompress((RECORDED / "library.initcheck.log.gz").read_bytes()).decode()
    found = entry(_recorded_outcome(log, "initcheck", CANDIDATES["library"]))
    assert found["status"] == "clean" and found["errors"] == [] and found["others"] > 0, found
