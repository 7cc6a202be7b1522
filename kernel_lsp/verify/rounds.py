"""The judge's timing protocol (docs/verification.md): the timing's input sets, the contenders (the candidate's
batches in its process, the baselines' in a process of the same kind: candidate/handle.py BaselineProcess),
warm-up, batch size, interleaved rounds with outputs kept by a choice the candidate cannot see, the baselines'
cache, and the physical floor (`measure`)."""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from kernel_lsp.candidate.exchange import Packed
from kernel_lsp.candidate.handle import BaselineFailed, CandidateFailed, CandidateProcess, decoded_reply
from kernel_lsp.candidate.integrity import copied, tensor_leaves
from kernel_lsp.candidate.kernels import classify
from kernel_lsp.candidate.timing import (
    JUDGE_CLOCK,
    MAX_WARMUP_CALLS,
    l2_scratch,
    make_input_sets,
    median_interval,
    speedup,
    speedup_interval,
    summarize,
)
from kernel_lsp.contracts.candidate_replies import KeptOutput, RecordedCall, TimedReport
from kernel_lsp.contracts.verify_report import Floor as ReportFloor, GpuStates, Timing, Timings
from kernel_lsp.verify.baselines import BaselineCache, gpu_state
from kernel_lsp.verify.checks import compare_candidate, note_kernel_use, reported_window
from kernel_lsp.verify.contenders import COMPILE_LIMIT_S, Contender, ProcessBatches, load_baselines, round_trip
from kernel_lsp.verify.floor import Floor, below_floor, cached_problem_work, device_peaks
from kernel_lsp.verify.judge import PHASES, Integrity, Judge, clone_inputs, first_line, release, size_in_bytes
from kernel_lsp.verify.reference import device_name, input_signature, run_reference

TIMING_SEED = 10_000  # timed inputs are drawn apart from the trials' seeds
REFRESH_SEED = 1_000_000  # and the timing's sets' values after their first round (TimingSets)
MAX_TIMING_INPUT_SETS = 4096  # a launch-bound kernel needs thousands of calls a batch to bury the round trip
FIRST_TIMING_SETS = 4  # drawn before the warm-up; more, up to the batch size, once it is known
TIMING_MEMORY_FRACTION = 0.25  # the timing's input sets (and their outputs) may take this much free device memory
TIMING_CPU_BYTES = 256 << 20  # and this much memory on the CPU
COPY_TRIES = 3  # copies of an output the judge times: the fastest is what keeping one costs
ROUND_TRIP_FACTOR = 50  # a batch is sized to take at least this many round trips
MAX_BATCH_MS = 250.0  # but no longer than this: a process that answers pings slowly only slows its own figure
MIN_ROUNDS = 10  # interleaved rounds at the least (unless timedCalls asks for fewer calls), however large a batch
TIMING_BUDGET_MS = 1000.0  # more rounds while they are cheap: as many as fit this (by the calibration's batch) ...
MAX_ROUNDS = 100  # ... up to this many
CACHE_CHECK_ROUNDS = 3  # rounds a cached baseline runs to show it still holds
CACHE_SLACK = 0.05
WARMUP_MS = 250.0  # warm-up calls run at least this long before a candidate or a baseline is timed
TIMED_CALLS_RECORDED = 1  # extra calls between the timed batches, recorded (each costs a profiler start on CUDA)


