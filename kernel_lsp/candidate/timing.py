"""Timing: the judge's protocol's parts (verify/rounds.py measure) and a self-timed loop for measurements.

A verification's figures are the judge's: it times whole batches of calls (time_batch: the calls back to back,
then the device synchronized) by its own clock, in rounds interleaved with the baselines; summarize gives the
median and spread of the rounds' samples, median_interval and speedup_interval their 95% bootstrap intervals.

time_callable times each call by its own clock instead, for measurements that run in a trusted process (the
profile job's, the physical floor's): on CUDA each call is bracketed by CUDA events, with a full-device
synchronize before and after it, and the L2 cache is overwritten before each call. Warm-up calls run first and
are not timed: at least the given number, and, with warmup_ms, more until they have taken that long (on an H200,
the median of a freshly compiled model's first 100 timed calls after 10 warm-up calls was 4% above its median 220
calls later, with the SM clock at 1980 MHz throughout), capped at MAX_WARMUP_CALLS.

On CPU the clock is time.perf_counter and the timing says so: CPU and GPU timings are never compared.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kernel_lsp.contracts.verify_report import Timing

CUDA_EVENTS = "cuda-events"
CPU_PERF_COUNTER = "cpu-perf-counter"
JUDGE_CLOCK = "judge-wall"  # the judge's time.perf_counter around whole batches of calls (verify/run.py)
BOOTSTRAP_RESAMPLES = 2000
INTERVAL = (0.025, 0.975)  # a 95% interval
L2_FLUSH_FACTOR = 2  # writing twice the L2 size evicts every line even with a non-LRU replacement policy
MAX_WARMUP_CALLS = 1000


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


def summarize(samples: list[float], *, device: str, clock: str, warmup: int, input_sets: int,
              l2_flushed: bool, busy_ms: float = 0.0, calls: int | None = None, **judged: Any) -> Timing:
    """The figures of a list of samples (`calls`: how many calls they cover, when a sample is a batch's mean);
    `judged`: the JUDGE_CLOCK fields (rounds, batch, round_trip_ms, samples_ms, median_interval_ms)."""
    ordered = sorted(samples)
    median = statistics.median(ordered)
    p10, p90 = percentile(ordered, 0.1), percentile(ordered, 0.9)
    return Timing(device=device, clock=clock, calls=len(ordered) if calls is None else calls, warmup=warmup,
                  median_ms=median, mean_ms=statistics.fmean(ordered), min_ms=ordered[0], max_ms=ordered[-1],
                  p10_ms=p10, p90_ms=p90, spread=relative_spread(p10, p90, median), input_sets=input_sets,
                  l2_flushed=l2_flushed, busy_ms=busy_ms, **judged)


def time_batch(fn: Callable[..., object], input_sets: Sequence[tuple], indices: Sequence[int],
               settle: Callable[[], None] = lambda: None,
               as_returned: Callable[[object], object] | None = None) -> list[object]:
    """One batch of the judge's protocol: fn on each named input set, back to back, then `settle` (on CUDA the
    whole device synchronized); the outputs, in order. Nothing else runs in it (no flush, no overwrite, no
    per-call clock): the judge's clock around the whole request is the measurement. `as_returned` (a copy, for a
    model that returns the same buffer every call) is applied to each output before the next call. Python's
    collector is off for the batch, as timeit has it (a collection is no part of any contender's work), in the
    baselines' process as in the candidate's."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        outputs = [fn(*input_sets[index]) for index in indices] if as_returned is None else \
            [as_returned(fn(*input_sets[index])) for index in indices]
        settle()
    finally:
        if collecting:
            gc.enable()
    return outputs


def bootstrap_interval(statistic: Callable[[random.Random], float], seed: int) -> tuple[float, float]:
    """The 95% percentile interval of `statistic` over BOOTSTRAP_RESAMPLES draws (each draws its own resample
    with the given generator, seeded: the same samples always give the same interval)."""
    rng = random.Random(seed)
    values = sorted(statistic(rng) for _ in range(BOOTSTRAP_RESAMPLES))
    return percentile(values, INTERVAL[0]), percentile(values, INTERVAL[1])


def resampled_median(samples: Sequence[float], rng: random.Random) -> float:
    return statistics.median(rng.choices(samples, k=len(samples)))


def median_interval(samples: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the median of samples."""
    return bootstrap_interval(lambda rng: resampled_median(samples, rng), seed)


def speedup_interval(reference: Sequence[float], candidate: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of median(reference) / median(candidate), each resampled on its own (the rounds
    interleave them, so drift reaches both alike)."""
    return bootstrap_interval(lambda rng: resampled_median(reference, rng) / max(resampled_median(candidate, rng),
                                                                                  1e-12), seed)


def l2_scratch(device: torch.device) -> torch.Tensor:
    """A buffer whose overwrite evicts the whole L2 of the device; allocated once per timing run."""
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    return torch.empty(L2_FLUSH_FACTOR * l2_bytes, dtype=torch.uint8, device=device)


def time_cuda_calls(fn: Callable[..., object], input_sets: list[tuple], count: int, device: torch.device,
                    scratch: torch.Tensor | None) -> list[float]:
    """Milliseconds per call from CUDA events; the flush runs before the start event, so it is not counted."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(inputs: tuple) -> float:
        if scratch is not None:
            scratch.zero_()
        start.record()
        fn(*inputs)
        end.record()
        torch.cuda.synchronize()  # the whole device, not just the event's stream
        return start.elapsed_time(end)
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        return [timed(input_sets[index % len(input_sets)]) for index in range(count)]


def time_cpu_calls(fn: Callable[..., object], input_sets: list[tuple], count: int) -> list[float]:
    def timed(inputs: tuple) -> float:
        began = time.perf_counter_ns()
        fn(*inputs)
        return (time.perf_counter_ns() - began) / 1e6
    return [timed(input_sets[index % len(input_sets)]) for index in range(count)]


def time_callable(fn: Callable[..., object], input_sets: list[tuple], *, device: str, calls: int = 100,
                  warmup: int = 10, flush_l2: bool = True, warmup_ms: float = 0.0) -> Timing:
    """Run fn untimed warmup times (and, with warmup_ms, until the warm-up calls took that long), then calls
    times timed, each by its own clock (CUDA events, or perf_counter on the CPU); call i gets
    input_sets[i % len(input_sets)]. The profile job and the physical floor's measurements use it; a
    verification's timing is the judge's (verify/rounds.py measure)."""
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    if warmup < 0 or warmup_ms < 0:
        raise ValueError(f"warm-up must not be negative, got {warmup} calls and {warmup_ms} ms")
    if not input_sets:
        raise ValueError("input_sets is empty: at least one set of inputs is needed to call the function")
    target = resolve_device(device)
    if target.type == "cuda":
        scratch = l2_scratch(target) if flush_l2 else None

        def run(count: int) -> list[float]:
            return time_cuda_calls(fn, input_sets, count, target, scratch)
        clock, flushed = CUDA_EVENTS, flush_l2
    else:
        def run(count: int) -> list[float]:
            return time_cpu_calls(fn, input_sets, count)
        clock, flushed = CPU_PERF_COUNTER, False  # no portable way to flush CPU caches from Python
    warm = warm_up(run, warmup, warmup_ms)
    samples = run(calls)
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
