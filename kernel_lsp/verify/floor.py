"""The physical floor: no correct implementation of a problem can run faster than the device allows.

A problem must at least read its inputs and write its outputs once (bytes over the measured copy bandwidth)
and do its arithmetic (FLOPs counted on the reference, over the measured peak of the fastest matmul). A
candidate timed well below that floor skipped work, reused results or did the work outside the timed region.
The floor assumes caches were flushed between timed calls, as time_callable does on CUDA; on the CPU, whose
caches are not flushed, the bandwidth is the best of a cache-resident and a memory-sized copy.

The peaks are cached per device and torch version, but only when they can be trusted: measured while the judge was
scheduled as it started (verify/schedule.py; a candidate's processes once reniced and pinned the judge, and its
copy bandwidth read 11 GB/s instead of ~160), and, on a GPU whose datasheet bandwidth NVML gives (memory clock and
bus width), not under DATASHEET_FRACTION of it. A cached figure that low is measured again; a fresh one that low
is not cached, and the datasheet figure stands in for it (a floor from a higher bandwidth is still a lower bound).
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from kernel_lsp.contracts.verify_report import Floor as ReportFloor
from kernel_lsp.verify.baselines import (
    BaselineCache,
    fit_to_measure,
    nvml_index_of,
    read_json_object,
    write_json_atomically,
)
from kernel_lsp.verify.schedule import judge_schedule
from kernel_lsp.candidate.timing import resolve_device, time_callable

log = logging.getLogger(__name__)

# How far under each bound a median may fall before it is impossible rather than excellent.
# Bytes on a GPU: with the L2 flushed before each call, PyTorch's own memory-bound kernels on an H200 came no
# closer than 0.94 of the bytes floor (a row sum, which only reads, beats the measured copy's bandwidth by ~6%;
# copy and ReLU 0.98-0.99; softmax 1.6; at sizes under the L2 cache, 1.1-10: launch and latency dominate);
# benchmarks/floor_margin.py, benchmarks/RESULTS.md. 0.8 leaves those kernels ~15% of room.
# Bytes on a CPU, whose caches are not flushed, and FLOPs anywhere stay at half: the FLOPs are counted on the
# reference, and an honest kernel may do fewer (a triangular or structured matmul skips the zeros).
BYTES_FLOOR_MARGIN = {"cuda": 0.8}
BELOW_FLOOR_MARGIN = 0.5
# A measured copy bandwidth under this share of the datasheet's (2 × max memory clock × bus width) is not believed:
# an undisturbed copy reaches most of it (the read and the written bytes both count)
DATASHEET_FRACTION = 0.25


@dataclass(frozen=True)
class MeasurementPlan:
    copy_sizes: tuple[int, ...]  # bytes per copy; the best bandwidth over the sizes counts
    matmul_size: int
    matmul_dtypes: tuple[torch.dtype, ...]  # the fastest counts, so the floor is a lower bound for any dtype
    repeats: int


CUDA_COPY_BYTES = 1 << 30
# cache-resident and memory-sized copies; float16 matmul has no fast path on most CPUs
CPU_PLAN = MeasurementPlan(copy_sizes=(1 << 20, 128 << 20), matmul_size=1024,
                           matmul_dtypes=(torch.float32, torch.bfloat16), repeats=5)


@dataclass(frozen=True)
class Work:
    bytes: int  # each input read once, each output written once; not the weights, which may be held in any form
    flops: int  # floating-point operations FlopCounterMode counts on the reference (0 for elementwise)


@dataclass(frozen=True)
class Peaks:
    bandwidth_gbs: float  # measured copy bandwidth, bytes read + written per second, in GB/s
    peak_tflops: float  # measured fastest matmul, in TFLOP/s
    how: str  # what was measured, where
    schedule: str | None = None  # why the judge was not fit to measure them (then not cached), or None
    datasheet: str | None = None  # why the datasheet bandwidth stands in for the measured one (not cached), or None


@dataclass(frozen=True)
class Floor:
    work: Work
    peaks: Peaks

    @property
    def ms(self) -> float:
        return floor_ms(self.work, self.peaks)

    def to_report(self) -> ReportFloor:
        """The report's floor; `schedule` and `datasheet` only where the peaks were not trusted enough to cache."""
        return ReportFloor(self.work.bytes, self.work.flops, self.ms, self.peaks.bandwidth_gbs,
                           self.peaks.peak_tflops, self.peaks.schedule, self.peaks.datasheet)


