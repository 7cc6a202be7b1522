"""The torch profiler's kernel list summed per forward call, and NVML energy per call (counter faked)."""

from __future__ import annotations

import pytest

from profilers import nvml
from profilers.torch_kernels import KernelTime, kernel_times


def test_kernel_times_are_per_forward_call_costliest_first():
    events = [("gemm", 0.5), ("relu", 0.1), ("gemm", 0.25)] * 2 + [("gemm", 0.5), ("relu", 0.1), ("gemm", 0.25)]
    times = kernel_times(events, forward_calls=3)
    assert times == [KernelTime("gemm", pytest.approx(0.75), 2), KernelTime("relu", pytest.approx(0.1), 1)]
    assert times[0].to_dict() == {"name": "gemm", "device_ms": pytest.approx(0.75), "calls": 2}
    assert kernel_times([], 3) == []


def test_energy_per_call_reads_the_counter_around_the_loop(monkeypatch):
    readings = iter([1_000, 1_600])
    monkeypatch.setattr(nvml, "energy_counter_mj", lambda index=0: next(readings))
    calls, synchronized = [], []
    energy = nvml.energy_per_call(lambda: calls.append(1), lambda: synchronized.append(1), min_seconds=0.05)
    assert energy["calls"] == len(calls) > 0
    assert energy["mj_per_call"] == pytest.approx(600 / len(calls))
    assert energy["average_power_w"] == pytest.approx(0.6 / energy["seconds"])
    assert len(synchronized) >= 2 and "whole GPU" in energy["how"]


def test_without_nvml_the_energy_counter_says_why(monkeypatch):
    def unavailable():
        raise nvml.NvmlUnavailable("NVML cannot start (test): no NVIDIA driver or GPU on this machine")

    monkeypatch.setattr(nvml, "_nvml", unavailable)
    with pytest.raises(nvml.NvmlUnavailable, match="no NVIDIA driver"):
        nvml.energy_per_call(lambda: None, lambda: None)
