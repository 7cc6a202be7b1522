"""ProfileReports from the H200 fixture's ncu export (details and raw pages) and SASS, and the findings they give."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.profile_report import KernelProfile, ProfileHint, ProfileProblem
from kernel_lsp.findings import Range, Severity
from kernel_lsp.profile.locations import Location, kernel_locations
from kernel_lsp.profile.report import (
    imported_kernels,
    launch_profile,
    profile_findings,
    profile_report,
    summary_line,
)
from profilers.ncu import parse_details_csv
from profilers.sass import parse_sass_stats

from tests.paths import FIXTURES
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"needs the recorded fixtures at {FIXTURES}")

KNOWN_PROBLEMS = {  # kernel -> a code its profile must carry
    "vec_add": "hint-memory-bound",
    "transpose_read_uncoalesced": "ncu-UncoalescedGlobalAccess",
    "smem_conflict": "ncu-SharedMemoryConflicts",
    "divergent": "ncu-ThreadDivergence",
    "spills": "hint-local-memory",
    "tiny_grid": "hint-small-grid",
    "matmul_naive": "hint-memory-bound",
}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def by_kernel(kernels: list[KernelProfile]) -> dict[str, dict]:
    """The kernels as the wire has them, by name."""
    return {kernel.kernel: encode(kernel) for kernel in kernels}


def codes(kernel: dict) -> set[str]:
    return {finding["code"] for finding in kernel["findings"]}


def test_each_fixture_kernel_carries_its_known_problem_with_the_raw_page():
    kernels = by_kernel(imported_kernels(fixture("ncu_details.csv"), fixture("ncu_raw.csv")))
    assert list(kernels) == list(KNOWN_PROBLEMS)
    for name, code in KNOWN_PROBLEMS.items():
        assert code in codes(kernels[name]), (name, codes(kernels[name]))
    assert kernels["vec_add"]["bound"] == "memory" and kernels["tiny_grid"]["bound"] == "latency"
    assert kernels["vec_add"]["point"]["bytes_from"] == "ncu DRAM counters"


def test_details_alone_still_name_local_memory_for_spills_and_give_the_launch_facts():
    kernels = by_kernel(imported_kernels(fixture("ncu_details.csv")))
    spills = kernels["spills"]
    assert any("local loads" in finding["message"] for finding in spills["findings"])
    vec_add = kernels["vec_add"]
    assert vec_add["registers"] == 16 and vec_add["occupancy_pct"] == pytest.approx(74.17)
    assert vec_add["block"] == [256, 1, 1] and vec_add["grid"] == [65536, 1, 1]
    assert 0.01 < vec_add["duration_ms"] < 1


def test_sass_of_the_kernel_adds_the_sass_rules_hints_once():
    launches = {launch.base_name: launch for launch in parse_details_csv(fixture("ncu_details.csv"))}
    sass = {stats.base_name: stats for stats in parse_sass_stats(fixture("cuobjdump_sass.txt"))}
    matmul = encode(launch_profile(launches["matmul_naive"], sass=sass["matmul_naive"]))
    assert "hint-no-tensor-cores" in codes(matmul) and matmul["sass"]["fma"] > 0
    assert matmul["sass"]["tensor_core"] == {}
    spills = encode(launch_profile(launches["spills"], sass=sass["spills"]))
    assert [f["code"] for f in spills["findings"]].count("hint-local-memory") == 1


def test_findings_sit_on_their_line_else_on_the_kernel_name_and_are_never_errors(tmp_path: Path):
    kernels = imported_kernels(fixture("ncu_details.csv"))
    kernels[0].findings.append(ProfileHint("hint-spills", "warning", "spills", None, None, str(tmp_path / "k.cu"), 12))
    report = profile_report("import-csv", kernels)
    source = str(tmp_path / "kernels.cu")
    locations = kernel_locations({"kernels.cu": fixture("kernels.cu")}, {"kernels.cu": source})
    findings = profile_findings(report.kernels, locations, source)
    assert all(f.severity in (Severity.INFORMATION, Severity.HINT) for f in findings)
    spills = next(f for f in findings if f.code == "hint-spills")
    assert spills.range.start.line == 11 and spills.uri.endswith("/k.cu")
    small_grid = next(f for f in findings if f.code == "hint-small-grid")
    assert small_grid.range == locations["tiny_grid"].range and "tiny_grid:" in small_grid.message
    assert "estimated gain 97%" in small_grid.message


def test_a_kernel_nowhere_in_the_files_goes_to_line_one_of_the_candidate(tmp_path: Path):
    report = profile_report("import-csv", imported_kernels(fixture("ncu_details.csv"))[:1])
    findings = profile_findings(report.kernels, {"other": Location("x.cu", Range.line(3))}, str(tmp_path / "cand.py"))
    assert {f.range.start.line for f in findings} == {0} and findings[0].uri.endswith("/cand.py")


def test_summary_names_each_kernel_or_what_went_wrong():
    report = profile_report("ncu", imported_kernels(fixture("ncu_details.csv"))[:2], gpu="NVIDIA H200")
    assert summary_line(report).startswith("2 kernels (ncu on NVIDIA H200): vec_add memory bound 58.9 µs")
    empty = profile_report("ncu", [], problems=[ProfileProblem("profile-ncu-failed", "ncu is not on PATH")])
    assert encode(empty)["problems"] == [{"code": "profile-ncu-failed", "message": "ncu is not on PATH"}]
    assert summary_line(empty) == "no kernel profiled: ncu is not on PATH"


def test_a_kernel_profiled_twice_gives_its_findings_once(tmp_path: Path):
    first = imported_kernels(fixture("ncu_details.csv"))[0]
    report = profile_report("ncu", [first, dataclasses.replace(first, id=7)])
    findings = profile_findings(report.kernels, {}, str(tmp_path / "cand.py"))
    assert len(findings) == len(first.findings)
