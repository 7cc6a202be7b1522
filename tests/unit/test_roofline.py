"""Roofline: ceilings (theoretical from ncu, measured and cached), kernel points, bounds and the SVG chart."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest

from kernel_lsp.profile import measure
from profilers.ncu import SPEED_OF_LIGHT, KernelLaunch, Metric, parse_details_csv, parse_raw_csv, with_raw
from profilers.roofline import (
    LATENCY_BELOW_PCT, Ceilings, KernelPoint, classify_bound, counted_flops, kernel_point, roofline_svg,
    theoretical_ceilings,
)
from tests.conftest import FIXTURES

H200_LIKE = Ceilings(gpu="NVIDIA H200", dram_bandwidth_gbs=4000.0, fp32_tflops=50.0, tensor_tflops=700.0,
                     how="test")
EXPECTED_BOUND = {"vec_add": "memory", "transpose_read_uncoalesced": "memory", "smem_conflict": "memory",
                  "divergent": "compute", "spills": "memory", "tiny_grid": "latency", "matmul_naive": "memory"}


@pytest.fixture(scope="module")
def launches() -> dict[str, KernelLaunch]:
    details = parse_details_csv((FIXTURES / "ncu_details.csv").read_text())
    joined = with_raw(details, parse_raw_csv((FIXTURES / "ncu_raw.csv").read_text()))
    return {launch.base_name: launch for launch in joined}


def sol_launch(memory_pct: float, compute_pct: float, **raw: float) -> KernelLaunch:
    metrics = {(SPEED_OF_LIGHT, "Memory Throughput"): Metric(str(memory_pct), "%"),
               (SPEED_OF_LIGHT, "Compute (SM) Throughput"): Metric(str(compute_pct), "%"),
               (SPEED_OF_LIGHT, "DRAM Throughput"): Metric(str(memory_pct), "%"),
               (SPEED_OF_LIGHT, "Duration"): Metric("10.00", "us")}
    return KernelLaunch(id=0, kernel_name="k(float *)", base_name="k", block_size=(128, 1, 1),
                        grid_size=(1024, 1, 1), device=0, compute_capability="9.0", metrics=metrics,
                        raw={name: Metric(str(value), "") for name, value in raw.items()})


# --- ceilings -------------------------------------------------------------------------------------------

def test_theoretical_ceilings_from_the_h200_raw_page(launches):
    ceilings = theoretical_ceilings(launches["vec_add"])
    assert ceilings.gpu == "NVIDIA H200"
    assert ceilings.dram_bandwidth_gbs == pytest.approx(4800, rel=0.01)  # HBM3e at 4.8 TB/s
    assert ceilings.fp32_tflops == pytest.approx(132 * 128 * 2 * 1.98e9 / 1e12)  # about 67 TFLOP/s
    assert ceilings.tensor_tflops is None
    assert ceilings.ridge_point == pytest.approx(13.9, rel=0.01)


def test_every_fixture_launch_implies_the_same_dram_peak(launches):
    peaks = [theoretical_ceilings(launch).dram_bandwidth_gbs for launch in launches.values()]
    assert max(peaks) / min(peaks) < 1.01


def test_no_theoretical_ceilings_without_the_raw_page():
    assert theoretical_ceilings(sol_launch(70, 20)) is None


def test_the_roof_is_bandwidth_below_the_ridge_and_the_peak_above():
    assert H200_LIKE.ridge_point == pytest.approx(12.5)
    assert H200_LIKE.attainable_flops(1.0) == pytest.approx(4e12)
    assert H200_LIKE.attainable_flops(100.0) == pytest.approx(50e12)
    assert H200_LIKE.attainable_flops(100.0, tflops=700.0) == pytest.approx(400e12)


def test_measured_ceilings_reuse_floor_peaks_and_cache_the_fp32_rate(tmp_path, monkeypatch):
    from kernel_lsp.verify import floor

    monkeypatch.setattr(floor, "measure_peaks", lambda device: floor.Peaks(900.0, 40.0, "fake peaks"))
    first = measure.measured_ceilings("cpu", tmp_path)
    assert (first.dram_bandwidth_gbs, first.tensor_tflops) == (900.0, 40.0)
    assert first.fp32_tflops > 0 and "fake peaks" in first.how

    def must_not_measure(device):
        raise AssertionError("the fp32 rate should come from the cache")

    monkeypatch.setattr(measure, "measure_fp32_tflops", must_not_measure)
    assert measure.measured_ceilings("cpu", tmp_path).fp32_tflops == first.fp32_tflops


def test_measuring_fp32_leaves_the_tf32_setting_as_it_was():
    import torch

    before = torch.backends.cuda.matmul.allow_tf32
    assert measure.measure_fp32_tflops(torch.device("cpu")) > 0
    assert torch.backends.cuda.matmul.allow_tf32 == before


# --- bounds ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", EXPECTED_BOUND)
def test_each_fixture_kernel_has_its_known_bound(launches, kernel):
    assert classify_bound(launches[kernel]).kind == EXPECTED_BOUND[kernel]


def test_matmul_naive_is_bound_by_l1_not_dram(launches):
    bound = classify_bound(launches["matmul_naive"])
    assert (bound.memory_unit, bound.memory_unit_pct) == ("L1/TEX", 97.83)
    assert launches["matmul_naive"].value(SPEED_OF_LIGHT, "DRAM Throughput") < 1


def test_latency_threshold_is_both_throughputs_under_60_percent():
    assert LATENCY_BELOW_PCT == 60.0
    assert classify_bound(sol_launch(59.9, 59.9)).kind == "latency"
    assert classify_bound(sol_launch(60.0, 10.0)).kind == "memory"
    assert classify_bound(sol_launch(30.0, 61.0)).kind == "compute"


def test_no_bound_without_the_speed_of_light_section():
    launch = sol_launch(70, 20)
    assert classify_bound(KernelLaunch(**{**launch.__dict__, "metrics": {}})) is None


# --- points ---------------------------------------------------------------------------------------------

def test_vec_add_point_from_dram_counters(launches):
    point = kernel_point(launches["vec_add"])
    assert point.dram_bytes == pytest.approx(134_228_480 + 54_970_000)
    assert point.duration_s == pytest.approx(58.94e-6)
    assert point.byte_rate == pytest.approx(3.21e12, rel=0.01)
    assert point.bytes_from == "ncu DRAM counters"


def test_the_fixture_has_no_flop_counters_so_no_intensity(launches):
    point = kernel_point(launches["matmul_naive"])
    assert point.flops is None and point.arithmetic_intensity is None
    assert "SpeedOfLight_RooflineChart" in point.flops_from


def test_bytes_from_the_details_page_need_a_bandwidth_ceiling():
    launch = sol_launch(50.0, 10.0)
    estimated = kernel_point(launch, H200_LIKE)
    assert estimated.dram_bytes == pytest.approx(0.5 * 4000e9 * 10e-6)
    assert estimated.bytes_from.startswith("DRAM Throughput %")
    assert kernel_point(launch).dram_bytes is None


def test_flops_count_fma_twice_from_sums_or_rates():
    sums = sol_launch(10, 80, **{"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 100,
                                 "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": 10,
                                 "smsp__sass_thread_inst_executed_op_dmul_pred_on.sum": 5})
    assert counted_flops(sums) == 215
    rates = sol_launch(10, 80, **{"smsp__sass_thread_inst_executed_op_hfma_pred_on.sum.per_cycle_elapsed": 4,
                                  "smsp__cycles_elapsed.avg": 1000})
    assert counted_flops(rates) == 8000
    point = kernel_point(sums, H200_LIKE)
    assert point.flop_rate == pytest.approx(215 / 10e-6)
    assert point.arithmetic_intensity == pytest.approx(215 / (0.1 * 4000e9 * 10e-6))


# --- the chart ------------------------------------------------------------------------------------------

def test_svg_chart_has_roofs_points_and_the_kernels_without_flops(launches):
    points = [kernel_point(launch) for launch in launches.values()]
    points.append(KernelPoint(kernel="a<b>", duration_s=1e-3, dram_bytes=1e9, flops=5e10, bytes_from="",
                              flops_from=""))
    svg = roofline_svg(H200_LIKE, points)
    root = ElementTree.fromstring(svg)  # well-formed, self-contained
    namespace = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{namespace}polyline")) == 2  # fp32 and tensor roofs
    assert sum(1 for _ in root.iter(f"{namespace}circle")) == 1
    assert "a&lt;b&gt;" in svg and "no FLOP counters for: vec_add" in svg


def test_svg_chart_without_a_tensor_ceiling_has_one_roof(launches):
    ceilings = theoretical_ceilings(launches["vec_add"])
    root = ElementTree.fromstring(roofline_svg(ceilings, []))
    assert len(root.findall("{http://www.w3.org/2000/svg}polyline")) == 1
