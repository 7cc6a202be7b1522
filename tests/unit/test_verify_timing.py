"""timing: CPU clock figures, untimed warm-up, rotated inputs, seeded input sets, and speedups that refuse to mix clocks."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
import torch

from kernel_lsp.verify.timing import (
    MAX_WARMUP_CALLS,
    Timing,
    make_input_sets,
    percentile,
    speedup,
    time_callable,
)


def sleep_two_ms(*_: object) -> None:
    time.sleep(0.002)


def test_a_two_millisecond_sleep_times_as_about_two_milliseconds_on_the_cpu_clock() -> None:
    timing = time_callable(sleep_two_ms, [(), ()], device="cpu", calls=20, warmup=2)
    assert 1.5 <= timing.median_ms <= 20.0
    assert timing.min_ms <= timing.p10_ms <= timing.median_ms <= timing.p90_ms <= timing.max_ms
    assert (timing.device, timing.clock, timing.calls, timing.warmup, timing.input_sets, timing.l2_flushed) == (
        "cpu", "cpu-perf-counter", 20, 2, 2, False)
    assert timing.spread == pytest.approx((timing.p90_ms - timing.p10_ms) / timing.median_ms)
    assert timing.to_dict()["clock"] == "cpu-perf-counter"


def test_warm_up_calls_run_but_are_not_timed() -> None:
    seen: list[int] = []

    def counting(*_: object) -> None:
        seen.append(1)
        if len(seen) <= 3:  # only warm-up calls are slow: were they timed, max_ms would show it
            time.sleep(0.05)

    timing = time_callable(counting, [()], device="cpu", calls=7, warmup=3)
    assert len(seen) == 3 + 7
    assert timing.calls == 7
    assert timing.max_ms < 25.0


def test_calls_rotate_through_the_input_sets() -> None:
    first, second = (torch.zeros(1),), (torch.ones(1),)
    received: list[int] = []
    time_callable(lambda x: received.append(id(x)), [first, second], device="cpu", calls=4, warmup=3)
    a, b = id(first[0]), id(second[0])
    assert received == [a, b, a] + [a, b, a, b]


def test_input_sets_differ_by_seed_and_repeat_for_the_same_seed() -> None:
    def get_inputs() -> list:
        return [torch.randn(8), 3]

    sets = make_input_sets(get_inputs, count=2, seed=5, device="cpu")
    again = make_input_sets(get_inputs, count=2, seed=5, device="cpu")
    assert [len(s) for s in sets] == [2, 2] and sets[0][1] == 3
    assert not torch.equal(sets[0][0], sets[1][0])
    assert all(torch.equal(x[0], y[0]) for x, y in zip(sets, again))
    torch.manual_seed(6)
    assert torch.equal(sets[1][0], torch.randn(8))


def test_input_sets_are_created_under_the_target_default_device_and_it_is_restored() -> None:
    defaults: list[torch.device] = []

    def get_inputs() -> list:
        defaults.append(torch.get_default_device())
        return [torch.zeros(1)]

    before = torch.get_default_device()
    make_input_sets(get_inputs, count=1, seed=0, device="meta")
    assert defaults == [torch.device("meta")]
    assert torch.get_default_device() == before


def test_a_tensor_made_elsewhere_is_moved_to_the_target_device() -> None:
    made_on_cpu = torch.zeros(2, device="cpu")
    [(moved,)] = make_input_sets(lambda: [made_on_cpu], count=1, seed=0, device="meta")
    assert moved.device == torch.device("meta")


def test_the_default_device_is_restored_when_get_inputs_fails() -> None:
    def failing() -> list:
        raise RuntimeError("broken get_inputs")

    before = torch.get_default_device()
    with pytest.raises(RuntimeError, match="broken get_inputs"):
        make_input_sets(failing, count=1, seed=0, device="meta")
    assert torch.get_default_device() == before


def timing_with(median_ms: float, device: str = "cuda", clock: str = "cuda-events") -> Timing:
    return Timing(device=device, clock=clock, calls=100, warmup=10, median_ms=median_ms, mean_ms=median_ms,
                  min_ms=median_ms, max_ms=median_ms, p10_ms=median_ms, p90_ms=median_ms, spread=0.0,
                  input_sets=2, l2_flushed=True)


def test_speedup_is_the_ratio_of_medians() -> None:
    assert speedup(timing_with(3.0), timing_with(1.5)) == 2.0


def test_speedup_refuses_to_compare_cpu_with_gpu_timing() -> None:
    cpu = replace(timing_with(1.0, device="cpu", clock="cpu-perf-counter"), l2_flushed=False)
    with pytest.raises(ValueError, match="cpu/cpu-perf-counter"):
        speedup(timing_with(2.0), cpu)
    with pytest.raises(ValueError, match="cannot compare"):
        speedup(timing_with(2.0), timing_with(1.0, clock="cpu-perf-counter"))


def test_speedup_refuses_a_zero_candidate_median() -> None:
    with pytest.raises(ValueError, match="too coarse"):
        speedup(timing_with(2.0), timing_with(0.0))


@pytest.mark.parametrize("kwargs, message", [
    ({"input_sets": [()], "calls": 0}, "calls must be at least 1"),
    ({"input_sets": [], "calls": 5}, "input_sets is empty"),
    ({"input_sets": [()], "calls": 5, "warmup": -1}, "warm-up must not be negative"),
])
def test_bad_arguments_raise_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        time_callable(sleep_two_ms, device="cpu", **kwargs)


def test_percentiles_interpolate_between_ranks() -> None:
    values = [float(v) for v in range(11)]
    assert (percentile(values, 0.1), percentile(values, 0.9), percentile([4.0], 0.9)) == (1.0, 9.0, 4.0)
    assert percentile([0.0, 10.0], 0.25) == 2.5


def test_warm_up_runs_until_it_took_warmup_ms():
    started = []

    def sleep_one_ms():
        started.append(time.perf_counter())
        time.sleep(0.001)
    timing = time_callable(sleep_one_ms, [()], device="cpu", calls=5, warmup=2, warmup_ms=30)
    assert 2 < timing.warmup < MAX_WARMUP_CALLS and len(started) == timing.warmup + 5
    assert started[timing.warmup] - started[0] >= 0.03  # the first timed call began after 30 ms of warm-up
    quick = time_callable(lambda: None, [()], device="cpu", calls=5, warmup=2, warmup_ms=1e9)
    assert quick.warmup == MAX_WARMUP_CALLS  # a bound, however long the minimum


class StaleBuffer:
    """Computes its answer on the first call only, then returns the same buffer unwritten (what `torch.empty`
    returns when the allocator hands back the block the last output freed)."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.buffer is None:
            self.buffer = x * 2
        return self.buffer


