"""floor: the work a problem demands, peaks measured once per machine, and the below-floor verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernel_lsp.contracts.codec import encode
from kernel_lsp.verify import floor as floor_module
from kernel_lsp.verify.floor import Floor, Peaks, Work, below_floor, device_peaks, floor_ms, problem_work

PEAKS = Peaks(bandwidth_gbs=4000.0, peak_tflops=800.0, how="measured on a test GPU")


class Matmul(torch.nn.Module):
    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return left @ right


class Relu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class ReturnsItsInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_a_matmul_reference_does_two_m_n_k_flops_and_moves_its_operands_and_result() -> None:
    m, n, k = 64, 32, 48
    work = problem_work(Matmul(), [torch.randn(m, k), torch.randn(k, n)])
    assert work.flops == 2 * m * n * k
    assert work.bytes == 4 * (m * k + k * n + m * n)


def test_an_elementwise_reference_moves_its_input_and_output_and_counts_no_flops() -> None:
    x = torch.randn(1000, 10)
    work = problem_work(Relu(), [x])
    assert work == Work(bytes=2 * x.nbytes, flops=0)


def test_views_of_one_storage_count_once_and_broadcasts_count_their_distinct_elements() -> None:
    x = torch.randn(256)
    assert problem_work(ReturnsItsInput(), [x]).bytes == x.nbytes
    halves = x.view(2, 128)
    assert problem_work(lambda a, b: a, [halves[0], halves[1]]).bytes == 128 * 4  # largest view of the storage
    row = torch.randn(1, 64)
    assert problem_work(lambda wide: wide.sum(), [row.expand(1000, 64)]).bytes == 64 * 4 + 4


def test_the_floor_is_the_slower_of_moving_the_bytes_and_doing_the_flops() -> None:
    memory_bound = Work(bytes=4 * 10**9, flops=10**9)  # 1 ms at 4 TB/s, ~1.25 µs of compute
    compute_bound = Work(bytes=10**6, flops=8 * 10**12)  # 10 ms at 800 TFLOPS
    assert floor_ms(memory_bound, PEAKS) == pytest.approx(1.0)
    assert floor_ms(compute_bound, PEAKS) == pytest.approx(10.0)
    assert floor_ms(Work(bytes=0, flops=0), PEAKS) == 0.0


def test_below_half_the_floor_is_rejected_with_the_bound_that_binds() -> None:
    floor = Floor(Work(bytes=64 << 20, flops=0), PEAKS)
    message = below_floor(floor.ms * 0.2, floor)
    assert message is not None
    assert message.startswith(f"{floor.ms * 0.2 * 1e3:.3g} µs is below the physical floor {floor.ms * 1e3:.3g} µs")
    assert "64 MiB must move at ≤ 4 TB/s" in message and "measured on a test GPU" in message
    compute = Floor(Work(bytes=1024, flops=8 * 10**12), PEAKS)
    assert "8 TFLOP at ≤ 800 TFLOPS" in below_floor(1.0, compute)


def test_a_time_at_or_above_the_margin_is_no_finding() -> None:
    floor = Floor(Work(bytes=64 << 20, flops=0), PEAKS)
    assert below_floor(floor.ms * 0.5, floor) is None
    assert below_floor(floor.ms * 0.9, floor) is None  # an honest kernel may beat the measured copy a little
    assert below_floor(floor.ms * 0.9, floor, margin=1.0) is not None
    assert below_floor(0.0, Floor(Work(bytes=0, flops=0), PEAKS)) is None


def test_on_a_gpu_the_bytes_bound_is_tighter_than_the_flops_bound() -> None:
    memory = Floor(Work(bytes=64 << 20, flops=0), PEAKS)
    assert below_floor(memory.ms * 0.75, memory, device="cuda") is not None  # honest kernels reach 0.94 of it
    assert "under 80% of the floor" in below_floor(memory.ms * 0.75, memory, device="cuda")
    assert below_floor(memory.ms * 0.85, memory, device="cuda") is None
    assert below_floor(memory.ms * 0.75, memory, device="cpu") is None  # CPU caches are not flushed: half
    compute = Floor(Work(bytes=1024, flops=8 * 10**12), PEAKS)
    assert below_floor(compute.ms * 0.6, compute, device="cuda") is None  # fewer FLOPs than the reference's
    assert "under 50% of the floor" in below_floor(compute.ms * 0.4, compute, device="cuda")


def test_the_floor_reports_itself_as_the_contract_dict() -> None:
    floor = Floor(Work(bytes=4 * 10**9, flops=7), PEAKS)
    assert encode(floor.to_report()) == {"bytes": 4 * 10**9, "flops": 7, "floor_ms": pytest.approx(1.0),
                               "bandwidth_gbs": 4000.0, "peak_tflops": 800.0}


def test_cpu_peaks_are_measured_then_cached_and_a_cache_hit_measures_nothing(tmp_path, monkeypatch) -> None:
    measured = device_peaks("cpu", tmp_path)
    assert measured.bandwidth_gbs > 0.1 and measured.peak_tflops > 1e-4
    assert "measured on" in measured.how
    [cached_file] = (tmp_path / "peaks").glob("*.json")
    stored = json.loads(cached_file.read_text())
    assert (stored["torch"], stored["bandwidth_gbs"]) == (torch.__version__, measured.bandwidth_gbs)

    def must_not_measure(device: torch.device) -> Peaks:
        raise AssertionError("a cached device was measured again")

    monkeypatch.setattr(floor_module, "measure_peaks", must_not_measure)
    assert device_peaks("cpu", tmp_path) == measured


def test_a_corrupt_peaks_cache_is_measured_again_and_rewritten(tmp_path, monkeypatch) -> None:
    fake = Peaks(bandwidth_gbs=10.0, peak_tflops=0.5, how="measured by the test")
    monkeypatch.setattr(floor_module, "measure_peaks", lambda device: fake)
    path = floor_module.peaks_path(tmp_path, floor_module.device_name(torch.device("cpu")))
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert device_peaks("cpu", tmp_path) == fake
    assert json.loads(path.read_text())["how"] == "measured by the test"


def test_without_a_cache_dir_peaks_are_measured_every_time(monkeypatch) -> None:
    calls: list[torch.device] = []
    monkeypatch.setattr(floor_module, "measure_peaks", lambda device: calls.append(device) or PEAKS)
    assert device_peaks("cpu", None) == PEAKS
    assert device_peaks("cpu", None) == PEAKS
    assert calls == [torch.device("cpu"), torch.device("cpu")]


def test_a_problems_work_is_counted_once_per_reference_and_shapes(tmp_path: Path, monkeypatch) -> None:
    """The FLOPs and bytes of a reference on inputs of given shapes are kept in the judge's cache; other shapes,
    another reference, or an entry that does not read back are counted anew."""
    counted = []
    original = floor_module.problem_work
    monkeypatch.setattr(floor_module, "problem_work", lambda model, inputs: counted.append(1) or original(model, inputs))
    model = torch.nn.Linear(8, 4)
    small, large = (torch.ones(2, 8),), (torch.ones(16, 8),)
    first = floor_module.cached_problem_work(model, small, tmp_path, "reference A", [[[2, 8], "torch.float32"]])
    again = floor_module.cached_problem_work(model, small, tmp_path, "reference A", [[[2, 8], "torch.float32"]])
    assert first == again == original(model, small) and len(counted) == 1
    assert first.flops == 2 * 2 * 8 * 4
    other = floor_module.cached_problem_work(model, large, tmp_path, "reference A", [[[16, 8], "torch.float32"]])
    assert other.flops == 2 * 16 * 8 * 4 and len(counted) == 2
    floor_module.cached_problem_work(model, small, tmp_path, "reference B", [[[2, 8], "torch.float32"]])
    assert len(counted) == 3
    for stored in (tmp_path / "work").glob("*.json"):
        stored.write_text('{"bytes": -1, "flops": "many"}')  # tampered or damaged: not believed
    assert floor_module.cached_problem_work(model, small, tmp_path, "reference A", [[[2, 8], "torch.float32"]]) == first
    assert len(counted) == 4
    assert floor_module.cached_problem_work(model, small, None, "reference A", []) == first and len(counted) == 5
