"""timing: the judge's batches and intervals, CPU clock figures, untimed warm-up, rotated inputs, seeded input sets, and speedups that refuse to mix clocks."""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import replace

import pytest
import torch

from kernel_lsp.candidate.timing import (
    MAX_WARMUP_CALLS,
    Timing,
    make_input_sets,
    median_interval,
    percentile,
    speedup,
    speedup_interval,
    time_batch,
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


def test_a_batch_runs_each_named_set_once_then_settles() -> None:
    seen: list[int] = []
    settled: list[int] = []
    outputs = time_batch(lambda x: seen.append(int(x)) or int(x) * 2, [(0,), (1,), (2,)], [2, 0, 1],
                         lambda: settled.append(len(seen)))
    assert (seen, outputs, settled) == ([2, 0, 1], [4, 0, 2], [3])


def test_the_speedup_interval_holds_the_ratio_and_excludes_one_only_when_it_should() -> None:
    rng = random.Random(5)
    fast = [1.0 + rng.gauss(0, 0.02) for _ in range(30)]
    slow = [2.0 + rng.gauss(0, 0.04) for _ in range(30)]
    low, high = speedup_interval(slow, fast, seed=1)
    assert low < 2.0 < high and low > 1.8 and high < 2.2
    assert speedup_interval(slow, fast, seed=1) == (low, high)  # seeded: the same samples, the same interval
    same = [1.0 + rng.gauss(0, 0.05) for _ in range(30)]
    low, high = speedup_interval(same, fast, seed=1)
    assert low < 1.0 < high
    low, high = median_interval(fast)
    assert low <= statistics.median(fast) <= high


def test_batches_are_sized_so_the_round_trip_is_a_small_part() -> None:
    from kernel_lsp.verify.rounds import ROUND_TRIP_FACTOR, batch_size

    assert batch_size(0.1, 10.0, 64) == 1  # a long call: one a batch
    size = batch_size(0.1, 0.005, 64)  # 5 us calls and a 100 us round trip: the most the sets allow
    assert size == 64
    size = batch_size(0.1, 0.5, 64)
    assert size * 0.5 >= ROUND_TRIP_FACTOR * 0.1 and size & (size - 1) == 0 and size // 2 * 0.5 < ROUND_TRIP_FACTOR * 0.1


def test_the_judge_keeps_one_call_per_set_chosen_after_the_batch() -> None:
    from kernel_lsp.verify.rounds import Keeper

    keeper = Keeper()
    first = keeper.choose([0, 1, 2], 0, 1)
    assert first == (0, 1, 2) and keeper.kept == {0: (0, 1), 1: (1, 1), 2: (2, 1)}  # a set's first call is kept
    replaced = sum(bool(keeper.choose([0, 1, 2], 3 * n, n + 1)) for n in range(1, 300))
    assert 0 < replaced < 150  # later calls replace it ever more rarely (1/k)
    assert all(call % 3 == s for s, (call, _) in keeper.kept.items())


def test_the_batch_grows_by_the_judges_clock_until_the_round_trip_is_a_small_part() -> None:
    from kernel_lsp.verify.rounds import MAX_BATCH_MS, ROUND_TRIP_FACTOR, calibrated_batch

    class Sets:
        count = 4

        def grow(self, count: int) -> None:
            self.count = max(self.count, count)

    class Candidate:  # a batch of n calls takes the round trip plus n calls, on the judge's clock
        round_trip_ms, warm_calls = 1.0, 10

        def __init__(self, per_call_ms: float) -> None:
            self.per_call_ms, self.sizes = per_call_ms, []

        def batch(self, indices: list[int]) -> float:
            self.sizes.append(len(indices))
            return (self.round_trip_ms + len(indices) * self.per_call_ms) / 1e3

        def after(self, indices: list[int], first: int, keep: tuple[int, ...] = ()) -> float:
            return self.round_trip_ms / 1e3

    wanted = ROUND_TRIP_FACTOR * 2.0  # the batch's request and the one after it
    for per_call_ms, fit, first in ((0.005, 1 << 20, 64), (0.005, 4096, 64), (0.3, 4096, 8), (20.0, 4096, 1)):
        sets, candidate = Sets(), Candidate(per_call_ms)
        batch, spent_ms = calibrated_batch(candidate, sets, fit, first)
        assert spent_ms == 2.0 + batch * per_call_ms
        assert sets.count >= batch and candidate.sizes[-1] == batch and candidate.warm_calls == 10 + sum(candidate.sizes)
        assert batch & (batch - 1) == 0 and batch <= fit
        # large enough (or every set that fits), and not twice what was needed
        assert batch == fit or 2.0 + batch * per_call_ms >= wanted
        assert batch == first or 2.0 + batch // 2 * per_call_ms < wanted
    assert calibrated_batch(Candidate(0.005), Sets(), 1 << 20, 64)[0] == 32768  # 19,600 calls of 5 us make 98 ms
    slow = Candidate(0.005)
    slow.round_trip_ms = 50.0  # a process that answers pings slowly: batches of MAX_BATCH_MS, not 50 x 100 ms
    batch, spent_ms = calibrated_batch(slow, Sets(), 1 << 20, 64)
    assert spent_ms >= MAX_BATCH_MS and 100.0 + batch // 2 * 0.005 < MAX_BATCH_MS


def test_rounds_cover_the_calls_asked_and_more_while_they_are_cheap() -> None:
    from kernel_lsp.verify.rounds import MAX_ROUNDS, MIN_ROUNDS, TIMING_BUDGET_MS, rounds_for

    assert rounds_for(100, 1, 50.0) == 100  # a slow call: one a batch, the calls asked decide
    assert rounds_for(3, 1, 0.1) == 3  # fewer calls asked: fewer rounds, however cheap
    assert rounds_for(100, 256, TIMING_BUDGET_MS / 4) == MIN_ROUNDS  # dear rounds: the least
    assert rounds_for(100, 256, TIMING_BUDGET_MS / 40) == 40  # cheap ones: as many as the budget holds
    assert rounds_for(100, 256, 0.01) == MAX_ROUNDS
    assert rounds_for(10_000, 4, 0.01) == 2500  # the calls asked win over the cap
