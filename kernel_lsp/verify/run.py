"""verify_candidate: the verdict on one candidate, computed inside a sandboxed child (a SandboxTask entry).

The order matters. The reference is imported, built and run first (which input distributions it accepts),
then the identities of the timers and the live threads are noted, and only then is the candidate imported:
whatever it replaces or starts from then on is its doing. Each correctness trial draws fresh inputs on the
target device, alternates which model runs first (flushing the allocator and poisoning its free memory
before the candidate), records the kernels the candidate launched, checks its inputs are unchanged, that
nothing is still writing its output after forward returned, and compares. A failing trial, and the first,
are run again over differently poisoned memory: an output that changes read memory it never wrote.
Only a candidate that passed everything is timed, against the reference eager and under torch.compile.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernel_lsp.verify.baselines import BaselineCache, gpu_state
from kernel_lsp.verify.compare import Comparison, Tolerance, chunks, compare_outputs, tolerance_for
from kernel_lsp.verify.models import WEIGHTS_SEED, load_module, share_weights
from kernel_lsp.verify.floor import Floor, below_floor, device_peaks, problem_work
from kernel_lsp.verify.integrity import (
    SECOND_POISON_BYTE,
    TorchState,
    as_bytes,
    changed_since,
    flush_allocator,
    input_snapshot,
    patched_timers,
    poison_free_memory,
    tensor_leaves,
    thread_idents,
    threads_started,
    timer_snapshot,
    torch_patches,
    torch_snapshot,
)
from kernel_lsp.verify.kernels import RecordingSession, Window, classify, launches_off_stream, own_kernel_names
from kernel_lsp.verify.timing import Timing, make_input_sets, resolve_device, speedup, time_callable

DISTRIBUTIONS = ("own", "normal", "scaled")
SCALE = 16.0  # "scaled" inputs: the problem's own values times this, so magnitudes outside [0, 1) are covered
TIMING_SEED = 10_000  # timed inputs are drawn apart from the trials' seeds
MAX_TIMING_INPUT_SETS = 4
TIMING_MEMORY_FRACTION = 0.25  # rotated input sets may take this much of the free device memory
WARMUP_MS = 250.0  # warm-up calls run at least this long before a candidate or a baseline is timed
TORCH_PATCHES_LISTED = 5  # names in the integrity-torch-patched message
THREAD_JOIN_S = 1.0  # how long a thread the candidate left running gets to finish before outputs are compared


class Phases:
    """Seconds spent per phase of one verification, reported so a slow verdict says where its time went."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


PHASES = Phases()  # one verification per sandbox child, so one set of phases per process


class ReferenceFailed(Exception):
    """The reference itself cannot be imported, built or run: nothing can be verified against it."""


@dataclass
class CandidateRun:
    output: Any  # dropped once compared: a trial's output may take GiBs
    window: Window | None  # the recorded launches (filled when the recording session ends); None when not recorded
    mutated: list[int]
    pending: bool  # the output changed after forward returned and the current stream was done
    threads: list[str]


@dataclass
class Verdict:
    device: str
    integrity: list[dict[str, str]] = field(default_factory=list)

    def reject(self, code: str, message: str) -> None:
        if not any(p["code"] == code for p in self.integrity):  # one finding per code, the first occurrence
            self.integrity.append({"code": code, "message": message})


