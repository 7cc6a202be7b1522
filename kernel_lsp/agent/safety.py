"""A verified candidate under compute-sanitizer, as the agent records, scores and tells it.

The workbench sends the "sanitize" job (kinds/sanitize.py) for each new text that verified; its answer becomes the
evaluation's `sanitize` entry:
    status   "errors" | "clean" | "incomplete" | "not-run"
    summary  the job's one line ('errors found: memcheck 1 · racecheck 0'), or 'not sanitized: WHY'
    reason   why nothing (not-run) or not everything (incomplete) was checked; None otherwise
    errors   the errors on the candidate's own lines: [{line (1-based), code, tool, message, file?, related?}];
             `file` only for a file other than the candidate (a .cu it loads), `related` a race's other access
    others   how many errors were in kernels that are not the candidate's by name or line (PyTorch's, a library's):
             not counted against it, except memcheck's invalid accesses (see `unplaced_invalid_accesses`)
    lasting  (not-run) true when the reason holds for every candidate of the pass on this worker: it has no GPU or
             no compute-sanitizer, or does not know the job (an older worker)
The rubric scores a candidate with errors zero; one that could not be sanitized keeps its score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernel_lsp.findings import Finding, uri_to_path
from kernel_lsp.contracts.sanitize_report import SanitizeReport
from kernel_lsp.kinds.sanitize import SanitizeOutcome
from kernel_lsp.profile.sanitize import NO_GPU_CODE, library_kernels

MESSAGE_CHARS = 400
SHOWN_ERRORS = 5  # in the verify answer; the rest are counted
FINISHED = ("errors", "clean")  # the statuses of a check that ran to its end: kept for the text
ON_CPU = "the pass verifies on the CPU, and compute-sanitizer needs a GPU"
SETTING_OFF = "the agentSanitize setting is off"
# failures that hold for every later candidate of the pass: the worker will not gain a GPU or learn a job mid-pass
LASTING_FAILURES = (NO_GPU_CODE, "unknown-job-kind")  # Result.code


def not_sanitized(reason: str, lasting: bool = False) -> dict[str, Any]:
    return {"status": "not-run", "summary": f"not sanitized: {reason}", "reason": reason, "errors": [], "others": 0,
            "lasting": lasting}


def sanitize_entry(outcome: SanitizeOutcome, candidate: Path, folder: Path) -> dict[str, Any]:
    """The evaluation's `sanitize` entry (module docstring) from the job's answer; `candidate` is the path the job
    named the candidate's text by, `folder` the original's (other files are named relative to it)."""
    errors = [error_entry(f, candidate, folder) for f in outcome.user_errors]
    unplaced = unplaced_invalid_accesses(outcome)
    if unplaced is not None:
        errors.append(unplaced)
    others = len(outcome.report.library) if outcome.report else 0
    if errors:
        return {"status": "errors", "summary": outcome.summary, "reason": None, "errors": errors, "others": others}
    if outcome.error is not None:
        return not_sanitized(outcome.error, _lasting(outcome))
    if outcome.clean:
        return {"status": "clean", "summary": outcome.summary, "reason": None, "errors": [], "others": others}
    return {"status": "incomplete", "summary": outcome.summary, "reason": incomplete_reason(outcome.report),
            "errors": [], "others": others}


def unplaced_invalid_accesses(outcome: SanitizeOutcome) -> dict[str, Any] | None:
    """memcheck's invalid accesses in kernels the job could not place on the candidate's lines, as one error on
    `class ModelNew`, or None. In the editor they stay apart (`sanitizer-library`, information); to the agent they
    are unsafe: PyTorch's kernels do not read out of bounds on their own, so either the candidate gave them bad
    tensors or the kernel is its own under a name its text does not show (built with NVRTC at run time, loaded
    from a cubin): a candidate must not escape the check by hiding its kernel's name. The other tools' errors in
    such kernels are not counted (initcheck reports libraries' benign reads of workspace memory)."""
    invalid = [e for e in (outcome.report.library if outcome.report else ()) if e.tool == "memcheck"]
    if not invalid:
        return None
    placed = next((f for f in outcome.findings if f.code == "sanitizer-library"), None)
    message = (f"compute-sanitizer memcheck: {len(invalid)} invalid memory accesses in kernels not placed on the "
               f"candidate's lines ({library_kernels(invalid)}): an out-of-bounds access in its forward is unsafe "
               "whichever kernel made it (a tensor it passes to PyTorch, or a kernel it builds at run time)")
    return {"line": placed.range.start.line + 1 if placed else 1, "code": "sanitizer-library", "tool": "memcheck",
            "message": _short(message)}


def error_entry(finding: Finding, candidate: Path, folder: Path) -> dict[str, Any]:
    """One error as the model reads it: its line in the candidate's text (a load_inline string's error is already
    on its .py line), the tool and the sanitizer's sentence."""
    entry: dict[str, Any] = {"line": finding.range.start.line + 1, "code": finding.code,
                             "tool": finding.code.removeprefix("sanitizer-"), "message": _short(finding.message)}
    where = _shown_path(finding.uri, candidate, folder)
    if where is not None:
        entry["file"] = where
    related = [{"line": r.range.start.line + 1, "message": _short(r.message),
                **({"file": shown} if (shown := _shown_path(r.uri, candidate, folder)) else {})}
               for r in finding.related]
    if related:
        entry["related"] = related
    return entry


def incomplete_reason(report: SanitizeReport | None) -> str:
    """What kept a run without errors from being clean: the tools stopped or unreadable, the warm call's problems."""
    problems = [*(run.problem for run in report.tools if run.problem), *report.problems] if report else []
    return _short("; ".join(problem.message for problem in problems) or "a tool did not finish")


def lasting_reason(entry: dict[str, Any]) -> str | None:
    """The reason of a not-run entry when it holds for the whole pass on this worker; None when the next candidate
    may be sanitized."""
    return entry.get("reason") if entry.get("status") == "not-run" and entry.get("lasting") else None


def _lasting(outcome: SanitizeOutcome) -> bool:
    """No GPU, a worker that does not know the job, or no compute-sanitizer; not a candidate that did not build or
    a run past its time."""
    if outcome.report is None:
        return outcome.code in LASTING_FAILURES
    return any(problem.code == "sanitize-tool-missing" for problem in outcome.report.problems)


def sanitizer_errors(evaluation: dict[str, Any]) -> list[dict[str, Any]]:
    """The errors compute-sanitizer found on the candidate's lines ([] when it was not sanitized, or clean)."""
    return list(((evaluation.get("sanitize") or {}).get("errors")) or [])


def error_line(error: dict[str, Any]) -> str:
    """'line 13: compute-sanitizer memcheck: Invalid __global__ read ...' ('kernels/k.cu line 4: ...' elsewhere)."""
    where = f"{error['file']} line {error['line']}" if error.get("file") else f"line {error['line']}"
    return f"{where}: {error['message']}"


def feedback(entry: dict[str, Any] | None) -> dict[str, Any]:
    """What the verify tool's answer says of the check: the errors and what to do, or the clean line; nothing when
    no check ran (the model cannot change that)."""
    if not entry or entry.get("status") == "not-run":
        return {}
    if entry["status"] != "errors":
        return {"sanitizer": entry["summary"]}
    errors = entry["errors"]
    shown = {"sanitizer": entry["summary"], "sanitizer_errors": errors[:SHOWN_ERRORS],
             "note": "compute-sanitizer found memory or synchronization errors in your kernels: such a candidate "
                     "scores zero however fast it is; fix the accesses at these lines"}
    return shown | ({"more_sanitizer_errors": len(errors) - SHOWN_ERRORS} if len(errors) > SHOWN_ERRORS else {})


def _shown_path(uri: str, candidate: Path, folder: Path) -> str | None:
    path, folder = uri_to_path(uri).resolve(), folder.resolve()
    if path == candidate.resolve():
        return None
    return path.relative_to(folder).as_posix() if path.is_relative_to(folder) else str(path)


def _short(message: str) -> str:
    message = " ".join(str(message).split())
    return message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS - 3] + "..."
