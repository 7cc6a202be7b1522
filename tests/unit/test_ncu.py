"""Nsight Compute: the details and raw CSV pages recorded on an H200, the command, and ncu's known failures."""

from __future__ import annotations

import pytest

from profilers import ncu
from profilers.ncu import (
    SPEED_OF_LIGHT, Metric, NcuFailed, NcuNoKernelsProfiled, NcuNotFound, NcuPermissionDenied, check_ncu_output,
    ncu_command, parse_details_csv, parse_number, parse_raw_csv, unit_scale, with_raw,
)
from tests.conftest import FIXTURES

KERNELS = ["vec_add", "transpose_read_uncoalesced", "smem_conflict", "divergent", "spills", "tiny_grid",
           "matmul_naive"]
# the wording ncu prints when the driver keeps the counters to administrators
PERMISSION_OUTPUT = """\
==PROF== Connected to process 4242 (/usr/bin/python3.11)
==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters on the \
target device 0. For instructions on enabling permissions and to get more information see \
https://developer.nvidia.com/ERR_NVGPUCTRPERM
==PROF== Disconnected from process 4242
"""


@pytest.fixture(scope="module")
def launches():
    details = parse_details_csv((FIXTURES / "ncu_details.csv").read_text())
    return with_raw(details, parse_raw_csv((FIXTURES / "ncu_raw.csv").read_text()))