# --- the work a problem demands ---------------------------------------------------------------------------

def problem_work(model: Callable[..., object], inputs: list | tuple) -> Work:
    """Run the reference once, counting its FLOPs; bytes are those of the inputs and the outputs."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        outputs = model(*inputs)
    tensors = list(tensors_in(inputs)) + list(tensors_in(outputs))
    return Work(bytes=distinct_storage_bytes(tensors), flops=int(counter.get_total_flops()))


def cached_problem_work(model: Callable[..., object], inputs: list | tuple, cache_dir: Path | None,
                        reference_text: str, signature: list) -> Work:
    """problem_work, kept in the judge's cache per (reference, input shapes and dtypes, torch): a problem's FLOPs and
    bytes depend on nothing else, and counting them runs the reference under FlopCounterMode (about a second on the
    CPU, each verification of the same problem again). A stored entry that does not read back is counted anew."""
    if cache_dir is None:
        return problem_work(model, inputs)
    key = BaselineCache.key(reference_text, "work", torch.__version__, {"shapes": signature})
    path = Path(cache_dir) / "work" / f"{key}.json"
    stored = read_json_object(path)
    if stored is not None and all(isinstance(stored.get(name), int) and not isinstance(stored.get(name), bool)
                                  and stored[name] >= 0 for name in ("bytes", "flops")):
        return Work(bytes=stored["bytes"], flops=stored["flops"])
    work = problem_work(model, inputs)
    try:
        write_json_atomically(path, {"bytes": work.bytes, "flops": work.flops})
    except OSError:
        pass  # an unwritable cache only costs counting again next time
    return work


def tensors_in(value: object) -> Iterator[torch.Tensor]:
    """Every tensor in a nest of lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def distinct_storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes over distinct storages; views of one storage count once, as much as the largest view covers."""
    covered: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        if tensor.layout != torch.strided:
            continue  # sparse and other layouts: leaving them out keeps the floor a lower bound
        storage = tensor.untyped_storage()
        identity = (str(tensor.device), storage.data_ptr())
        covered[identity] = max(covered.get(identity, 0), min(view_bytes(tensor), storage.nbytes()))
    return sum(covered.values())


def view_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the distinct elements a view reaches: a broadcast (stride 0) dimension adds none."""
    if tensor.numel() == 0:
        return 0
    reached = math.prod(size for size, stride in zip(tensor.shape, tensor.stride()) if stride != 0)
    return reached * tensor.element_size()


# --- what the device can do -------------------------------------------------------------------------------

def device_peaks(device: str | torch.device, cache_dir: Path | None) -> Peaks:
    """Measured bandwidth and matmul peak of device, measured once per (device, torch) and cached as JSON; not
    cached when measured while the judge was disturbed or far under the datasheet bandwidth (see `trusted`)."""
    target = resolve_device(str(device))
    datasheet = datasheet_bandwidth_gbs(target)
    if cache_dir is None:
        return trusted(target, datasheet)
    name = device_name(target)
    path = peaks_path(cache_dir, name)
    cached = read_cached_peaks(path, name)
    if cached is not None:
        low = under_datasheet(cached.bandwidth_gbs, datasheet)
        if low is None:
            return cached
        log.warning("cached peaks %s discarded, measuring again: %s", path, low)
    peaks = trusted(target, datasheet)
    if peaks.schedule is None and peaks.datasheet is None:
        write_cached_peaks(path, name, peaks)
    return peaks


def trusted(target: torch.device, datasheet_gbs: float | None) -> Peaks:
    """measure_peaks with the judge's scheduling put back and checked before and checked after (a problem is the
    peaks' `schedule`), and the datasheet bandwidth in place of a measured one far under it (`datasheet`)."""
    before = fit_to_measure()
    peaks = measure_peaks(target)
    problem = before or judge_schedule()
    low = under_datasheet(peaks.bandwidth_gbs, datasheet_gbs)
    if low is not None and datasheet_gbs is not None:
        peaks = replace(peaks, bandwidth_gbs=datasheet_gbs, datasheet=low,
                        how=f"{peaks.how}; the datasheet bandwidth stands in ({low})")
    if problem is not None:
        peaks = replace(peaks, schedule=problem)
    return peaks


