"""compute-sanitizer's reports (profilers/sanitizer.py) and their findings (kernel_lsp/profile/sanitize.py), over
the output recorded on the GPU machine (tests/fixtures/sanitizer/README.md): each tool's error forms, many errors
in one run, errors in PyTorch's kernels, a cut-short log; findings on the lines of the load_inline strings."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from kernel_lsp.contracts.codec import encode
from kernel_lsp.findings import uri_to_path
from kernel_lsp.profile.sanitize import (
    SanitizeRun,
    ToolRun,
    sanitize_findings,
    sanitize_report,
    summary_line,
    tool_problem,
)
from profilers.sanitizer import parse_report, sanitizer_command
from tests.gpu.sanitizer_candidates import CANDIDATES, bug_line

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "sanitizer"


def recorded(name: str) -> str:
    plain = RECORDED / name
    if plain.is_file():
        return plain.read_text()
    return gzip.decompress((RECORDED / f"{name}.gz").read_bytes()).decode()


def findings_of(name: str, tool: str, path: str = "/work/cand.py"):
    """The recorded log of candidate `name` as the job would turn it into findings (its file named `cand.py`)."""
    report = parse_report(recorded(f"{name}.{tool}.log"), tool)
    run = SanitizeRun(runs=[ToolRun(tool, report, 1.0)])
    files = {"cand.py": CANDIDATES[name]}
    findings, library = sanitize_findings(run, files, files, {"cand.py": path}, "cand.py")
    return run, findings, library


def test_racecheck_analysis_gives_both_accesses_and_the_hazard_count():
    report = parse_report(recorded("race.racecheck.log"), "racecheck")
    assert report.complete and report.reported == 1 and report.warnings == 0
    [race] = report.errors
    assert race.kind == "race" and race.severity == "error" and race.hazards == 2097152
    assert (race.access, race.site.kernel, race.site.file, race.site.line) == ("read", "row_sum", "cuda.cu", 13)
    assert (race.other_access, race.other.line) == ("write", 11)
    assert "read access at row_sum line 13 and write access at row_sum line 11 (2097152 hazards)" in race.describe()


def test_the_race_lands_on_the_read_in_the_py_string_with_the_write_related():
    _, [finding], library = findings_of("race", "racecheck")
    assert library == [] and finding.code == "sanitizer-racecheck" and finding.severity == 1
    assert finding.range.start.line == bug_line(CANDIDATES["race"]) - 1  # the read, in the .py file
    lines = CANDIDATES["race"].splitlines()
    [related] = finding.related
    assert "partial[t] = x[" in lines[related.range.start.line]  # the write, also mapped into the string


def test_a_cut_short_synccheck_log_keeps_its_errors_and_says_it_is_incomplete():
    report = parse_report(recorded("sync.synccheck.log"), "synccheck")
    assert not report.complete and report.reported is None and not report.clean
    assert len(report.errors) == 100 and {e.kind for e in report.errors} == {"barrier"}  # its print limit
    first = report.errors[0]
    assert first.site.kernel == "pair_swap" and first.site.line == 12 and first.thread and first.block
    run, [finding], _ = findings_of("sync", "synccheck")
    assert finding.range.start.line == bug_line(CANDIDATES["sync"]) - 1
    assert f"(and {len(report.errors) - 1} more like it)" in finding.message
    assert finding.data["count"] == len(report.errors)


def test_memcheck_many_errors_then_the_failed_calls_that_followed():
    report = parse_report(recorded("many.memcheck.log"), "memcheck")
    assert report.complete and report.reported == 49
    kinds = [e.kind for e in report.errors]
    assert kinds.count("out-of-bounds") == 46 and kinds.count("api-error") == 3
    first = report.errors[0]
    assert (first.space, first.access, first.size) == ("global", "read", 4)
    assert first.relation == "4 bytes just past the end of a 72-byte allocation"  # "1 bytes after": base+72
    assert "in relu_far" in first.describe() and "thread (18,0,0) of block (4080,0,0)" in first.describe()
    run, findings, library = findings_of("many", "memcheck")
    assert library == []  # the failed calls have no kernel: notes of the run, not someone else's kernel
    assert any("cudaErrorLaunchFailure" in note for note in run.runs[0].notes)
    [finding] = findings
    assert finding.code == "sanitizer-memcheck" and finding.range.start.line == bug_line(CANDIDATES["many"]) - 1
    assert summary_line(run, findings, library) == "errors found: memcheck 46"


def test_pytorchs_own_kernel_is_kept_apart_and_the_print_limit_is_seen():
    report = parse_report(recorded("library.initcheck.log"), "initcheck")
    assert report.complete and report.reported == 1024 and report.not_printed and len(report.errors) == 100
    error = report.errors[0]
    assert error.kind == "uninitialized" and error.size == 16 and error.site.kernel == "reduce_kernel"
    assert error.site.file is None  # PyTorch has no line info
    run, findings, library = findings_of("library", "initcheck", "/work/cand.py")
    [finding] = findings
    assert finding.code == "sanitizer-library" and finding.severity == 3 and len(library) == 100
    assert CANDIDATES["library"].splitlines()[finding.range.start.line].startswith("class ModelNew")
    assert "reduce_kernel" in finding.message and uri_to_path(finding.uri) == Path("/work/cand.py")
    report_dict = encode(sanitize_report(run, findings, library))
    assert report_dict["errors"] == 0 and report_dict["clean"] and summary_line(run, findings, library) == (
        "clean: initcheck 0 · 100 in others' kernels")


@pytest.mark.parametrize("name, tool", [("clean", "memcheck"), ("clean", "racecheck"), ("clean", "initcheck"),
                                        ("clean", "synccheck"), ("oob", "memcheck"), ("uninit_shared", "initcheck"),
                                        ("uninit_shared", "racecheck")])
def test_empty_reports_are_clean(name: str, tool: str):
    report = parse_report(recorded(f"{name}.{tool}.log"), tool)
    assert report.complete and report.reported == 0 and report.errors == [] and report.clean


def test_a_log_cut_inside_an_error_keeps_what_was_printed():
    text = recorded("race.racecheck.log")
    cut = text[:text.index(" and Write access")]  # killed mid-error: the second site never printed
    report = parse_report(cut, "racecheck")
    assert not report.complete and len(report.errors) == 1 and report.errors[0].other is None
    assert parse_report("", "memcheck").complete is False


def test_the_command_runs_one_tool_with_its_log_apart():
    argv = sanitizer_command("memcheck", ["python", "-m", "x"], Path("/tmp/m.log"), "cs", 50)
    assert argv[:3] == ["cs", "--tool", "memcheck"] and "--padding" in argv and argv[-3:] == ["python", "-m", "x"]
    assert argv[argv.index("--log-file") + 1] == "/tmp/m.log" and argv[argv.index("--print-limit") + 1] == "50"
    assert "--leak-check" not in sanitizer_command("racecheck", ["p"], Path("l"))
    with pytest.raises(ValueError, match="unknown compute-sanitizer tool"):
        sanitizer_command("leakcheck", ["p"], Path("l"))
    # the options it passes are the recorded compute-sanitizer's own
    known = recorded("help.txt")
    for option in [a for a in sanitizer_command("memcheck", ["p"], Path("l")) if a.startswith("--")]:
        assert option in known, option


def test_a_run_that_proves_nothing_is_a_problem_not_clean():
    """What makes a tool's run no proof of a clean candidate. The complaint is written in the recorded logs' form
    (the text seen on the gVisor H200 machines, "Device not supported", per the device notes: not recorded here)."""
    clean = parse_report(recorded("clean.memcheck.log"), "memcheck")
    assert tool_problem("memcheck", clean, 0, False, 300, "") is None
    stopped = tool_problem("memcheck", clean, None, True, 300, "")
    assert stopped.code == "sanitize-tool-stopped" and "ran past 300 s" in stopped.message
    cut = parse_report(recorded("sync.synccheck.log"), "synccheck")
    unfinished = tool_problem("synccheck", cut, -9, False, 300, "killed")
    assert unfinished.code == "sanitize-no-summary" and "printed no summary" in unfinished.message
    refused = parse_report("========= COMPUTE-SANITIZER\n========= Error: Device not supported.\n"
                           "========= ERROR SUMMARY: 1 error\n", "memcheck")
    complaint = tool_problem("memcheck", refused, 255, False, 300, "")
    assert complaint.code == "sanitize-tool-complaint"
    assert "could not check the program: Error: Device not supported" in complaint.message
    failed = tool_problem("memcheck", clean, 1, False, 300, "Traceback")
    assert failed.code == "sanitize-program-failed" and "failed under memcheck (exit 1)" in failed.message
    many = parse_report(recorded("many.memcheck.log"), "memcheck")  # its failed CUDA calls follow kernel errors
    assert tool_problem("memcheck", many, 1, False, 300, "") is None


def test_a_standalone_programs_error_lands_on_its_cu_line():
    """The standalone program's own memcheck log (built by nvcc -lineinfo from a path, run on 1000000 floats):
    the read one past the end at `standalone.cu:8`, then the launch failure memcheck's stop caused, a note. A site
    under the task folder (nvcc keeps the path it was given) lands on the same line."""
    from tests.gpu.sanitizer_candidates import STANDALONE

    assert recorded("standalone.plain.out").strip() == "ok 1000000"  # the plain run passed: only memcheck sees it
    files = {"standalone.cu": STANDALONE}
    for text in (recorded("standalone.memcheck.log"),
                 recorded("standalone.memcheck.log").replace("in standalone.cu:8",
                                                             "in /tmp/kernel-lsp-sanitize-x1/task/standalone.cu:8")):
        report = parse_report(text, "memcheck")
        assert report.complete and report.reported == 2
        run = SanitizeRun(runs=[ToolRun("memcheck", report, 1.0)])
        [finding], library = sanitize_findings(run, files, files, {"standalone.cu": "/home/u/prog.cu"},
                                               "standalone.cu")
        assert library == [] and uri_to_path(finding.uri) == Path("/home/u/prog.cu")
        assert finding.range.start.line == bug_line(STANDALONE) - 1 and finding.code == "sanitizer-memcheck"
        assert "4 bytes just past the end of a 4000000-byte allocation" in finding.message, finding.message
        assert "(64,0,0)" in finding.message and "(3906,0,0)" in finding.message, finding.message
        [note] = run.runs[0].notes
        assert "cudaErrorLaunchFailure" in note and "cudaDeviceSynchronize" in note
    for tool in ("racecheck", "initcheck", "synccheck"):  # nothing for the other tools to find there
        report = parse_report(recorded(f"standalone.{tool}.log"), tool)
        assert report.complete and report.errors == [], tool


def test_with_padding_the_read_past_the_input_is_found_on_its_line():
    """With --padding (64 bytes in this recording; the job asks 4096) the allocation after the input no longer
    starts right at its end, so the read one element past it is out of bounds; without it, memcheck saw nothing
    (oob.memcheck.log)."""
    assert parse_report(recorded("oob.memcheck.log"), "memcheck").errors == []
    report = parse_report(recorded("oob.memcheck.padding.log"), "memcheck")
    run = SanitizeRun(runs=[ToolRun("memcheck", report, 1.0)])
    files = {"cand.py": CANDIDATES["oob"]}
    [finding], library = sanitize_findings(run, files, files, {"cand.py": "/work/cand.py"}, "cand.py")
    assert library == [] and finding.range.start.line == bug_line(CANDIDATES["oob"]) - 1
    assert "4 bytes just past the end of a 4194304-byte allocation" in finding.message, finding.message