def verify_candidate(reference: str, candidate: str, device: str = "auto", trials: int = 5, timed_calls: int = 100,
                     warmup: int = 10, seed: int = 0, tolerances: dict[str, dict[str, float]] | None = None,
                     baselines: list[str] | tuple[str, ...] = ("eager", "compile"),
                     allowed_kernels: list[str] | tuple[str, ...] = (), timing: bool = True,
                     cache_dir: str | None = None, files: dict[str, str] | None = None) -> dict[str, Any]:
    """The sandbox entry: a VerifyReport (docs/ARCHITECTURE.md), or {"verdict": "unavailable", "reason"}."""
    started = time.perf_counter()
    target = choose_device(device)
    if isinstance(target, str):
        return {"verdict": "unavailable", "reason": target}
    if target.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the candidate imports triton
    overrides = {name: Tolerance(**t) for name, t in (tolerances or {}).items()}
    PHASES.seconds.clear()
    try:
        with PHASES("reference set-up"):
            reference_module, ref_model = build_reference(reference, target)
            distributions = accepted_distributions(reference_module.get_inputs, ref_model, target, seed)
    except ReferenceFailed as exc:
        return {"verdict": "unavailable", "reason": str(exc)}
    timers, threads, torch_before = timer_snapshot(), thread_idents(), torch_snapshot()
    with PHASES("candidate import and build"):
        candidate_module = load_module(candidate, "kernel_lsp_candidate")
        torch.manual_seed(WEIGHTS_SEED)
        cand_model = candidate_module.ModelNew(*init_inputs(reference_module))
        weights = share_weights(ref_model, cand_model)
        cand_model = cand_model.to(target).eval()
    verdict = Verdict(device=target.type)
    own = own_kernel_names(files or {})
    trials_report = run_trials(reference_module.get_inputs, ref_model, cand_model, target, trials, seed,
                               distributions, overrides, own, tuple(allowed_kernels), verdict)
    trials_report["weights"] = weights
    report_timers(timers, verdict)
    report_torch_patches(torch_before, verdict)
    left_running = threads_started(threads, thread_idents())
    if left_running:
        verdict.reject("integrity-thread", f"the candidate started thread(s) still alive: {', '.join(left_running)}")
    report: dict[str, Any] = {"device": target.type, "correctness": trials_report, "integrity": verdict.integrity,
                              "kernels": trials_report.pop("kernels"), "timing": None,
                              "speedup": {"eager": None, "compile": None}, "gpu": None, "floor": None}
    correct = trials_report["passed"] == trials_report["trials"] and not verdict.integrity
    if correct and timing:
        measure(report, reference_module, ref_model, cand_model, target, timed_calls, warmup, seed,
                tuple(baselines), Path(cache_dir) if cache_dir else None, Path(reference).read_text(), verdict)
    report["verdict"] = "verified" if correct and not verdict.integrity else "rejected"
    report["duration_s"] = time.perf_counter() - started
    report["phases_s"] = {name: round(seconds, 3) for name, seconds in PHASES.seconds.items()}
    return report


def choose_device(device: str) -> torch.device | str:
    """The target device, or why it cannot be used."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        return ("device 'cuda' was asked for but torch sees no GPU here "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); use device 'cpu' for Triton "
                "kernels under TRITON_INTERPRET=1")
    if device not in ("cpu",) and not device.startswith("cuda"):
        return f"unknown device {device!r}: expected auto, cuda or cpu"
    return resolve_device(device)


def init_inputs(module: Any) -> list:
    return list(module.get_init_inputs()) if hasattr(module, "get_init_inputs") else []


def build_reference(path: str, target: torch.device) -> tuple[Any, torch.nn.Module]:
    try:
        module = load_module(path, "kernel_lsp_reference")
        if not hasattr(module, "get_inputs"):
            raise ReferenceFailed(f"the reference {Path(path).name} defines no get_inputs()")
        torch.manual_seed(WEIGHTS_SEED)
        model = module.Model(*init_inputs(module))
        return module, model.to(target).eval()
    except ReferenceFailed:
        raise
    except Exception as exc:  # the reference is the user's too, but a broken one makes every verdict moot
        raise ReferenceFailed(f"the reference {Path(path).name} failed to load: {type(exc).__name__}: {exc}") from exc


@PHASES("reference runs")
def run_reference(model: torch.nn.Module, inputs: tuple) -> Any:
    try:
        with torch.no_grad():
            return model(*inputs)
    except Exception as exc:
        raise ReferenceFailed(f"the reference's forward failed: {type(exc).__name__}: {exc}") from exc


def draw_inputs(get_inputs: Callable[[], list], seed: int, target: torch.device, distribution: str) -> tuple:
    """One input set made on the target device; floating tensors redrawn or scaled for the other distributions."""
    inputs = make_input_sets(get_inputs, 1, seed, str(target))[0]
    return tuple(reshaped_distribution(value, distribution, seed) for value in inputs)


def reshaped_distribution(value: Any, distribution: str, seed: int) -> Any:
    if distribution == "own" or not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value  # integer inputs are indices or sizes: their range is part of the problem
    if distribution == "scaled":
        return value * SCALE
    generator = torch.Generator(device=value.device).manual_seed(seed)
    return torch.randn(value.shape, dtype=value.dtype, device=value.device, generator=generator)


def finite(output: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensor_leaves(output) if t.is_floating_point())


def accepted_distributions(get_inputs: Callable[[], list], model: torch.nn.Module, target: torch.device,
                           seed: int) -> list[str]:
    """The problem's own distribution, plus each other one on which the reference runs and stays finite."""
    if not finite(run_reference(model, draw_inputs(get_inputs, seed, target, "own"))):
        raise ReferenceFailed("the reference's output holds NaN or Inf on the problem's own inputs")
    accepted = ["own"]
    for distribution in DISTRIBUTIONS[1:]:
        try:
            output = run_reference(model, draw_inputs(get_inputs, seed, target, distribution))
        except ReferenceFailed:
            continue  # e.g. a log of a negative value raising: the problem's domain excludes this distribution
        if finite(output):
            accepted.append(distribution)
    return accepted