@PHASES("timing input sets")
def timing_sets_that_fit(first: tuple, target: torch.device, output_bytes: int, copies: int = 1) -> int:
    """How many input sets the timing may use: as many as fit (each `copies` times, one per process that runs
    batches, with room for two outputs: held until its batch is over, and a kept copy) in a quarter of the free
    device memory, or TIMING_CPU_BYTES on the CPU; at least one, at most MAX_TIMING_INPUT_SETS. A batch calls each
    set at most once, so no batch is longer. The sets cross to each process packed (exchange.Packed), so a set
    costs its bytes, not a device block each."""
    size = copies * size_in_bytes(first) + 2 * output_bytes
    budget = TIMING_CPU_BYTES
    if target.type == "cuda":
        free, _ = torch.cuda.mem_get_info(target)
        budget = int(free * TIMING_MEMORY_FRACTION)
    return max(1, min(MAX_TIMING_INPUT_SETS, budget // max(size, 1)))


def settle(target: torch.device) -> None:
    if target.type == "cuda":
        torch.cuda.synchronize()


class TimingSets:
    """The timing's input sets as the judge and each process that runs batches see them (one copy of the shared
    memory per process: the candidate's, and the baselines'), refreshed by the judge between rounds, in every
    copy alike: each set used in a round gets new values,
    drawn by the problem's get_inputs with a seed of its own (set, round), written in place. No timed call sees
    contents an earlier call saw, so an answer kept from one (a cache keyed by identity, pointer, version or any
    function of the values) is wrong, and the kept outputs are compared on exactly the values they were made
    from. On CUDA the judge also flushes the L2 cache between batches (its own scratch: the cache is the
    device's)."""

    def __init__(self, judge: Judge, get_inputs: Callable[[], list], seed: int, count: int,
                 others: tuple[Judge, ...] = ()) -> None:
        self.get_inputs, self.seed, self.target = get_inputs, seed, judge.target
        self.parties = (judge, *others)
        self.views: list[tuple] = []  # the candidate's process's sets, as the judge sees them
        self.copies: list[list[tuple]] = [self.views, *([] for _ in others)]  # each party's, the same order
        self.scratch = l2_scratch(judge.target) if judge.target.type == "cuda" else None
        self.grow(count)

    @property
    def count(self) -> int:
        return len(self.views)

    def grow(self, count: int) -> None:
        """Sets up to `count` (drawn as round 0's values, shared, and sent to the candidate's process)."""
        if count <= self.count:
            return
        values = [self.values(index, 0) for index in range(self.count, count)]
        for party, held in zip(self.parties, self.copies):
            described, views = party.exchange.share(Packed(values))
            party.ask("timing_sets", input_sets=described)
            held.extend(views)

    def values(self, set_index: int, round_number: int) -> tuple:
        """The values set `set_index` holds in round `round_number` (round 0: as first drawn)."""
        seed = self.seed + TIMING_SEED + (set_index if round_number == 0 else
                                          REFRESH_SEED + set_index + MAX_TIMING_INPUT_SETS * round_number)
        return make_input_sets(self.get_inputs, 1, seed, str(self.target))[0]

    def refresh(self, indices: list[int], round_number: int) -> None:
        for set_index in indices:
            values = tensor_leaves(self.values(set_index, round_number))
            for held in self.copies:
                for view, value in zip(tensor_leaves(held[set_index]), values):
                    view.copy_(value)
        settle(self.target)

    def flush(self) -> None:
        if self.scratch is not None:
            self.scratch.zero_()
            settle(self.target)


def warm_up(contender: Contender, sets: int, calls: int, minimum_ms: float) -> float:
    """Untimed batches of `contender` (at least `calls` calls, then more, doubling, until they took minimum_ms
    or MAX_WARMUP_CALLS ran); milliseconds per call of the last batch, by the judge's clock."""
    # the first batch has 2 calls or more (where 2 sets exist): the candidate's process sees there whether its
    # model returns one buffer on every call, before any batch is timed (side.TimedCalls.reused_output)
    done, spent_ms, size, per_call_ms = 0, 0.0, max(1, min(sets, max(calls, 2))), 0.0
    while done < max(calls, 1) or (spent_ms < minimum_ms and done < MAX_WARMUP_CALLS):
        indices = [(done + offset) % sets for offset in range(size)]
        seconds = contender.batch(indices)
        contender.after(indices, done)
        spent_ms += seconds * 1e3
        per_call_ms = seconds * 1e3 / size
        done += size
        size = min(sets, size * 2)
    contender.warm_calls = done
    return per_call_ms


def calibrated_batch(candidate: Contender, sets: TimingSets, fit: int, first: int) -> tuple[int, float]:
    """The batch size, by the judge's clock: from `first` (the warm-up's guess), doubled or more, the input sets
    grown with it, until one untimed batch of the candidate and the request after it (a timed sample holds both)
    take ROUND_TRIP_FACTOR times their two round trips (MAX_BATCH_MS at most), or the batch holds every set that
    fits. The warm-up's batches are a few sets long, so their time a call is mostly the round trip: a size guessed
    from them alone leaves a launch-bound kernel's figure partly round trip. Returns the size and the last batch's
    milliseconds."""
    batch, done = first, candidate.warm_calls
    wanted_ms = min(ROUND_TRIP_FACTOR * 2 * candidate.round_trip_ms, MAX_BATCH_MS)
    while True:
        sets.grow(batch)
        indices = list(range(batch))
        spent_ms = (candidate.batch(indices) + candidate.after(indices, done)) * 1e3
        done += batch
        if spent_ms >= wanted_ms or batch >= fit:
            candidate.warm_calls = done
            return batch, spent_ms
        batch = min(fit, max(2 * batch, 1 << math.ceil(math.log2(batch * wanted_ms / max(spent_ms, 1e-6)))))


def rounds_for(calls: int, batch: int, round_ms: float) -> int:
    """Interleaved rounds: enough for `calls` calls and at least MIN_ROUNDS (fewer only when fewer calls are asked),
    and more while a round is cheap, as many as fit TIMING_BUDGET_MS, up to MAX_ROUNDS: a launch-bound kernel's
    rounds scatter (an add's by ±40% on an H100, its host's launches being the work), and the median of ten left
    its speedup's interval ±20% wide."""
    asked = max(min(MIN_ROUNDS, calls), math.ceil(calls / batch))
    if calls < MIN_ROUNDS:
        return asked
    return max(asked, min(MAX_ROUNDS, int(TIMING_BUDGET_MS / max(round_ms, 1e-6))))


def batch_size(round_trip_ms: float, per_call_ms: float, sets: int) -> int:
    """Calls per batch: enough that the round trip is at most 1/ROUND_TRIP_FACTOR of the batch (a power of two, so
    that small changes in the estimate keep the cached baselines' setting), at most one call per input set."""
    wanted = ROUND_TRIP_FACTOR * round_trip_ms / max(per_call_ms, 1e-6)
    return max(1, min(sets, 1 << max(0, math.ceil(math.log2(max(wanted, 1.0))))))


def judged_timing(contender: Contender, samples: list[float], batch: int, device: str, sets: int,
                  seed: int) -> Timing:
    return summarize(samples, device=device, clock=JUDGE_CLOCK, warmup=contender.warm_calls, input_sets=sets,
                     l2_flushed=device == "cuda", busy_ms=sum(samples) * batch, calls=len(samples) * batch,
                     rounds=len(samples), batch=batch, round_trip_ms=contender.round_trip_ms,
                     samples_ms=[round(v, 6) for v in samples], median_interval_ms=median_interval(samples, seed))


class Keeper:
    """Which timed calls' outputs the candidate's process keeps for the judge: chosen by the judge once the batch
    is over (reservoir sampling per input set: the k-th call of a set replaces the kept one with probability
    1/k), with a generator the candidate's process never sees, so no call can know while it runs whether its
    output will be compared. The candidate's copies of them are made under the judge's clock (`Rounds`)."""

    def __init__(self) -> None:
        self.rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        self.seen: dict[int, int] = {}
        self.kept: dict[int, tuple[int, int]] = {}  # input set -> (call, round) whose output was asked for

    def choose(self, indices: list[int], first: int, round_number: int) -> tuple[int, ...]:
        """The offsets in this batch (each set appears once in it) whose outputs replace the kept ones."""
        chosen = []
        for offset, set_index in enumerate(indices):
            self.seen[set_index] = self.seen.get(set_index, 0) + 1
            if self.rng.random() * self.seen[set_index] < 1:
                chosen.append(offset)
                self.kept[set_index] = (first + offset, round_number)
        return tuple(chosen)


class Rounds:
    """The judge's timing protocol (docs/verification.md): rounds in which every contender runs one batch of
    `batch` calls on distinct input sets, the order rotating round by round (so drift and a noisy neighbour
    reach each alike), the judge's clock around each batch. The candidate's sample of a round is its batch plus
    the request that keeps the outputs the judge chose (so nothing it computes there is free), less what the
    judge's own copy of as many outputs of that size takes (`copy_s` each, timed once before the rounds); a
    baseline's, its batch plus the request after it (which keeps nothing): two round trips each. Between rounds
    the judge refreshes the sets used."""

    def __init__(self, sets: TimingSets, batch: int, copy_s: float,
                 recorded: Callable[[int, int], None] | None = None) -> None:
        self.sets, self.batch, self.copy_s, self.recorded = sets, batch, copy_s, recorded
        self.keeper = Keeper()
        self.samples: dict[str, list[float]] = {}
        self.next_round = 0

    def run(self, contenders: list[Contender], rounds: int, only_first: dict[str, int] | None = None) -> None:
        """`only_first[kind]`: a contender that runs in the first so many of these rounds only (a cached
        baseline's check)."""
        only_first = only_first or {}
        for step in range(rounds):
            number = self.next_round = self.next_round + 1
            shift = number % len(contenders)
            indices = [(number * self.batch + offset) % self.sets.count for offset in range(self.batch)]
            self.sets.refresh(indices, number)
            for contender in contenders[shift:] + contenders[:shift]:
                if step >= only_first.get(contender.kind, rounds):
                    continue
                self.sets.flush()
                seconds = contender.batch(indices)
                if contender.kind == "candidate":
                    keep = self.keeper.choose(indices, number * self.batch, number)
                    seconds += contender.after(indices, number * self.batch, keep) - self.copy_s * len(keep)
                    if self.recorded is not None:
                        self.recorded(number, number * self.batch)
                else:
                    seconds += contender.after(indices, number * self.batch)
                self.samples.setdefault(contender.kind, []).append(max(seconds, 0.0) * 1e3 / self.batch)


def copy_seconds(output: Any, target: torch.device) -> float:
    """What the judge takes to copy one output of the reference's (the fastest of COPY_TRIES): what an honest keep
    of one costs the candidate's process."""
    best = float("inf")
    for _ in range(COPY_TRIES):
        started = time.perf_counter()
        copy = copied(output)  # as the candidate's process keeps one (side.TimedCalls)
        settle(target)
        best = min(best, time.perf_counter() - started)
        del copy
    return best


COMPILE_ON_THE_CPU = ("not timed on the CPU: inductor's C++ build takes ~18 s a verification, and no figure of a CPU "
                      "run is shown (the interpreter's times say nothing of a GPU)")


@dataclass(frozen=True)
class Measured:
    """What the timing adds to a VerifyReport (its fields of the same names)."""

    timing: Timings
    gpu: GpuStates
    speedup: dict[str, float | None]  # each timed baseline's
    interval: dict[str, tuple[float, float]]
    significant: dict[str, bool]
    floor: ReportFloor


def measure(judge: Judge, reference_module: Any, ref_model: torch.nn.Module, calls: int, warmup: int, seed: int,
            baselines: tuple[str, ...], cache_dir: Path | None, reference: str,
            baselines_process: CandidateProcess | None = None) -> Measured:
    """The candidate and its baselines (run in `baselines_process`, candidate/handle.py BaselineProcess) timed by the
    judge's clock, in interleaved rounds (`Rounds`); the speedup is the ratio of the medians, with a 95% interval.
    A cached baseline runs CACHE_CHECK_ROUNDS rounds only, and is timed afresh when those differ from it by more
    than its interval. Then the kept timed outputs are compared with the reference on the values they were made
    from, and the physical floor is checked. `reference`: the reference's file. Where the baselines' process
    hangs or dies, the candidate is timed again alone, and the report says why no baseline was timed."""
    arguments = (judge, reference_module, ref_model, calls, warmup, seed, baselines, cache_dir, reference)
    try:
        return measured_with(*arguments, baselines_process, None)
    except BaselineFailed as exc:
        judge.ask("timed_report")  # the candidate's process ends its timing: its sets and kept outputs let go
        return measured_with(*arguments, None, str(exc))


def measured_with(judge: Judge, reference_module: Any, ref_model: torch.nn.Module, calls: int, warmup: int,
                  seed: int, baselines: tuple[str, ...], cache_dir: Path | None, reference: str,
                  baselines_process: CandidateProcess | None, failed: str | None) -> Measured:
    """`measure` with the baselines in `baselines_process`, or none timed (`failed`: why)."""
    target, integrity = judge.target, judge.integrity
    reference_text = Path(reference).read_text()
    release(judge, return_memory=True)
    get_inputs = reference_module.get_inputs
    probe = run_reference(ref_model, clone_inputs(make_input_sets(get_inputs, 1, seed + TIMING_SEED, str(target))[0]))
    output_bytes, copy_s = size_in_bytes(probe), copy_seconds(probe, target)
    del probe  # the judge holds no output of its own while the candidate runs
    skipped: dict[str, str] = {}
    if "compile" in baselines and target.type == "cpu":
        skipped["compile"] = COMPILE_ON_THE_CPU
    kinds = [kind for kind in baselines if kind not in skipped]
    party, why = None, failed or (None if baselines_process else "no baselines' process was started")
    if kinds and why is None:
        try:
            with PHASES("timing: the baselines' process"):
                party = load_baselines(judge, baselines_process, reference, reference_module, ref_model)
        except (BaselineFailed, CandidateFailed) as exc:
            why = str(exc)
    if kinds and why is not None:
        skipped.update({kind: f"not timed: {why}" for kind in kinds})
        kinds = []
    with PHASES("timing input sets"):
        fit = timing_sets_that_fit(make_input_sets(get_inputs, 1, seed + TIMING_SEED, str(target))[0], target,
                                   output_bytes, 2 if party else 1)
        # more sets once the batch is known
        sets = TimingSets(judge, get_inputs, seed, min(fit, FIRST_TIMING_SETS), (party,) if party else ())
    with PHASES("GPU state (NVML)"):
        before = gpu_state(target)
    candidate = ProcessBatches(judge)
    with PHASES("timing: set-up"):
        candidate.round_trip_ms = round_trip(judge)
        trip = round_trip(party) if party else 0.0
    contenders: list[Contender] = [candidate]
    compile_error: str | None = None
    for kind in kinds:
        try:
            with PHASES(f"timing: the {kind} baseline's set-up"):
                if kind == "compile":  # compiled there now, not in its first batch
                    party.ask("compile", runs=1, extra_s=COMPILE_LIMIT_S)
        except CandidateFailed as exc:  # torch.compile fails on some models and machines: say why, keep eager
            compile_error = f"{exc.sandbox_failure.error_type or 'error'}: {first_line(exc).partition(': ')[2]}"
            continue
        contenders.append(ProcessBatches(party, kind))
        contenders[-1].round_trip_ms = trip
    with PHASES("timing: warm-up"):
        per_call = {c.kind: warm_up(c, sets.count, warmup, WARMUP_MS) for c in contenders}
    # the candidate's batches are sized to make its round trip small; the baselines' are the same size
    with PHASES("timing: batch size"):
        batch, batch_ms = calibrated_batch(candidate, sets, fit,
                                           batch_size(candidate.round_trip_ms, per_call["candidate"], fit))
    rounds = rounds_for(calls, batch, batch_ms + sum(per_call[c.kind] * batch for c in contenders[1:]))
    cache = BaselineCache(cache_dir) if cache_dir is not None else None
    key = cache.key(reference_text, device_name(target), torch.__version__,
                    {"protocol": JUDGE_CLOCK, "baselines": "own process", "calls": calls, "batch": batch,
                     "warmup": warmup, "seed": seed, "sets": sets.count, "shapes": input_signature(sets.views[0])}
                    ) if cache else ""
    cached = {c.kind: Timing(**stored) for c in contenders[1:]
              if cache and (stored := cache.get(key, c.kind)) is not None and stored.get("clock") == JUDGE_CLOCK}
    chosen = set(random.Random(int.from_bytes(os.urandom(8), "little")).sample(range(1, rounds + 1),
                                                                              min(TIMED_CALLS_RECORDED, rounds)))

    def record(number: int, first_call: int) -> None:
        if number in chosen:  # an extra call, recorded: its launches are judged, its time is no sample
            judge.ask("record_call", runs=1, set=first_call % sets.count, call=-number)
    timed = Rounds(sets, batch, copy_s, record)
    with PHASES("timing: interleaved rounds"):
        timed.run(contenders, rounds, {kind: min(CACHE_CHECK_ROUNDS, rounds) for kind in cached})
    samples = timed.samples
    stale = [kind for kind, timing in cached.items() if not within_interval(statistics.median(samples[kind]), timing)]
    if stale:  # cached figures no longer hold: those baselines are timed in full, again against the candidate
        with PHASES("timing: rounds against re-timed baselines"):
            for kind in stale:
                del samples[kind], cached[kind]
            timed.run([c for c in contenders if c.kind == "candidate" or c.kind in stale], rounds)
    with PHASES("checking timed calls"):
        reply = decoded_reply(TimedReport, "timed_report", judge.ask("timed_report"))
        check_timed_outputs(judge, reply.kept, sets, ref_model, timed.keeper.kept)
        check_timed_kernels(judge, reply.recorded[:TIMED_CALLS_RECORDED])
        reused_output = reply.reused_output  # its word, which only ever costs it time
    release(judge)
    device = target.type
    judged = {c.kind: (cached[c.kind] if c.kind in cached
                       else judged_timing(c, samples[c.kind], batch, device, sets.count, seed)) for c in contenders}
    judged["candidate"] = replace(judged["candidate"], reused_output=reused_output)
    for contender in contenders[1:]:
        kind = contender.kind
        if kind in cached:
            judged[kind] = replace(judged[kind], check_ms=tuple(round(v, 6) for v in samples[kind]))
        elif cache:
            cache.put(key, kind, judged[kind].to_dict())
    timings = Timings(judged["candidate"], judged.get("eager"), judged.get("compile"), compile_error,
                      {"eager": "eager" in cached, "compile": "compile" in cached}, skipped,
                      dict(cache.schedule) if cache and cache.schedule else None)  # kind -> why not cached
    with PHASES("GPU state (NVML)"):
        gpu = GpuStates(before, gpu_state(target))
    speedups: dict[str, float | None] = {}
    intervals: dict[str, tuple[float, float]] = {}
    significant: dict[str, bool] = {}
    for contender in contenders[1:]:
        kind, base = contender.kind, judged[contender.kind]
        speedups[kind] = speedup(base, judged["candidate"])
        low, high = speedup_interval(list(base.samples_ms), list(judged["candidate"].samples_ms), seed)
        intervals[kind] = (low, high)
        significant[kind] = not low <= 1.0 <= high
    first_values = sets.values(0, 0)
    floor = physical_floor(ref_model, first_values, target, cache_dir, judged["candidate"], integrity, reference_text)
    return Measured(timings, gpu, speedups, intervals, significant, floor)


def within_interval(fresh_ms: float, cached: Timing) -> bool:
    """A cached baseline still holds: the median of its check rounds lies in its median's 95% interval, widened
    by CACHE_SLACK on each side (a few check rounds are noisier than the many that made the interval)."""
    low, high = cached.median_interval_ms or (cached.median_ms, cached.median_ms)
    return low * (1 - CACHE_SLACK) <= fresh_ms <= high * (1 + CACHE_SLACK)


def check_timed_outputs(judge: Judge, kept: list[KeptOutput], sets: TimingSets, ref_model: torch.nn.Module,
                        asked: dict[int, tuple[int, int]]) -> None:
    """The outputs the candidate's process kept of its timed calls (one per input set, the call the judge chose
    after each batch) against the judge's reference output on the values that call got: integrity-timed-output."""
    returned = {item.set: item.call for item in kept}
    wrong = [set_index for set_index, (call, _) in asked.items() if returned.get(set_index) != call]
    if wrong:
        judge.integrity.reject("integrity-timed-output", f"the candidate's process did not return the timed output the "
                                                       f"judge asked for, for {len(wrong)} of the {len(asked)} input "
                                                       f"sets")
    for item in kept:
        set_index, call = item.set, item.call
        if set_index not in asked or asked[set_index][0] != call:
            continue
        actual = judge.exchange.receive(item.output)
        expected = run_reference(ref_model, sets.values(set_index, asked[set_index][1]))
        comparison = compare_candidate(expected, actual, item.plain, judge.overrides)
        del expected, actual
        if not comparison.ok:
            judge.integrity.reject("integrity-timed-output",
                                 f"timed call {call} (input set {set_index + 1}) returned a different answer than "
                                 f"the checked calls: {comparison.message}")


def check_timed_kernels(judge: Judge, recorded: list[RecordedCall]) -> None:
    """What the recorded calls between the timed batches launched, judged like a trial's run (no custom kernel,
    other streams)."""
    for item in recorded:
        if item.how == "none":
            continue  # nothing could observe launches here: the trials already said so
        window = reported_window(item.launches, item.current_stream)
        note_kernel_use(judge.integrity, classify(window.launches, judge.own, judge.allowed), window,
                        "a call between the timed batches")


def physical_floor(ref_model: torch.nn.Module, inputs: tuple, target: torch.device, cache_dir: Path | None,
                   candidate: Timing, integrity: Integrity, reference_text: str) -> ReportFloor:
    with PHASES("physical floor: the problem's work"):
        work = cached_problem_work(ref_model, inputs, cache_dir, reference_text, input_signature(inputs))
    with PHASES("physical floor: the device's peaks"):
        peaks = device_peaks(target, cache_dir)
    floor = Floor(work, peaks)
    problem = below_floor(candidate.median_ms, floor, device=target.type)
    if problem is not None:
        integrity.reject("integrity-below-floor", problem)
    return floor.to_report()
