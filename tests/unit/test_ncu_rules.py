"""Hints from ncu launches: each fixture kernel yields its known problem; our own rules on synthetic launches."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from profilers.hints.ncu_rules import kernel_report, ncu_hints
from profilers.ncu import SPEED_OF_LIGHT, Metric, RuleResult, parse_details_csv, parse_raw_csv, with_raw
from profilers.roofline import Ceilings, theoretical_ceilings
from tests.conftest import FIXTURES

# the problem each kernel in kernels.cu was written to have, as the hint code that must name it
KNOWN_PROBLEM = {
    "vec_add": "hint-memory-bound",
    "transpose_read_uncoalesced": "ncu-UncoalescedGlobalAccess",
    "smem_conflict": "ncu-SharedMemoryConflicts",
    "divergent": "ncu-ThreadDivergence",
    "spills": "hint-local-memory",
    "tiny_grid": "hint-small-grid",
    "matmul_naive": "ncu-MemoryCacheAccessPattern",
}


@pytest.fixture(scope="module")
def launches():
    details = parse_details_csv((FIXTURES / "ncu_details.csv").read_text())
    joined = with_raw(details, parse_raw_csv((FIXTURES / "ncu_raw.csv").read_text()))
    return {launch.base_name: launch for launch in joined}


def codes(hints) -> list[str]:
    return [hint.code for hint in hints]


def by_code(hints, code):
    return [hint for hint in hints if hint.code == code]


# --- the seven fixture kernels --------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", KNOWN_PROBLEM)
def test_each_fixture_kernel_yields_its_known_problem(launches, kernel):
    hints = ncu_hints(launches[kernel])
    assert KNOWN_PROBLEM[kernel] in codes(hints)
    assert {hint.kernel for hint in hints} == {kernel}


def test_vec_add_memory_bound_with_the_bandwidth_it_reached(launches):
    launch = launches["vec_add"]
    [bound] = by_code(ncu_hints(launch, theoretical_ceilings(launch)), "hint-memory-bound")
    assert bound.severity == "information"
    assert "DRAM moves 3210 GB/s of 4809 GB/s" in bound.message
    assert bound.metrics["roofline"]["dram_bytes"] == pytest.approx(189_198_480)


def test_uncoalesced_transpose_keeps_ncus_text_and_speedup(launches):
    [rule] = by_code(ncu_hints(launches["transpose_read_uncoalesced"]), "ncu-UncoalescedGlobalAccess")
    assert (rule.severity, rule.estimated_speedup, rule.speedup_type) == ("information", 76.97, "global")
    assert "14680064 excessive sectors" in rule.message


def test_bank_conflicts_for_shared_loads_and_stores(launches):
    conflicts = by_code(ncu_hints(launches["smem_conflict"]), "ncu-SharedMemoryConflicts")
    assert [hint.estimated_speedup for hint in conflicts] == [86.54, 95.82]
    assert all("32.0 - way bank conflict" in hint.message or "32.1 - way" in hint.message for hint in conflicts)


def test_divergent_kernel_is_compute_bound_with_thread_divergence(launches):
    hints = ncu_hints(launches["divergent"])
    assert {"ncu-ThreadDivergence", "hint-compute-bound"} <= set(codes(hints))


def test_spills_show_local_memory_from_ncu_rules_and_counters(launches):
    hints = ncu_hints(launches["spills"])
    local_patterns = [h for h in by_code(hints, "ncu-MemoryCacheAccessPattern") if "local" in h.message]
    assert len(local_patterns) == 2
    [local] = by_code(hints, "hint-local-memory")
    assert (local.metrics["local_loads"], local.metrics["local_stores"]) == (32_768, 2_097_152)


def test_tiny_grid_small_grid_and_latency_bound(launches):
    hints = ncu_hints(launches["tiny_grid"])
    [small] = by_code(hints, "hint-small-grid")
    assert small.metrics == {"blocks": 4, "sms": 132}
    assert small.estimated_speedup == pytest.approx(96.97)
    assert "hint-latency-bound" in codes(hints) and "ncu-LaunchConfiguration" in codes(hints)


def test_matmul_naive_memory_bound_on_l1(launches):
    [bound] = by_code(ncu_hints(launches["matmul_naive"]), "hint-memory-bound")
    assert "L1/TEX 97.8%" in bound.message


def test_no_own_false_alarms_on_the_fixture(launches):
    all_codes = [code for launch in launches.values() for code in codes(ncu_hints(launch))]
    for quiet in ("hint-block-size-not-multiple-of-32", "hint-launch-bound", "hint-clocks-throttled"):
        assert quiet not in all_codes
    assert [kernel for kernel, launch in launches.items() if "hint-small-grid" in codes(ncu_hints(launch))] \
        == ["tiny_grid"]
    assert [kernel for kernel, launch in launches.items() if "hint-local-memory" in codes(ncu_hints(launch))] \
        == ["spills"]


# --- ncu rule results -----------------------------------------------------------------------------------

def test_severity_follows_the_rule_type(launches):
    launch = replace(launches["vec_add"], rules=(
        RuleResult("S", "Opt", "OPT", "Do this.", "global", 12.0),
        RuleResult("S", "Warn", "WRN", "Careful.", None, None),
        RuleResult("S", "Info", "INF", "Note.", None, None),
    ))
    severities = {hint.code: hint.severity for hint in ncu_hints(launch)}
    assert (severities["ncu-Opt"], severities["ncu-Warn"], severities["ncu-Info"]) == \
        ("information", "warning", "hint")


def test_pointer_footnotes_and_empty_descriptions_are_left_out(launches):
    cpi_stalls = by_code(ncu_hints(launches["vec_add"]), "ncu-CPIStall")
    assert len(cpi_stalls) == 1 and cpi_stalls[0].metrics["rule_type"] == "OPT"
    empty = replace(launches["vec_add"], rules=(RuleResult("S", "Empty", "OPT", "", None, None),))
    assert "ncu-Empty" not in codes(ncu_hints(empty))


def test_a_lone_informational_rule_comes_through(launches):
    [bottleneck] = by_code(ncu_hints(launches["matmul_naive"]), "ncu-SOLBottleneck")
    assert bottleneck.severity == "hint" and "greater than 80.0%" in bottleneck.message


# --- our rules on synthetic launches --------------------------------------------------------------------

def test_block_size_not_a_multiple_of_32(launches):
    launch = replace(launches["vec_add"], block_size=(100, 1, 1))
    [hint] = by_code(ncu_hints(launch), "hint-block-size-not-multiple-of-32")
    assert hint.metrics["threads_per_block"] == 100
    assert hint.estimated_speedup == pytest.approx(100 * 28 / 128, abs=0.01)


def test_launch_bound_under_five_microseconds(launches):
    metrics = {**launches["vec_add"].metrics, (SPEED_OF_LIGHT, "Duration"): Metric("3.10", "us")}
    [hint] = by_code(ncu_hints(replace(launches["vec_add"], metrics=metrics)), "hint-launch-bound")
    assert "3.10 µs" in hint.message and "CUDA graph" in hint.message
    at_limit = {**metrics, (SPEED_OF_LIGHT, "Duration"): Metric("5.00", "us")}
    assert "hint-launch-bound" not in codes(ncu_hints(replace(launches["vec_add"], metrics=at_limit)))


def test_clocks_throttled_from_the_sol_clock(launches):
    metrics = {**launches["vec_add"].metrics, (SPEED_OF_LIGHT, "SM Frequency"): Metric("1.20", "Ghz")}
    [hint] = by_code(ncu_hints(replace(launches["vec_add"], metrics=metrics)), "hint-clocks-throttled")
    assert hint.severity == "warning" and "1.20 GHz of 1.98 GHz" in hint.message


def test_clocks_throttled_from_nvml_reasons_and_max_clock(launches):
    state = {"maxSmClockMHz": 1980, "clockEventReasons": ["gpu_idle", "sw_thermal_slowdown"]}
    [hint] = by_code(ncu_hints(launches["vec_add"], gpu_state=state), "hint-clocks-throttled")
    assert hint.metrics["reasons"] == ["sw_thermal_slowdown"]
    quiet = {"maxSmClockMHz": 1980, "clockEventReasons": ["gpu_idle"]}
    assert "hint-clocks-throttled" not in codes(ncu_hints(launches["vec_add"], gpu_state=quiet))


def test_clock_rule_needs_a_maximum_clock(launches):
    details_only = replace(launches["vec_add"], raw={},
                           metrics={**launches["vec_add"].metrics,
                                    (SPEED_OF_LIGHT, "SM Frequency"): Metric("1.00", "Ghz")})
    assert "hint-clocks-throttled" not in codes(ncu_hints(details_only))


# --- the --import-csv report ----------------------------------------------------------------------------

def test_kernel_reports_of_a_details_export_are_one_json_object_per_kernel():
    report = [kernel_report(launch) for launch in parse_details_csv((FIXTURES / "ncu_details.csv").read_text())]
    assert [entry["kernel"] for entry in report] == list(KNOWN_PROBLEM)
    assert [entry["bound"] for entry in report] == ["memory", "memory", "memory", "compute", "memory", "latency",
                                                   "memory"]
    tiny = report[5]
    assert tiny["metrics"]["Launch Statistics"]["Grid Size"] == {"value": 4.0, "unit": ""}
    assert any(finding["code"] == "hint-small-grid" for finding in tiny["findings"])
    assert set(tiny["findings"][0]) == {"code", "severity", "message", "estimated_speedup", "speedup_type"}
    json.dumps(report)  # plain JSON all the way down


def test_kernel_report_with_ceilings_names_the_bandwidth(launches):
    ceilings = Ceilings(gpu="g", dram_bandwidth_gbs=4000.0, fp32_tflops=60.0, tensor_tflops=None, how="t")
    report = kernel_report(launches["vec_add"], ceilings)
    [bound] = [f for f in report["findings"] if f["code"] == "hint-memory-bound"]
    assert "of 4000 GB/s measured" in bound["message"]


def test_hints_and_roofline_import_without_torch():
    # the server imports these modules, and the server never imports torch
    code = "import sys, profilers.hints.ncu_rules, profilers.roofline; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2]).returncode == 0