def clone_inputs(inputs: tuple) -> tuple:
    return tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in inputs)


@PHASES("poisoning memory")
def fresh_memory(target: torch.device, byte: int | None = None) -> None:
    """Nothing of an earlier run left for the next one to read: allocator flushed, free memory poisoned."""
    flush_allocator(target)
    if byte is None:
        poison_free_memory(target)
    else:
        poison_free_memory(target, byte)


def snapshot(output: Any) -> list[torch.Tensor]:
    return [t.detach().clone() for t in tensor_leaves(output)]


def run_candidate(model: torch.nn.Module, inputs: tuple, target: torch.device,
                  session: RecordingSession | None) -> CandidateRun:
    """Runs forward once, watching what it launches (in a window of `session`, unless None), what it changes,
    and what it leaves running."""
    with PHASES("input snapshots"):
        before, threads = input_snapshot(inputs), thread_idents()
    window = session.window() if session is not None else contextlib.nullcontext()
    with PHASES("candidate runs"), torch.no_grad(), window as seen:
        output = model(*inputs)
        if target.type == "cuda":
            torch.cuda.current_stream(target).synchronize()  # what the caller may rely on, and no more
        returned = snapshot(output)
        if target.type == "cuda":
            torch.cuda.synchronize(target)
    started = threads_started(threads, thread_idents())
    for thread in threading.enumerate():
        if thread.name in started:
            thread.join(THREAD_JOIN_S)
    pending = any(not torch.equal(as_bytes(a), as_bytes(b)) for a, b in zip(returned, tensor_leaves(output)))
    with PHASES("input snapshots"):
        mutated = changed_since(before, inputs)
    return CandidateRun(output, seen, mutated, pending, started)


def outputs_agree(first: Any, second: Any, overrides: dict[str, Tolerance]) -> bool:
    """Two runs of the candidate on the same inputs give the same output: within tolerance, NaN where NaN."""
    a_leaves, b_leaves = list(tensor_leaves(first)), list(tensor_leaves(second))
    if len(a_leaves) != len(b_leaves):
        return False
    return all(a.shape == b.shape and a.dtype == b.dtype and same_within(a, b, overrides)
               for a, b in zip(a_leaves, b_leaves))


def same_within(a: torch.Tensor, b: torch.Tensor, overrides: dict[str, Tolerance]) -> bool:
    if not a.is_floating_point():
        return torch.equal(a, b)
    rule = tolerance_for(a.dtype, overrides)
    # chunk by chunk: two whole float64 copies of a 6.4 GB output ran an 80 GB H100 out of memory
    return all(bool(torch.isclose(x.double(), y.double(), atol=rule.atol, rtol=rule.rtol, equal_nan=True).all())
               for _, x, y in chunks(a.reshape(-1), b.reshape(-1)))


def run_trials(get_inputs: Callable[[], list], ref_model: torch.nn.Module, cand_model: torch.nn.Module,
               target: torch.device, trials: int, seed: int, distributions: list[str],
               overrides: dict[str, Tolerance], own: set[str], allowed: tuple[str, ...],
               verdict: Verdict) -> dict[str, Any]:
    """Correctness over `trials` fresh input sets, alternating order and distribution; integrity noted in verdict.
    One recording session covers the trials; what each run launched is judged once it ends."""
    passed_by_order = {"reference-first": [], "candidate-first": []}
    worst: Comparison | None = None
    used: list[str] = []
    runs: list[CandidateRun] = []
    with RecordingSession(str(target)) as session:
        for index in range(trials):
            distribution = distributions[index % len(distributions)]
            used.append(distribution)
            inputs = draw_inputs(get_inputs, seed + index, target, distribution)
            order = "reference-first" if index % 2 == 0 else "candidate-first"
            expected, run = one_trial(ref_model, cand_model, inputs, target, order, session)
            comparison = compare_outputs(expected, run.output, overrides)
            del expected
            passed_by_order[order].append(comparison.ok)
            if worst is None or worse(comparison, worst):
                worst = comparison
            if index == 0 or not comparison.ok:
                check_rerun(cand_model, inputs, target, run, overrides, comparison, verdict)
            run.output = None
            runs.append(run)
    custom: set[str] = set()
    stock: set[str] = set()
    for index, run in enumerate(runs):
        use = classify(run.window.launches, own, allowed)
        custom.update(use.custom)
        stock.update(use.stock)
        note_run_integrity(run, use, index, verdict, session)
    note_order(passed_by_order, verdict)
    passed = sum(sum(oks) for oks in passed_by_order.values())
    return {"trials": trials, "passed": passed, "distributions": used,
            "worst": asdict(worst) if worst is not None else None,
            "kernels": {"custom": sorted(custom), "stock": sorted(stock), "how": session.how}}