# --- values ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("3,199,017,988.25", 3199017988.25), ("116,434", 116434.0), ("0.72", 0.72), ("0", 0.0), ("-1.5e3", -1500.0),
    ("", None), ("n/a", None), ("(!) n/a", None), ("PolicySpread", None), ("(256, 1, 1)", None), ("1,2", None),
])
def test_numbers_with_thousands_separators(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize("unit, scale", [
    ("Mbyte", 1e6), ("Gbyte", 1e9), ("byte", 1.0), ("Tbyte/s", 1e12), ("Kbyte/block", 1e3), ("us", 1e-6),
    ("ms", 1e-3), ("Ghz", 1e9), ("byte/usecond", 1e6), ("%", 1.0), ("cycle", 1.0), ("inst/cycle", 1.0), ("", 1.0),
])
def test_units_scale_to_bytes_seconds_and_hertz(unit, scale):
    assert unit_scale(unit) == pytest.approx(scale)


def test_metric_keeps_text_and_gives_number_and_base_value():
    metric = Metric("134.228480", "Mbyte")
    assert (metric.number, metric.base) == (pytest.approx(134.22848), pytest.approx(134_228_480))
    assert Metric("PolicySpread", "").to_dict() == {"value": "PolicySpread", "unit": ""}


# --- the details page -----------------------------------------------------------------------------------

def test_details_fixture_has_the_seven_launches_in_order(launches):
    assert [launch.base_name for launch in launches] == KERNELS
    assert [launch.id for launch in launches] == list(range(7))
    assert launches[0].kernel_name == "vec_add(const float *, const float *, float *, int)"


def test_launch_columns_block_grid_device_and_capability(launches):
    vec_add, transpose, matmul = launches[0], launches[1], launches[6]
    assert (vec_add.block_size, vec_add.grid_size) == ((256, 1, 1), (65536, 1, 1))
    assert transpose.grid_size == (16, 4096, 1) and transpose.blocks == 65536
    assert matmul.block_size == (16, 16, 1) and matmul.threads_per_block == 256
    assert {(launch.device, launch.compute_capability) for launch in launches} == {(0, "9.0")}


def test_metrics_by_section_and_name_with_units(launches):
    vec_add = launches[0]
    assert vec_add.metric(SPEED_OF_LIGHT, "Duration") == Metric("58.94", "us")
    assert vec_add.value(SPEED_OF_LIGHT, "Duration") == pytest.approx(58.94e-6)
    assert vec_add.value(SPEED_OF_LIGHT, "Elapsed Cycles") == 116434
    assert vec_add.value(SPEED_OF_LIGHT, "SM Frequency") == pytest.approx(1.97e9)
    assert vec_add.value("Launch Statistics", "Threads") == 16_777_216
    assert vec_add.metric("Launch Statistics", "Cluster Scheduling Policy").number is None
    assert vec_add.value(SPEED_OF_LIGHT, "no such metric") is None


def test_rule_columns_type_description_and_estimated_speedup(launches):
    rules = {rule.name: rule for rule in launches[1].rules}
    uncoalesced = rules["UncoalescedGlobalAccess"]
    assert (uncoalesced.section, uncoalesced.type) == ("SourceCounters", "OPT")
    assert (uncoalesced.speedup_type, uncoalesced.speedup) == ("global", 76.97)
    assert uncoalesced.description.startswith("This kernel has uncoalesced global accesses resulting in a total "
                                              "of 14680064 excessive sectors")
    bottleneck = rules["SOLBottleneck"]
    assert (bottleneck.type, bottleneck.speedup_type, bottleneck.speedup) == ("INF", None, None)


def test_repeated_rules_are_all_kept(launches):
    smem_conflict = launches[2]
    assert [rule.speedup for rule in smem_conflict.rules if rule.name == "SharedMemoryConflicts"] == [86.54, 95.82]


def test_metrics_by_section_nests_for_json(launches):
    nested = launches[5].metrics_by_section()
    assert nested["Launch Statistics"]["Grid Size"] == {"value": 4.0, "unit": ""}
    assert nested[SPEED_OF_LIGHT]["Duration"] == {"value": 11.95, "unit": "ms"}  # ncu picks the unit per value


def test_csv_printed_directly_among_ncu_and_program_lines():
    csv_text = (FIXTURES / "ncu_details.csv").read_text()
    header, first, *rest = csv_text.splitlines()
    mixed = "\n".join(["==PROF== Connected to process 1615 (./k)", header, first,
                       '==PROF== Profiling "vec_add" - 0: 0%....50%....100% - 34 passes', "ok", *rest,
                       "==PROF== Disconnected from process 1615"])
    assert [launch.base_name for launch in parse_details_csv(mixed)] == KERNELS


def test_output_without_csv_has_no_launches():
    assert parse_details_csv((FIXTURES / "ncu_run_log.txt").read_text()) == []
    assert parse_raw_csv("") == []


# --- the raw page ---------------------------------------------------------------------------------------

def test_raw_page_units_row_and_one_row_per_launch():
    raw = parse_raw_csv((FIXTURES / "ncu_raw.csv").read_text())
    assert [entry.id for entry in raw] == list(range(7))
    vec_add = raw[0].metrics
    assert vec_add["dram__bytes_read.sum"] == Metric("134.228480", "Mbyte")
    assert vec_add["dram__bytes_write.sum"].base == pytest.approx(54_970_000)
    assert vec_add["gpu__time_duration.sum"].base == pytest.approx(58.944e-6)
    assert vec_add["launch__grid_size"].number == 65536
    assert raw[6].kernel_name.startswith("matmul_naive(")


def test_raw_metrics_attach_to_their_launch(launches):
    spills = launches[4]
    assert spills.raw_value("smsp__sass_inst_executed_op_local_st.sum") == 2_097_152
    assert spills.raw_value("launch__grid_size") == spills.blocks
    assert launches[0].raw_value("no such metric") is None


# --- the command ----------------------------------------------------------------------------------------

def test_command_profiles_the_named_kernels_with_the_default_sections():
    argv = ncu_command(["./k", "--n", "4"], kernels=["vec_add", "tiny_grid"])
    assert argv[:3] == ["ncu", "--clock-control", "none"]
    sections = [argv[i + 1] for i, word in enumerate(argv) if word == "--section"]
    assert set(sections) >= {"SpeedOfLight", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis_Tables",
                             "WarpStateStats", "SchedulerStats", "SourceCounters", "ComputeWorkloadAnalysis",
                             "SpeedOfLight_RooflineChart"}
    assert argv[argv.index("-k") + 1] == "regex:^(vec_add|tiny_grid)$"
    assert argv[-6:] == ["--csv", "--page", "details", "./k", "--n", "4"]


def test_command_to_a_report_file_and_its_import(tmp_path):
    report = tmp_path / "rep.ncu-rep"
    argv = ncu_command(["python", "run.py"], sections=["SpeedOfLight"], report=report, launch_count=3)
    assert "-k" not in argv and "--csv" not in argv
    assert argv[argv.index("--export") + 1] == str(report)
    assert argv[argv.index("--launch-count") + 1] == "3"
    assert ncu.import_command(report, "raw") == ["ncu", "--import", str(report), "--csv", "--page", "raw"]


# --- failures -------------------------------------------------------------------------------------------

def test_counter_permission_refused_says_how_to_allow_it():
    with pytest.raises(NcuPermissionDenied) as raised:
        check_ncu_output(PERMISSION_OUTPUT, returncode=1)
    message = str(raised.value)
    assert "NVreg_RestrictProfilingToAdminUsers=0" in message and "root" in message
    assert "CAP_SYS_ADMIN" in message and ncu.PERMISSION_DOCS in message


def test_no_kernels_profiled_lists_the_kernels_ncu_saw():
    output = ("==PROF== Connected to process 77 (./k)\n==WARNING== No kernels were profiled.\n"
              "Available Kernels:\n  1. vec_add\n  2. matmul_naive\n\n==PROF== Disconnected from process 77\n")
    with pytest.raises(NcuNoKernelsProfiled) as raised:
        check_ncu_output(output)
    assert raised.value.available_kernels == ["vec_add", "matmul_naive"]
    assert "vec_add, matmul_naive" in str(raised.value)


def test_no_kernels_profiled_without_a_list():
    with pytest.raises(NcuNoKernelsProfiled) as raised:
        check_ncu_output("==WARNING== No kernels were profiled.\n")
    assert raised.value.available_kernels == []


def test_the_recorded_run_log_is_no_failure():
    check_ncu_output((FIXTURES / "ncu_run_log.txt").read_text(), returncode=0)


def test_other_errors_and_exit_statuses_fail():
    with pytest.raises(NcuFailed, match="The application returned an error code"):
        check_ncu_output("==ERROR== The application returned an error code (1).\n", returncode=1)
    with pytest.raises(NcuFailed, match="exit status 9"):
        check_ncu_output("", returncode=9)


def test_missing_ncu(monkeypatch):
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    with pytest.raises(NcuNotFound, match="Nsight Compute"):
        ncu.find_ncu()
    with pytest.raises(NcuNotFound):
        ncu.run_ncu(["/nonexistent/bin/ncu", "--version"])