def test_the_verifiers_timing_overwrites_each_output_so_a_stale_buffer_reads_nan() -> None:
    from kernel_lsp.verify.host import TimedCalls
    from kernel_lsp.verify.integrity import overwriter

    inputs = [(torch.arange(6, dtype=torch.float32),)]  # one input set: a stale answer would be the right one
    for discard, stale_seen in ((None, True), (overwriter(inputs), False)):
        fn = StaleBuffer()
        watch = TimedCalls(5, 0, "cpu", random.Random(0))
        time_callable(fn, inputs, device="cpu", calls=5, warmup=2, watch=watch, discard=discard)
        _, kept = watch.kept[0]
        assert torch.equal(kept, inputs[0][0] * 2) is stale_seen
        assert stale_seen or bool(kept.isnan().all())
    assert torch.equal(inputs[0][0], torch.arange(6, dtype=torch.float32))


def test_the_overwrite_spares_outputs_that_share_the_inputs_or_the_models_storage() -> None:
    from kernel_lsp.verify.integrity import overwriter

    x, weight = torch.arange(4, dtype=torch.float32), torch.nn.Parameter(torch.ones(3))
    overwrite = overwriter([(x,), weight])
    own = torch.zeros(2)
    overwrite((x[1:], {"w": weight.view(3, 1)}, [own]))
    assert torch.equal(x, torch.arange(4, dtype=torch.float32)) and bool((weight == 1).all())
    assert bool(own.isnan().all())