def one_trial(ref_model: torch.nn.Module, cand_model: torch.nn.Module, inputs: tuple, target: torch.device,
              order: str, session: RecordingSession) -> tuple[Any, CandidateRun]:
    if order == "reference-first":
        expected = run_reference(ref_model, clone_inputs(inputs))
        fresh_memory(target)
        run = run_candidate(cand_model, clone_inputs(inputs), target, session)
    else:
        fresh_memory(target)
        run = run_candidate(cand_model, clone_inputs(inputs), target, session)
        flush_allocator(target)
        expected = run_reference(ref_model, clone_inputs(inputs))
    return expected, run


def note_run_integrity(run: CandidateRun, use: Any, index: int, verdict: Verdict, session: RecordingSession) -> None:
    trial = f"trial {index + 1}"
    if run.mutated:
        verdict.reject("integrity-input-mutated",
                       f"the candidate changed input tensor(s) {run.mutated} in place ({trial})")
    problem = use.problem()
    if problem is not None:
        detail = "" if session.how != "none" else f" (kernel launches cannot be observed here: {session.reason})"
        verdict.reject("integrity-no-custom-kernel", f"{problem}{detail} ({trial})")
    others = [launch.name for launch in launches_off_stream(run.window.launches, run.window.current_stream)]
    if others:
        verdict.reject("integrity-other-stream", f"kernels ran on a stream other than the current one: "
                                                 f"{', '.join(sorted(set(others))[:3])} ({trial})")
    if run.pending:
        verdict.reject("integrity-pending-work", "the output was still being written after forward returned "
                                                 f"and the current stream was done ({trial})")
    if run.threads:
        verdict.reject("integrity-thread", f"forward started thread(s) {', '.join(run.threads)} ({trial})")


def check_rerun(cand_model: torch.nn.Module, inputs: tuple, target: torch.device, first: CandidateRun,
                overrides: dict[str, Tolerance], comparison: Comparison, verdict: Verdict) -> None:
    """Run again on the same inputs over memory poisoned with other bytes: a changed output read garbage."""
    fresh_memory(target, SECOND_POISON_BYTE)
    second = run_candidate(cand_model, clone_inputs(inputs), target, None)
    if outputs_agree(first.output, second.output, overrides):
        return
    if target.type == "cuda":
        verdict.reject("integrity-uninitialized-output",
                       "the output depends on memory the candidate never wrote: two runs on the same inputs "
                       "differ after the free memory was filled with different bytes"
                       + (" (the first run read NaN poison)" if comparison.reason == "nan" else ""))
    else:
        verdict.reject("integrity-nondeterministic", "two runs on the same inputs gave different outputs")


def worse(a: Comparison, b: Comparison) -> bool:
    """A failure is worse than a pass; between equals, the larger absolute error."""
    if a.ok != b.ok:
        return not a.ok
    return a.max_abs_error > b.max_abs_error


def note_order(passed_by_order: dict[str, list[bool]], verdict: Verdict) -> None:
    reference_first, candidate_first = passed_by_order["reference-first"], passed_by_order["candidate-first"]
    if reference_first and candidate_first and all(reference_first) and not any(candidate_first):
        verdict.reject("integrity-order", "the candidate is right only when the reference ran just before it: "
                                          "it reads what the reference left in memory")


def report_timers(before: dict[str, object], verdict: Verdict) -> None:
    patched = patched_timers(before, timer_snapshot())
    if patched:
        verdict.reject("integrity-timer-patched", f"the candidate replaced timing functions: {', '.join(patched)}")


def report_torch_patches(before: TorchState, verdict: Verdict) -> None:
    patched = torch_patches(before)
    if patched:
        listed = ", ".join(patched[:TORCH_PATCHES_LISTED]) + (", ..." if len(patched) > TORCH_PATCHES_LISTED else "")
        verdict.reject("integrity-torch-patched", f"the candidate changed torch itself: {listed}")


