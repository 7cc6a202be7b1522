"""schedule: the judge checks its own scheduling before and after it measures, and caches nothing measured while
it was reniced, pinned or its CPU-time limits lowered; a cached bandwidth far under the datasheet's is measured
again. Every thread a test disturbs ends before the test does (nice and affinity are per thread on Linux)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from kernel_lsp.contracts.codec import encode
from kernel_lsp.verify import floor as floor_module
from kernel_lsp.verify import schedule
from kernel_lsp.verify.baselines import BaselineCache
from kernel_lsp.verify.floor import Floor, Peaks, Work, device_peaks
from kernel_lsp.candidate.timing import time_callable

ALL_CPUS = frozenset(os.sched_getaffinity(0))
NEEDS_TWO_CPUS = pytest.mark.skipif(len(ALL_CPUS) < 2, reason="narrowing the affinity needs two CPUs or more")


@pytest.fixture(autouse=True)
def fit_before_and_after() -> Iterator[None]:
    assert schedule.judge_schedule() is None, "the test process is disturbed before the test"
    yield
    schedule.restore_schedule()
    assert schedule.judge_schedule() is None, "the test left the process disturbed"


@contextlib.contextmanager
def disturbed_thread(nice: int | None = None, cpus: set[int] | None = None) -> Iterator[int]:
    """A thread of this process that reniced and/or pinned itself, alive until the block ends; its id."""
    ready, done = threading.Event(), threading.Event()
    found: list[int] = []

    def run() -> None:
        tid = threading.get_native_id()
        if nice is not None:
            os.setpriority(os.PRIO_PROCESS, tid, nice)  # raising one's own nice needs no privilege
        if cpus is not None:
            os.sched_setaffinity(tid, cpus)
        found.append(tid)
        ready.set()
        done.wait()

    thread = threading.Thread(target=run, name="disturbed", daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield found[0]
    finally:
        done.set()
        thread.join(10)
        assert not thread.is_alive()
        wait_for_exit(found[0])


def wait_for_exit(tid: int) -> None:
    """join returns once Python is done with the thread, a moment before the kernel is: until then its nice and
    affinity are still in /proc/self/task."""
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not os.path.exists(f"/proc/self/task/{tid}")


# --- judge_schedule and restore_schedule ---------------------------------------------------------------------

def test_an_undisturbed_process_is_fit_and_the_record_is_its_main_threads() -> None:
    start = schedule.started_schedule()
    assert start.nice == os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert start.affinity == frozenset(os.sched_getaffinity(os.getpid()))
    assert dict(start.limits)["RLIMIT_CPU"] == resource.getrlimit(resource.RLIMIT_CPU)
    assert schedule.judge_schedule() is None


def test_a_reniced_thread_is_named() -> None:
    nice = max(10, schedule.started_schedule().nice + 1)
    with disturbed_thread(nice=nice) as tid:
        problem = schedule.judge_schedule()
        assert problem is not None and f"thread {tid}" in problem and f"nice {nice}" in problem, problem
    assert schedule.judge_schedule() is None  # the thread ended


@NEEDS_TWO_CPUS
def test_a_narrowed_affinity_is_named_and_restore_puts_it_back() -> None:
    one = min(ALL_CPUS)
    with disturbed_thread(cpus={one}) as tid:
        problem = schedule.judge_schedule()
        assert problem is not None and f"thread {tid}" in problem and f"CPU {one} only" in problem, problem
        assert schedule.restore_schedule() == []  # widening one's own threads' affinity needs no privilege
        assert frozenset(os.sched_getaffinity(tid)) == schedule.started_schedule().affinity
        assert schedule.judge_schedule() is None


@NEEDS_TWO_CPUS
def test_the_main_thread_pinned_is_named_and_put_back() -> None:
    os.sched_setaffinity(0, {max(ALL_CPUS)})
    try:
        problem = schedule.judge_schedule()
        assert problem is not None and f"thread {os.getpid()}" in problem, problem
        assert schedule.restore_schedule() == []
        assert frozenset(os.sched_getaffinity(0)) == ALL_CPUS
    finally:
        os.sched_setaffinity(0, ALL_CPUS)


def test_a_nice_that_cannot_be_lowered_back_is_said(monkeypatch) -> None:
    with disturbed_thread(nice=19) as tid:
        def refused(which: int, who: int, value: int) -> None:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "setpriority", refused)  # as any user but root, the kernel refuses it so
        [failed] = schedule.restore_schedule()
        assert f"thread {tid}" in failed and "nice 19 cannot be lowered back" in failed, failed
        assert "Operation not permitted" in failed
        assert schedule.judge_schedule() is not None
        monkeypatch.undo()


@pytest.mark.skipif(os.geteuid() != 0, reason="as any user but root, a raised nice cannot be lowered back")
def test_as_root_a_raised_nice_is_lowered_back() -> None:
    with disturbed_thread(nice=19) as tid:
        assert schedule.restore_schedule() == []
        assert os.getpriority(os.PRIO_PROCESS, tid) == schedule.started_schedule().nice
        assert schedule.judge_schedule() is None


def test_a_lowered_cpu_time_limit_is_named_and_raised_back() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    lowered = 10**6 if hard == resource.RLIM_INFINITY else min(hard, 10**6) - 1
    if soft != resource.RLIM_INFINITY and soft <= lowered:
        pytest.skip(f"RLIMIT_CPU is {soft} already")
    resource.setrlimit(resource.RLIMIT_CPU, (lowered, hard))
    try:
        problem = schedule.judge_schedule()
        assert problem is not None and f"RLIMIT_CPU was lowered to {lowered}" in problem, problem
        assert schedule.restore_schedule() == []  # up to the hard limit, which stayed
        assert resource.getrlimit(resource.RLIMIT_CPU) == (soft, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def test_cpu_sets_read_as_ranges() -> None:
    assert schedule.readable_cpus(frozenset({0, 1, 2, 3, 6, 8, 9})) == "0-3,6,8-9"


# --- baselines: not cached when measured while the judge was disturbed --------------------------------------

def baseline_key() -> str:
    return BaselineCache.key("class Model: ...", "cpu", torch.__version__, {"calls": 5})


def time_tiny_model() -> dict:
    model = torch.nn.Linear(8, 8)
    inputs = [(torch.randn(4, 8),)]

    def call(*args: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(*args)
    return time_callable(call, inputs, device="cpu", calls=5, warmup=1).to_dict()


def test_a_baseline_timed_while_a_thread_is_reniced_is_not_cached(tmp_path) -> None:
    cache, key = BaselineCache(tmp_path), baseline_key()
    assert cache.get(key, "eager") is None  # the miss: the judge is fit before timing
    with disturbed_thread(nice=10) as tid:
        timing = time_tiny_model()  # the renice lands while the baseline is timed
        cache.put(key, "eager", timing)
    assert not cache.path(key, "eager").exists()
    assert f"thread {tid}" in cache.schedule["eager"] and "nice 10" in cache.schedule["eager"]
    assert timing["median_ms"] > 0  # the figure is still there for this verification

    again = BaselineCache(tmp_path)  # undisturbed, the next verification times it again and caches it
    assert again.get(key, "eager") is None
    again.put(key, "eager", time_tiny_model())
    assert again.schedule == {} and again.get(key, "eager") is not None


def test_a_baseline_whose_judge_could_not_be_restored_before_timing_is_not_cached(tmp_path, monkeypatch) -> None:
    cache, key = BaselineCache(tmp_path), baseline_key()
    with disturbed_thread(nice=19) as tid:
        monkeypatch.setattr(os, "setpriority", lambda *args: (_ for _ in ()).throw(PermissionError(1, "refused")))
        assert cache.get(key, "eager") is None  # the check before timing finds the thread still at 19
        monkeypatch.undo()
    timing = time_tiny_model()  # the thread ended: the check after timing alone would pass
    cache.put(key, "eager", timing)
    assert not cache.path(key, "eager").exists()
    assert f"thread {tid}" in cache.schedule["eager"]


# --- device peaks: not cached when measured while the judge was disturbed, nor far under the datasheet ------

FAKE = Peaks(bandwidth_gbs=800.0, peak_tflops=50.0, how="measured by the test")


def cpu_peaks_path(tmp_path):
    return floor_module.peaks_path(tmp_path, floor_module.device_name(torch.device("cpu")))


def test_peaks_measured_while_a_thread_is_reniced_are_used_but_not_cached(tmp_path, monkeypatch) -> None:
    with contextlib.ExitStack() as stack:
        def measure_while_disturbed(device: torch.device) -> Peaks:
            stack.enter_context(disturbed_thread(nice=10))  # ends with the stack, after device_peaks returned
            return FAKE

        monkeypatch.setattr(floor_module, "measure_peaks", measure_while_disturbed)
        peaks = device_peaks("cpu", tmp_path)
    assert (peaks.bandwidth_gbs, peaks.peak_tflops) == (800.0, 50.0)
    assert peaks.schedule is not None and "nice 10" in peaks.schedule
    assert not cpu_peaks_path(tmp_path).exists()
    assert "nice 10" in encode(Floor(Work(bytes=8, flops=0), peaks).to_report())["schedule"]

    monkeypatch.setattr(floor_module, "measure_peaks", lambda device: FAKE)
    assert device_peaks("cpu", tmp_path) == FAKE  # undisturbed: measured again, and now cached
    assert json.loads(cpu_peaks_path(tmp_path).read_text())["bandwidth_gbs"] == 800.0


def test_real_cpu_peaks_measured_while_a_thread_is_reniced_are_not_cached(tmp_path, monkeypatch) -> None:
    real = floor_module.measure_peaks
    small = floor_module.MeasurementPlan(copy_sizes=(1 << 20,), matmul_size=128, matmul_dtypes=(torch.float32,),
                                         repeats=2)
    monkeypatch.setattr(floor_module, "CPU_PLAN", small)
    with contextlib.ExitStack() as stack:
        def measure_while_disturbed(device: torch.device) -> Peaks:
            stack.enter_context(disturbed_thread(nice=10))
            return real(device)

        monkeypatch.setattr(floor_module, "measure_peaks", measure_while_disturbed)
        peaks = device_peaks("cpu", tmp_path)
    assert peaks.bandwidth_gbs > 0 and peaks.schedule is not None
    assert not cpu_peaks_path(tmp_path).exists()


def test_a_cached_bandwidth_far_under_the_datasheet_is_measured_again(tmp_path, monkeypatch) -> None:
    path = cpu_peaks_path(tmp_path)
    name = floor_module.device_name(torch.device("cpu"))
    floor_module.write_cached_peaks(path, name, Peaks(bandwidth_gbs=11.0, peak_tflops=50.0, how="poisoned"))
    monkeypatch.setattr(floor_module, "datasheet_bandwidth_gbs", lambda device: 1000.0)
    measured: list[torch.device] = []
    monkeypatch.setattr(floor_module, "measure_peaks", lambda device: measured.append(device) or FAKE)
    assert device_peaks("cpu", tmp_path) == FAKE and len(measured) == 1
    assert json.loads(path.read_text())["bandwidth_gbs"] == 800.0  # the trusted figure replaced the poisoned one
    assert device_peaks("cpu", tmp_path) == FAKE and len(measured) == 1  # 80% of the datasheet: a cache hit


def test_a_fresh_bandwidth_far_under_the_datasheet_is_not_cached_and_the_datasheet_stands_in(tmp_path,
                                                                                          monkeypatch) -> None:
    monkeypatch.setattr(floor_module, "datasheet_bandwidth_gbs", lambda device: 1000.0)
    monkeypatch.setattr(floor_module, "measure_peaks", lambda device: Peaks(11.0, 50.0, "measured while pinned"))
    peaks = device_peaks("cpu", tmp_path)
    assert peaks.bandwidth_gbs == 1000.0 and peaks.peak_tflops == 50.0 and peaks.schedule is None
    assert "11 GB/s is under 25% of the datasheet's 1000 GB/s" in peaks.datasheet
    assert "datasheet bandwidth stands in" in peaks.how
    assert not cpu_peaks_path(tmp_path).exists()
    assert "datasheet" in encode(Floor(Work(bytes=8, flops=0), peaks).to_report())


def test_without_a_datasheet_nothing_is_compared(tmp_path, monkeypatch) -> None:
    assert floor_module.datasheet_bandwidth_gbs(torch.device("cpu")) is None
    monkeypatch.setattr(floor_module, "measure_peaks", lambda device: Peaks(0.5, 0.01, "a slow machine"))
    assert device_peaks("cpu", tmp_path) == Peaks(0.5, 0.01, "a slow machine")
    assert cpu_peaks_path(tmp_path).exists()


class FakeNvml(SimpleNamespace):
    NVML_CLOCK_MEM = 2
    NVML_DEVICE_MIG_ENABLE = 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802 (NVML's names)
        return f"gpu{index}"

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> int:  # noqa: N802
        assert clock == self.NVML_CLOCK_MEM
        return 2619  # an H100 SXM's HBM3, in MHz

    def nvmlDeviceGetMemoryBusWidth(self, handle: str) -> int:  # noqa: N802
        return 5120

    def nvmlDeviceGetMigMode(self, handle: str) -> tuple[int, int]:  # noqa: N802
        return (self.mig, self.mig)


def test_the_datasheet_bandwidth_is_double_data_rate_times_the_bus_width(monkeypatch) -> None:
    import profilers.nvml

    for mig, expected in ((0, pytest.approx(3352.32)), (1, None)):  # a MIG slice gets only part of it
        monkeypatch.setattr(profilers.nvml, "_nvml", lambda mig=mig: FakeNvml(mig=mig))
        floor_module.nvml_datasheet_gbs.cache_clear()
        try:
            assert floor_module.nvml_datasheet_gbs(0) == expected
        finally:
            floor_module.nvml_datasheet_gbs.cache_clear()