def under_datasheet(bandwidth_gbs: float, datasheet_gbs: float | None) -> str | None:
    """Why a measured bandwidth is not believed (under DATASHEET_FRACTION of the datasheet's), or None."""
    if datasheet_gbs is None or bandwidth_gbs >= DATASHEET_FRACTION * datasheet_gbs:
        return None
    return (f"the measured copy bandwidth {bandwidth_gbs:.3g} GB/s is under {DATASHEET_FRACTION:.0%} of the "
            f"datasheet's {datasheet_gbs:.4g} GB/s")


def datasheet_bandwidth_gbs(device: torch.device) -> float | None:
    """The device's memory bandwidth by its datasheet, from NVML: 2 (double data rate) × the maximum memory clock
    × the bus width. None on the CPU, without NVML, on a MIG-partitioned GPU (a slice gets part of it) or where
    NVML does not say."""
    if device.type != "cuda":
        return None
    nvml_index = nvml_index_of(device.index if device.index is not None else torch.cuda.current_device())
    return nvml_datasheet_gbs(nvml_index) if nvml_index is not None else None


@functools.lru_cache(maxsize=None)
def nvml_datasheet_gbs(nvml_index: int) -> float | None:
    try:
        from profilers.nvml import _nvml

        nvml = _nvml()
        handle = nvml.nvmlDeviceGetHandleByIndex(nvml_index)
        clock_mhz = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)
        bus_bits = nvml.nvmlDeviceGetMemoryBusWidth(handle)
    except Exception:  # NvmlUnavailable, an NVMLError, an old nvidia-ml-py: no datasheet, nothing to compare
        return None
    try:
        if nvml.nvmlDeviceGetMigMode(handle)[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return None
    except Exception:  # no MIG on this GPU or driver
        pass
    if not (is_positive_number(clock_mhz) and is_positive_number(bus_bits)):
        return None
    return 2 * clock_mhz * 1e6 * bus_bits / 8 / 1e9


def device_name(device: torch.device) -> str:
    """The model of the device; on the CPU with the thread count, which bounds what torch can reach."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()} ({torch.get_num_threads()} threads)"


def cpu_model() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cpuinfo = ""
    found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    return found.group(1).strip() if found else "cpu"


def peaks_path(cache_dir: Path, name: str) -> Path:
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{name}-torch-{torch.__version__}")
    return Path(cache_dir) / "peaks" / f"{key}.json"


def read_cached_peaks(path: Path, name: str) -> Peaks | None:
    """Peaks stored for this device and torch version; anything else in the file is a miss."""
    stored = read_json_object(path)
    if stored is None or (stored.get("device"), stored.get("torch")) != (name, torch.__version__):
        return None
    bandwidth, peak, how = stored.get("bandwidth_gbs"), stored.get("peak_tflops"), stored.get("how")
    if not (is_positive_number(bandwidth) and is_positive_number(peak) and isinstance(how, str)):
        return None
    return Peaks(bandwidth_gbs=float(bandwidth), peak_tflops=float(peak), how=how)


def is_positive_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def write_cached_peaks(path: Path, name: str, peaks: Peaks) -> None:
    try:
        write_json_atomically(path, {"device": name, "torch": torch.__version__,
                                     "bandwidth_gbs": peaks.bandwidth_gbs, "peak_tflops": peaks.peak_tflops,
                                     "how": peaks.how})
    except OSError:
        return  # an unwritable cache only costs measuring again next time


def measure_peaks(device: torch.device) -> Peaks:
    plan = cuda_plan(device) if device.type == "cuda" else CPU_PLAN
    bandwidth = max(copy_bandwidth_gbs(device, size, plan.repeats) for size in plan.copy_sizes)
    peak = max(matmul_tflops(device, plan.matmul_size, dtype, plan.repeats) for dtype in plan.matmul_dtypes)
    copies = " and ".join(readable_bytes(size) for size in plan.copy_sizes)
    dtypes = "/".join(str(dtype).removeprefix("torch.") for dtype in plan.matmul_dtypes)
    how = (f"measured on {device_name(device)}: {copies} copy, {plan.matmul_size}×{plan.matmul_size} {dtypes} "
           f"matmul, best of {plan.repeats}")
    return Peaks(bandwidth_gbs=bandwidth, peak_tflops=peak, how=how)


def cuda_plan(device: torch.device) -> MeasurementPlan:
    """A 1 GiB copy, or less where the GPU has little free memory (source and destination both need room)."""
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return MeasurementPlan(copy_sizes=(min(CUDA_COPY_BYTES, free_bytes // 4),), matmul_size=8192,
                           matmul_dtypes=(torch.float16, torch.bfloat16), repeats=10)


def fastest_ms(operation: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The best of repeats timed calls after one warm-up; the best is closest to what the hardware can do."""
    timing = time_callable(operation, [()], device=str(device), calls=repeats, warmup=1, flush_l2=False)
    return max(timing.min_ms, 1e-6)  # a coarse clock can read 0: never divide by it


def copy_bandwidth_gbs(device: torch.device, size_bytes: int, repeats: int) -> float:
    source = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    destination = torch.empty_like(source)
    elapsed_ms = fastest_ms(lambda: destination.copy_(source), device, repeats)
    return 2 * source.nbytes / (elapsed_ms / 1e3) / 1e9  # every byte is read once and written once


def matmul_tflops(device: torch.device, size: int, dtype: torch.dtype, repeats: int) -> float:
    left = torch.randn(size, size, device=device).to(dtype)
    right = torch.randn(size, size, device=device).to(dtype)
    result = torch.empty(size, size, dtype=dtype, device=device)
    elapsed_ms = fastest_ms(lambda: torch.mm(left, right, out=result), device, repeats)
    return 2 * size**3 / (elapsed_ms / 1e3) / 1e12


# --- the floor and the verdict ----------------------------------------------------------------------------

def floor_ms(work: Work, peaks: Peaks) -> float:
    """The slower of moving the bytes and doing the FLOPs at the measured peaks, in milliseconds."""
    return max(memory_ms(work, peaks), compute_ms(work, peaks))


def memory_ms(work: Work, peaks: Peaks) -> float:
    return work.bytes / (peaks.bandwidth_gbs * 1e9) * 1e3


def compute_ms(work: Work, peaks: Peaks) -> float:
    return work.flops / (peaks.peak_tflops * 1e12) * 1e3


def below_floor(candidate_ms: float, floor: Floor, margin: float | None = None, device: str = "cpu") -> str | None:
    """The message of finding integrity-below-floor when the candidate beats a bound by more than its margin
    (the bytes: BYTES_FLOOR_MARGIN for the device, else BELOW_FLOOR_MARGIN; the FLOPs: BELOW_FLOOR_MARGIN;
    `margin`, when given, for both), else None."""
    work, peaks = floor.work, floor.peaks
    bounds = [(margin if margin is not None else BYTES_FLOOR_MARGIN.get(device, BELOW_FLOOR_MARGIN),
               memory_ms(work, peaks),
               f"{readable_bytes(work.bytes)} must move at ≤ {readable_count(peaks.bandwidth_gbs * 1e9, 'B/s')}"),
              (margin if margin is not None else BELOW_FLOOR_MARGIN, compute_ms(work, peaks),
               f"{readable_count(work.flops, 'FLOP')} at ≤ {readable_count(peaks.peak_tflops * 1e12, 'FLOPS')}")]
    broken = [(bound_margin, bound_ms, bound) for bound_margin, bound_ms, bound in bounds
              if candidate_ms < bound_margin * bound_ms]
    if not broken:
        return None
    margin, floor_time, bound = max(broken, key=lambda item: item[1])
    return (f"{readable_ms(candidate_ms)} is below the physical floor {readable_ms(floor_time)}: {bound} "
            f"({peaks.how}); under {margin:.0%} of the floor no correct kernel can run, so work was skipped, "
            f"reused or done outside the timed call")


def readable_ms(ms: float) -> str:
    if ms >= 1:
        return f"{ms:.3g} ms"
    return f"{ms * 1e3:.3g} µs"


def readable_bytes(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} B"


def readable_count(count: float, unit: str) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {prefix}{unit}"
    return f"{count:.3g} {unit}"