def timing_input_sets(get_inputs: Callable[[], list], target: torch.device, seed: int) -> list[tuple]:
    """Rotated input sets, as many as fit in a quarter of the free memory (at least one, at most four)."""
    first = make_input_sets(get_inputs, 1, seed + TIMING_SEED, str(target))
    count = MAX_TIMING_INPUT_SETS
    if target.type == "cuda":
        size = sum(t.numel() * t.element_size() for t in tensor_leaves(first[0]))
        free, _ = torch.cuda.mem_get_info(target)
        count = max(1, min(MAX_TIMING_INPUT_SETS, int(free * TIMING_MEMORY_FRACTION // max(size, 1))))
    return first + make_input_sets(get_inputs, count - 1, seed + TIMING_SEED + 1, str(target))


def no_grad_call(model: Callable[..., Any]) -> Callable[..., Any]:
    def call(*inputs: Any) -> Any:
        with torch.no_grad():
            return model(*inputs)
    return call


def measure(report: dict[str, Any], reference_module: Any, ref_model: torch.nn.Module, cand_model: torch.nn.Module,
            target: torch.device, calls: int, warmup: int, seed: int, baselines: tuple[str, ...],
            cache_dir: Path | None, reference_text: str, verdict: Verdict) -> None:
    """Candidate and baseline timings (baselines from the cache when the same setting was timed before), the
    GPU's state around them, and the physical floor check."""
    flush_allocator(target)
    input_sets = timing_input_sets(reference_module.get_inputs, target, seed)
    before = gpu_state(target)
    with PHASES("timing the candidate"):
        candidate = time_callable(no_grad_call(cand_model), input_sets, device=str(target), calls=calls,
                                  warmup=warmup, warmup_ms=WARMUP_MS)
    timings: dict[str, Any] = {"candidate": candidate.to_dict(), "eager": None, "compile": None,
                               "compileError": None, "cached": {"eager": False, "compile": False}}
    cache = BaselineCache(cache_dir) if cache_dir is not None else None
    key = cache.key(reference_text, device_name(target), torch.__version__,
                    {"calls": calls, "warmup": warmup, "seed": seed, "sets": len(input_sets),
                     "shapes": input_signature(input_sets[0])}) if cache else ""
    for kind in baselines:
        cached = cache.get(key, kind) if cache else None
        if cached is not None:
            timings[kind], timings["cached"][kind] = cached, True
            continue
        try:
            with PHASES(f"timing the {kind} baseline"):
                timed = time_baseline(kind, ref_model, input_sets, target, calls, warmup)
        except Exception as exc:  # torch.compile fails on some models and machines: say why, keep eager
            timings["compileError"] = first_line(exc)
            continue
        timings[kind] = timed.to_dict()
        if cache:
            cache.put(key, kind, timings[kind])
    report["timing"] = timings
    report["gpu"] = {"before": before, "after": gpu_state(target)}
    for kind in baselines:
        if timings[kind] is not None:
            report["speedup"][kind] = speedup(Timing(**timings[kind]), candidate)
    with PHASES("physical floor"):
        report["floor"] = physical_floor(ref_model, input_sets[0], target, cache_dir, candidate, verdict)


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def time_baseline(kind: str, ref_model: torch.nn.Module, input_sets: list[tuple], target: torch.device, calls: int,
                  warmup: int) -> Timing:
    model: Callable[..., Any] = ref_model
    if kind == "compile":
        model = torch.compile(ref_model)
        no_grad_call(model)(*input_sets[0])  # compiles here, so warm-up calls time the compiled code only
    return time_callable(no_grad_call(model), input_sets, device=str(target), calls=calls, warmup=warmup,
                         warmup_ms=WARMUP_MS)


def device_name(target: torch.device) -> str:
    return torch.cuda.get_device_name(target) if target.type == "cuda" else "cpu"


def input_signature(inputs: tuple) -> list:
    return [[list(v.shape), str(v.dtype)] if isinstance(v, torch.Tensor) else repr(v) for v in inputs]


def physical_floor(ref_model: torch.nn.Module, inputs: tuple, target: torch.device, cache_dir: Path | None,
                   candidate: Timing, verdict: Verdict) -> dict[str, Any]:
    floor = Floor(problem_work(ref_model, inputs), device_peaks(target, cache_dir))
    problem = below_floor(candidate.median_ms, floor)
    if problem is not None:
        verdict.reject("integrity-below-floor", problem)
    return floor.to_dict()
