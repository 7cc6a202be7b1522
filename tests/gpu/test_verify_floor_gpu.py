"""The physical floor on a real GPU: measured peaks are plausible, cached, and honest stock kernels pass."""

from __future__ import annotations

import os

import pytest

from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch")]


def test_measured_h200_peaks_are_plausible_and_cached(tmp_path) -> None:
    import torch

    from kernel_lsp.verify.floor import device_peaks

    peaks = device_peaks("cuda", tmp_path)
    print(f"{torch.cuda.get_device_name()}: {peaks.bandwidth_gbs:.0f} GB/s, {peaks.peak_tflops:.0f} TFLOPS")
    assert 2000 <= peaks.bandwidth_gbs <= 5000  # H200 HBM3e: 4.8 TB/s on paper
    assert peaks.peak_tflops > 100
    assert device_peaks("cuda", tmp_path) == peaks
    assert len(list((tmp_path / "peaks").glob("*.json"))) == 1


def test_stock_kernels_are_never_below_the_floor(tmp_path) -> None:
    import torch

    from kernel_lsp.verify.floor import Floor, below_floor, device_peaks, problem_work
    from kernel_lsp.candidate.timing import make_input_sets, time_callable

    peaks = device_peaks("cuda", tmp_path)
    problems = [(torch.relu, lambda: [torch.randn(16384, 16384)]),
                (lambda x: x.sum(dim=1), lambda: [torch.randn(65536, 4096)]),  # reads only: the closest to the bytes
                (torch.matmul, lambda: [torch.randn(4096, 4096).half(), torch.randn(4096, 4096).half()])]
    for function, get_inputs in problems:
        input_sets = make_input_sets(get_inputs, 2, seed=0, device="cuda")
        floor = Floor(problem_work(function, input_sets[0]), peaks)
        timing = time_callable(function, input_sets, device="cuda", calls=20, warmup=3)
        assert below_floor(timing.median_ms, floor, device="cuda") is None  # the bytes at 0.8, the FLOPs at 0.5
        assert timing.median_ms >= 0.5 * floor.ms


def test_gpu_state_records_clocks_around_a_timing() -> None:
    from kernel_lsp.verify.baselines import gpu_state

    state = gpu_state("cuda")
    if "unavailable" in state:
        pytest.skip(state["unavailable"])
    assert state["name"] and "smClockMHz" in state
    assert all(process["pid"] != os.getpid() for process in state.get("otherProcesses", []))
