"""Device facts through NVML (nvidia-ml-py): what the GPU is and what state it is in right now.

Attached to timing results so a user can tell a noisy measurement (throttled clocks, another process
on the GPU) from a real one. Without NVML or a GPU, `device_facts` raises `NvmlUnavailable` with one
clear message. `energy_per_call` reads the total energy counter around a loop of calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class NvmlUnavailable(Exception):
    """NVML cannot be used here; the message says why and what to do."""


# nvmlClocksEventReason* bit -> short name (the older API calls them throttle reasons)
_CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}


def _nvml():
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable("nvidia-ml-py is not installed: pip install nvidia-ml-py") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML cannot start ({exc}): no NVIDIA driver or GPU on this machine") from exc
    return pynvml


def driver_version() -> str | None:
    try:
        nvml = _nvml()
    except NvmlUnavailable:
        return None
    return _text(nvml.nvmlSystemGetDriverVersion())


def device_facts(index: int = 0) -> dict[str, Any]:
    """Name, capability, memory, clocks, temperature, power, clock-event reasons, other processes."""
    nvml = _nvml()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML sees no GPU {index} ({exc})") from exc
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    facts: dict[str, Any] = {
        "index": index,
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "computeCapability": f"{major}.{minor}",
        "driver": _text(nvml.nvmlSystemGetDriverVersion()),
        "memoryTotalMiB": memory.total // 2**20,
        "memoryUsedMiB": memory.used // 2**20,
        "memoryFreeMiB": memory.free // 2**20,
    }
    facts.update(_optional(nvml, handle))
    return facts


def _optional(nvml, handle) -> dict[str, Any]:
    """Readings some GPUs or drivers do not offer: each one that fails is left out, not guessed."""
    readings = {
        "smClockMHz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
        "memClockMHz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
        "maxSmClockMHz": lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
        "temperatureC": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        "powerW": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
        "powerLimitW": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
        "energyMJ": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle),
        "utilizationPercent": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
        "clockEventReasons": lambda: clock_event_reasons(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
        "otherProcesses": lambda: [{"pid": p.pid, "usedMiB": (p.usedGpuMemory or 0) // 2**20}
                                   for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)],
    }
    out: dict[str, Any] = {}
    for key, read in readings.items():
        try:
            out[key] = read()
        except (nvml.NVMLError, AttributeError):
            continue
    return out


def clock_event_reasons(mask: int) -> list[str]:
    return [name for bit, name in _CLOCK_EVENT_REASONS.items() if mask & bit]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- energy ---------------------------------------------------------------------------------------------

ENERGY_MIN_SECONDS = 0.5  # the energy counter updates every few to tens of ms: a longer loop averages its steps


def energy_counter_mj(index: int = 0) -> int:
    """The GPU's total energy counter (mJ since the driver loaded; Volta and newer)."""
    nvml = _nvml()
    try:
        return int(nvml.nvmlDeviceGetTotalEnergyConsumption(nvml.nvmlDeviceGetHandleByIndex(index)))
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML cannot read GPU {index}'s energy counter ({exc}): it needs a Volta or "
                              "newer GPU") from exc


def energy_per_call(call: Callable[[], Any], synchronize: Callable[[], Any], index: int = 0,
                    min_seconds: float = ENERGY_MIN_SECONDS) -> dict[str, Any]:
    """Energy of one `call` in mJ: the counter read around a loop of calls lasting at least min_seconds.

    The whole GPU's energy: idle power and other processes' work are counted too, so read it on a quiet GPU.
    """
    synchronize()
    start_mj, start = energy_counter_mj(index), time.perf_counter()
    calls = 0
    while time.perf_counter() - start < min_seconds:
        call()
        calls += 1
        if calls % 8 == 0:
            synchronize()  # the clock must see the GPU's time, not how fast launches queue
    synchronize()
    seconds, used_mj = time.perf_counter() - start, energy_counter_mj(index) - start_mj
    return {"mj_per_call": used_mj / calls, "calls": calls, "seconds": seconds,
            "average_power_w": used_mj / 1000 / seconds if seconds > 0 else None,
            "how": f"NVML total energy counter around {calls} calls ({seconds:.2f} s), whole GPU"}
