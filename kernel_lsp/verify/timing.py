"""Honest timing of a callable: the numbers a speedup claim rests on.

On CUDA each call is bracketed by CUDA events, with a full-device synchronize before and after it (work the
candidate left on other streams is counted), and the L2 cache is overwritten before each call so no call is
served warm by the previous one. Calls rotate through several input sets, so a candidate that caches results
by the identity or data pointer of its inputs gets no free calls. Warm-up calls run first and are not timed:
at least the given number, and, with warmup_ms, more until they have taken that long (on an H200, the median of
a freshly compiled model's first 100 timed calls after 10 warm-up calls was 4% above its median 220 calls
later, with the SM clock at 1980 MHz throughout), capped at MAX_WARMUP_CALLS.
The median and the spread (p10..p90 over the median) are reported together with how they were measured.

On CPU the clock is time.perf_counter_ns and the timing says so: CPU and GPU timings are never compared.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

CUDA_EVENTS = "cuda-events"
CPU_PERF_COUNTER = "cpu-perf-counter"
L2_FLUSH_FACTOR = 2  # writing twice the L2 size evicts every line even with a non-LRU replacement policy
MAX_WARMUP_CALLS = 1000


@dataclass(frozen=True)
class Timing:
    device: str  # 'cuda' | 'cpu'
    clock: str  # 'cuda-events' | 'cpu-perf-counter'
    calls: int
    warmup: int  # the warm-up calls that ran
    median_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    spread: float  # (p90 - p10) / median
    input_sets: int
    l2_flushed: bool
    busy_ms: float = 0.0  # all calls' times added up, warm-up included: what the judge's clock must have seen

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class CallWatch(Protocol):
    """What a caller may see of the timed calls (verify/host.py checks them), outside the timed stretch of each."""

    recorded_calls: int  # calls run under a recording instead of timed: run in addition to the timed ones

    def recording(self, index: int) -> contextlib.AbstractContextManager[Any] | None:
        """For call `index`: a recording to run it under instead of timing it (its time is not a sample), or None;
        exactly `recorded_calls` of the calls get one."""

    def returned(self, index: int, set_index: int, output: Any) -> None:
        """Call `index` (of input set `set_index`) returned `output`, after the device finished it."""


def resolve_device(device: str) -> torch.device:
    """'cuda' becomes 'cuda:<current>', so tensors on the same GPU compare equal to the target device."""
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return resolved


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default), defined for a single value too."""
    position = fraction * (len(sorted_values) - 1)
    lower = int(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    return sorted_values[lower] + (sorted_values[upper] - sorted_values[lower]) * (position - lower)


def relative_spread(p10: float, p90: float, median: float) -> float:
    """(p90 - p10) / median; a zero median with any spread is infinitely noisy, not perfectly steady."""
    if median > 0:
        return (p90 - p10) / median
    return 0.0 if p90 == p10 else float("inf")


def summarize(samples_ms: list[float], *, device: str, clock: str, warmup: int, input_sets: int,
              l2_flushed: bool, busy_ms: float = 0.0) -> Timing:
    ordered = sorted(samples_ms)
    median = statistics.median(ordered)
    p10, p90 = percentile(ordered, 0.1), percentile(ordered, 0.9)
    return Timing(device=device, clock=clock, calls=len(ordered), warmup=warmup, median_ms=median,
                  mean_ms=statistics.fmean(ordered), min_ms=ordered[0], max_ms=ordered[-1], p10_ms=p10,
                  p90_ms=p90, spread=relative_spread(p10, p90, median), input_sets=input_sets,
                  l2_flushed=l2_flushed, busy_ms=busy_ms)


def l2_scratch(device: torch.device) -> torch.Tensor:
    """A buffer whose overwrite evicts the whole L2 of the device; allocated once per timing run."""
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    return torch.empty(L2_FLUSH_FACTOR * l2_bytes, dtype=torch.uint8, device=device)


def time_cuda_calls(fn: Callable[..., object], input_sets: list[tuple], count: int, device: torch.device,
                    scratch: torch.Tensor | None, watch: CallWatch | None = None,
                    discard: Callable[[object], None] | None = None) -> list[float]:
    """Milliseconds per call from CUDA events; the flush runs before the start event, so it is not counted.
    Calls the watch records give no sample."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(inputs: tuple) -> tuple[object, float]:
        if scratch is not None:
            scratch.zero_()
        start.record()
        output = fn(*inputs)
        end.record()
        torch.cuda.synchronize()  # the whole device, not just the event's stream
        return output, start.elapsed_time(end)
    with torch.cuda.device(device):
        return run_calls(fn, input_sets, count, timed, watch, settle=torch.cuda.synchronize, discard=discard)


def time_cpu_calls(fn: Callable[..., object], input_sets: list[tuple], count: int,
                   watch: CallWatch | None = None, discard: Callable[[object], None] | None = None) -> list[float]:
    def timed(inputs: tuple) -> tuple[object, float]:
        began = time.perf_counter_ns()
        output = fn(*inputs)
        return output, (time.perf_counter_ns() - began) / 1e6
    return run_calls(fn, input_sets, count, timed, watch, discard=discard)


def run_calls(fn: Callable[..., object], input_sets: list[tuple], count: int,
              timed: Callable[[tuple], tuple[object, float]], watch: CallWatch | None,
              settle: Callable[[], None] = lambda: None,
              discard: Callable[[object], None] | None = None) -> list[float]:
    """`count` calls, call i on input_sets[i % len(input_sets)]: each timed by `timed` (its output and
    milliseconds), except those the watch records, which run under its recording and give no sample. `settle`
    runs before each call and after a recorded one (the device synchronized). `discard` gets each output once
    the watch saw it, outside the timed stretch (the verifier overwrites it there)."""
    samples: list[float] = []
    for index in range(count):
        inputs = input_sets[index % len(input_sets)]
        settle()
        recording = watch.recording(index) if watch is not None else None
        if recording is not None:
            with recording:
                output = fn(*inputs)
                settle()
        else:
            output, milliseconds = timed(inputs)
            samples.append(milliseconds)
        if watch is not None:
            watch.returned(index, index % len(input_sets), output)
        if discard is not None:
            discard(output)
        del output
    return samples


def time_callable(fn: Callable[..., object], input_sets: list[tuple], *, device: str, calls: int = 100,
                  warmup: int = 10, flush_l2: bool = True, warmup_ms: float = 0.0,
                  watch: CallWatch | None = None, discard: Callable[[object], None] | None = None) -> Timing:
    """Run fn untimed warmup times (and, with warmup_ms, until the warm-up calls took that long), then calls
    times timed; call i gets input_sets[i % len(input_sets)]. A watch sees the timed calls (not the warm-up):
    each output once the device finished it, and it may record some calls instead of timing them (those add to
    the calls run: `calls` samples are taken all the same). `discard`, if given, gets every output (warm-up
    included) after the call, outside its timed stretch."""
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    if warmup < 0 or warmup_ms < 0:
        raise ValueError(f"warm-up must not be negative, got {warmup} calls and {warmup_ms} ms")
    if not input_sets:
        raise ValueError("input_sets is empty: at least one set of inputs is needed to call the function")
    target = resolve_device(device)
    if target.type == "cuda":
        scratch = l2_scratch(target) if flush_l2 else None

        def run(count: int, watch: CallWatch | None = None) -> list[float]:
            return time_cuda_calls(fn, input_sets, count, target, scratch, watch, discard)
        clock, flushed = CUDA_EVENTS, flush_l2
    else:
        def run(count: int, watch: CallWatch | None = None) -> list[float]:
            return time_cpu_calls(fn, input_sets, count, watch, discard)
        clock, flushed = CPU_PERF_COUNTER, False  # no portable way to flush CPU caches from Python
    warm = warm_up(run, warmup, warmup_ms)
    samples = run(calls + (watch.recorded_calls if watch is not None else 0), watch)
    return summarize(samples, device=target.type, clock=clock, warmup=len(warm), input_sets=len(input_sets),
                     l2_flushed=flushed, busy_ms=sum(warm) + sum(samples))


def warm_up(run: Callable[[int], list[float]], calls: int, minimum_ms: float) -> list[float]:
    """Untimed calls: `calls` of them, then more in doubling batches until they took minimum_ms together (or
    MAX_WARMUP_CALLS ran); the times they took."""
    taken = run(calls)
    batch = max(1, calls)
    while sum(taken) < minimum_ms and len(taken) < MAX_WARMUP_CALLS:
        taken += run(min(batch, MAX_WARMUP_CALLS - len(taken)))
        batch *= 2
    return taken


def on_device(value: object, device: torch.device) -> object:
    """A tensor moved to device if it is elsewhere; anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.device != device:
        return value.to(device)
    return value


def make_input_sets(get_inputs: Callable[[], list], count: int, seed: int, device: str) -> list[tuple]:
    """count input sets, set i drawn with torch.manual_seed(seed + i) and device as torch's default device."""
    target = resolve_device(device)
    previous_default = torch.get_default_device()
    torch.set_default_device(target)
    try:
        input_sets = []
        for index in range(count):
            torch.manual_seed(seed + index)
            input_sets.append(tuple(on_device(value, target) for value in get_inputs()))
        return input_sets
    finally:
        torch.set_default_device(previous_default)


def speedup(reference: Timing, candidate: Timing) -> float:
    """How many times faster the candidate's median is; only timings from the same device and clock compare."""
    if (reference.device, reference.clock) != (candidate.device, candidate.clock):
        raise ValueError(f"cannot compare a {reference.device}/{reference.clock} timing with a "
                         f"{candidate.device}/{candidate.clock} timing")
    if candidate.median_ms <= 0:
        raise ValueError("the candidate's median is 0 ms: the clock is too coarse to give a speedup")
    return reference.median_ms / candidate.median_ms
