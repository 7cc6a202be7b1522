"""The hover card on a kernel name, from the H200 fixture's ncu export read as the server imports it."""

from __future__ import annotations

import re

import pytest

from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.profile_report import KernelMetrics, KernelProfile, ProfileHint, ProfileReport
from kernel_lsp.server.hover_card import (
    NO_PROFILE,
    CardFacts,
    gain,
    hover_card,
    roofline_line,
    short_message,
    top_hints,
    unique_lines,
)
from kernel_lsp.profile.report import NO_CEILINGS, imported_report
from kernel_lsp.server.profile_report import ceilings_from, point_from
from profilers.roofline import Ceilings, KernelPoint
from tests.conftest import FIXTURES

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"needs the recorded fixtures at {FIXTURES}")

PTXAS = {"name": "smem_conflict(float *)", "arch": "sm_90", "registers": 32, "stackFrame": 0, "spillStores": 0,
         "spillLoads": 0, "sharedBytes": 4096, "barriers": 1}


@pytest.fixture(scope="module")
def report() -> ProfileReport:
    return imported_report((FIXTURES / "ncu_details.csv").read_text(), (FIXTURES / "ncu_raw.csv").read_text())


def facts(report: ProfileReport, kernel: str, **extra) -> CardFacts:
    profile = next(k for k in report.kernels if k.kernel == kernel)
    return CardFacts(kernel, profile, ceilings_from(report), point_from(profile), **extra)


def test_import_with_the_raw_page_has_ceilings_and_one_profile_per_kernel(report: ProfileReport):
    wire = encode(report)
    assert wire["source"] == "import-csv" and wire["gpu"] == "NVIDIA H200" and not wire["problems"]
    assert [k["kernel"] for k in wire["kernels"]] == ["vec_add", "transpose_read_uncoalesced", "smem_conflict",
                                                      "divergent", "spills", "tiny_grid", "matmul_naive"]
    assert round(ceilings_from(report).dram_bandwidth_gbs) == 4809


def test_import_without_the_raw_page_says_the_roofline_needs_it():
    report = encode(imported_report((FIXTURES / "ncu_details.csv").read_text()))
    assert report["ceilings"] is None and report["problems"] == [{"code": NO_CEILINGS.code,
                                                                   "message": NO_CEILINGS.message}]


def test_card_of_a_profiled_kernel(report: ProfileReport):
    card = hover_card(facts(report, "smem_conflict", resources=(PTXAS,), verify_summary="correct 5/5 · 1.84× eager",
                            chart_uri="file:///cache/charts/smem.svg", source="import-csv ncu_details.csv"))
    assert card.startswith("**smem_conflict** · 153 µs · memory bound")
    assert "verify: correct 5/5 · 1.84× eager" in card
    assert "memory 95.0% of peak (L1/TEX 98.9%), compute 5.9%" in card
    assert "DRAM 460 of 4809 GB/s (9.6%)" in card
    hints = re.findall(r"^\d\. `([^`]+)` \(est\. gain ([\d.]+)%\)", card, re.MULTILINE)
    assert hints == [("ncu-SharedMemoryConflicts", "95.8"), ("ncu-UncoalescedSharedAccess", "91.3"),
                     ("ncu-MemoryCacheAccessPattern", "83.2")]
    assert "32 registers/thread · achieved occupancy 47.1%" in card
    assert "ptxas sm_90: 32 registers, 4096 B smem" in card
    assert "![roofline of smem_conflict](file:///cache/charts/smem.svg)" in card
    assert card.endswith("_profile: import-csv ncu_details.csv_")


def test_card_of_a_small_grid_names_the_hint(report: ProfileReport):
    card = hover_card(facts(report, "tiny_grid"))
    assert "latency bound" in card and "`hint-small-grid` (est. gain 97%): 4 blocks on 132 SMs" in card


def test_card_without_a_profile_shows_resources_and_how_to_profile():
    card = hover_card(CardFacts("smem_conflict", resources=(PTXAS,)))
    resources = "ptxas sm_90: 32 registers, 4096 B smem, 0/0 B spills, 0 B stack"
    assert card == f"**smem_conflict**\n\n{resources}\n\n_{NO_PROFILE}_"


def test_roofline_line_with_flop_counters_compares_against_the_attainable_roof():
    ceilings = Ceilings("GPU", dram_bandwidth_gbs=1000.0, fp32_tflops=50.0, tensor_tflops=None, how="test")
    point = KernelPoint("k", duration_s=1e-3, dram_bytes=1e9, flops=4e9, bytes_from="", flops_from="")
    profile = KernelProfile(kernel="k", name="k", id=0, bound=None, metrics=KernelMetrics(), findings=[], registers=None)
    line = roofline_line(profile, ceilings, point)  # 4 FLOP/B under a ridge of 50: the roof is 4 TFLOP/s
    assert line == "roofline: arithmetic intensity 4 FLOP/B (ridge 50) · 4 of 4 TFLOP/s attainable (100.0%)"


def test_top_hints_rank_kernel_wide_gains_first_and_keep_one_per_code():
    findings = [ProfileHint("a", "hint", "", 99.0, "local"), ProfileHint("b", "hint", "", 40.0, "global"),
                ProfileHint("b", "hint", "", 60.0, "global"), ProfileHint("c", "hint", "", None, None),
                ProfileHint("d", "hint", "", 10.0, "estimate")]
    assert [(f.code, f.estimated_speedup) for f in top_hints(findings)] == [("b", 60.0), ("d", 10.0), ("a", 99.0)]


def test_gain_says_when_it_is_local_or_unknown():
    assert gain(ProfileHint("x", "hint", "", 95.0, "local")) == "(est. gain 95% of one unit's time)"
    assert gain(ProfileHint("x", "hint", "", None, None)) == "(gain not estimated)"


def test_short_message_keeps_the_first_sentence_whole():
    assert short_message("Shared loads conflict 32.1 - way. Check the table.") == "Shared loads conflict 32.1 - way."
    long = ("Local-memory traffic from a 128 B stack frame per thread: 12 LDL / 4 STL instructions on lines 3, 4, 5, "
            "6, 7 and 2 more; the cause is no register spills, so a per-thread array indexed at run time.")
    assert short_message(long + " Index arrays with compile-time constants.") == long  # never cut mid-sentence


def test_card_says_each_line_once(report: ProfileReport):
    """Two ptxas-resources findings with the same figures (one kernel instantiated twice) and the verify summary
    also in a hint: the card shows each line once."""
    card = hover_card(facts(report, "smem_conflict", resources=(PTXAS, dict(PTXAS)),
                            verify_summary="correct 5/5 · 1.84× eager"))
    ptxas = "ptxas sm_90: 32 registers, 4096 B smem, 0/0 B spills, 0 B stack"
    assert card.count(ptxas) == 1
    lines = [line.strip() for line in card.splitlines() if line.strip()]
    assert len(lines) == len(set(lines)), card
    no_profile = hover_card(CardFacts("smem_conflict", resources=(PTXAS, PTXAS)))
    assert no_profile.count(ptxas) == 1


def test_unique_lines_keeps_the_first_of_each_and_drops_emptied_blocks():
    assert unique_lines("**k**\n\nverify: ok\n\nverify: ok\n\na\nb\na\n\nb") == "**k**\n\nverify: ok\n\na\nb"
