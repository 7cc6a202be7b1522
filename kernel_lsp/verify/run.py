"""verify_candidate: the verdict on one candidate, computed inside a sandboxed child (a SandboxTask entry).

This process is the judge: it never imports the candidate. The candidate lives in a process of its own
(verify/host.py, started first so its imports overlap the reference's set-up), confined to its scratch folder
and the build caches, without the network. The judge imports the reference, draws every input set by seed,
computes the reference's outputs here, where no candidate code ever ran, and sends the candidate a copy of the
inputs in shared memory (verify/exchange.py). Each correctness trial runs forward there over freshly poisoned
memory, and the judge looks itself: at the output as it was when forward returned and once everything the
candidate started has finished (pending work), at its copy of the inputs (mutation), and compares. The first
trial, and any failing one, are run again over differently poisoned memory: an output that changes read
memory it never wrote. What only the candidate's process can see (the kernels it launched, torch patched, timers
replaced, threads left) it reports, and the judge records it as reported. Only a candidate that passed
everything is timed, by the judge's clock alone: whole batches of its calls, in rounds interleaved with the
baselines' batches (run here, in the clean process, by the same batch function), on input values the judge
changes between rounds; nothing the candidate's process says of its own time is used (`measure`).

Every request after the candidate's load (its import and build, bounded by the sandbox's wall time) has a time
limit derived from the reference's own slowest call (HangLimits): a candidate that hangs is a `timeout`
(run-timeout) within seconds, not when the sandbox or the client gives up. When the candidate's process has ended, anything it started and left running was killed by its
keeper and is integrity-process-left.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from kernel_lsp.kinds.options import VerifyOptions, from_config
from kernel_lsp.process.isolation import use_judge_build_caches
from kernel_lsp.process.namespaces import isolation_status
from kernel_lsp.sources import parse_python
from kernel_lsp.verify.baselines import BaselineCache, gpu_state
from kernel_lsp.verify.candidate_process import CallLimit, CandidateFailed, CandidateProcess, candidate_process
from kernel_lsp.verify.compare import Comparison, Tolerance, chunks, compare_outputs, refused, tolerance_for
from kernel_lsp.verify.exchange import Exchange
from kernel_lsp.verify.models import WEIGHTS_SEED, load_module
from kernel_lsp.verify.floor import Floor, below_floor, device_peaks, problem_work, readable_bytes
from kernel_lsp.verify.integrity import (
    POISON_BYTE,
    SECOND_POISON_BYTE,
    as_bytes,
    changed_since,
    copied,
    flush_allocator,
    input_snapshot,
    tensor_leaves,
    tensor_metadata,
)
from kernel_lsp.verify.kernels import KernelLaunch, Window, classify, launches_off_stream, own_kernel_names
from kernel_lsp.verify.shared_fill import FILLED
from kernel_lsp.verify.verdict import COVERED
from kernel_lsp.verify.timing import (
    JUDGE_CLOCK,
    MAX_WARMUP_CALLS,
    Timing,
    l2_scratch,
    make_input_sets,
    median_interval,
    resolve_device,
    speedup,
    speedup_interval,
    summarize,
    time_batch,
)

DISTRIBUTIONS = ("own", "normal", "scaled")
SCALE = 16.0  # "scaled" inputs: the problem's own values times this, so magnitudes outside [0, 1) are covered
TIMING_SEED = 10_000  # timed inputs are drawn apart from the trials' seeds
STALE_SEED = 20_000  # and so are the new values of the stale-output checks
SCATTERED_FRACTION = 0.001  # of the elements the "scattered" stale-output check changes
REFRESH_SEED = 1_000_000  # and the timing's sets' values after their first round (verify/run.py TimingSets)
ABLATION_SEED = 30_000  # and the inputs of the output-from-kernel check
STOCK_OPS_LISTED = 5  # stock kernels and operators named in integrity-output-not-from-kernel
MAX_TIMING_INPUT_SETS = 64
FIRST_TIMING_SETS = 4  # drawn before the warm-up; more, up to the batch size, once it is known
TIMING_MEMORY_FRACTION = 0.25  # the timing's input sets (and their outputs) may take this much free device memory
TIMING_CPU_BYTES = 256 << 20  # and this much memory on the CPU
COPY_TRIES = 3  # copies of an output the judge times: the fastest is what keeping one costs
ROUND_TRIPS = 5  # pings to the candidate's process; their median is its round trip
ROUND_TRIP_FACTOR = 50  # a batch is sized to take at least this many round trips
MIN_ROUNDS = 10  # interleaved rounds at the least (unless timedCalls asks for fewer calls), however large a batch
CACHE_CHECK_ROUNDS = 3  # rounds a cached baseline runs to show it still holds
CACHE_SLACK = 0.05
WARMUP_MS = 250.0  # warm-up calls run at least this long before a candidate or a baseline is timed
TORCH_PATCHES_LISTED = 5  # names in the integrity-torch-patched message
THREAD_JOIN_S = 1.0  # how long a thread the candidate left running gets to finish before outputs are compared
# each trial's run gets this many times its footprint (inputs and the reference's output, in bytes) of poisoned
# memory in the candidate's allocator; the judge keeps room for its own copies
POISON_FOOTPRINTS = 2
POISON_MIN_BYTES = 256 << 20
JUDGE_FOOTPRINTS = 4
KEEP_CACHE_FREE_FRACTION = 0.5  # between trials, the judge keeps its cached memory while this much is free
TIMED_CALLS_RECORDED = 1  # extra calls between the timed batches, recorded (each costs a profiler start on CUDA)
# a request to the candidate's process hangs after hangTimeoutS plus, per forward it runs, this many times the
# reference's slowest call (the candidate's first call may compile: the floor covers that) or OWN_FACTOR times the
# candidate's own slowest forward so far, whichever is longer (Triton's interpreter on the CPU is that much slower)
HANG_FACTOR = 100
OWN_FACTOR = 10
PROCESSES_LISTED = 3  # named in integrity-process-left
# what each request to the candidate's process runs, as a hang's message names it
ASKED = {"forward": "forward", "again": "forward (called again on new inputs)",
         "settle": "the candidate's pending work (its threads, its device work)",
         "ablate": "forward (the output-from-kernel check)", "batch": "a timed batch of forward calls",
         "after_batch": "the candidate's process (between timed batches)", "ping": "the candidate's process (a ping)",
         "timing_sets": "the candidate's process (receiving the timing's inputs)",
         "record_call": "forward (a recorded call between the timed batches)",
         "timed_report": "the candidate's process (its timed outputs)",
         "record": "the candidate's process (a kernel recording)",
         "release": "the candidate's process (releasing a run's tensors)",
         "report": "the candidate's process (its report on itself)"}


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


class Footprint(NamedTuple):
    """A run's bytes: its inputs and the reference's output (what the candidate's output will take)."""
    inputs: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.inputs + self.output


@dataclass
class CandidateRun:
    output: Any  # the settled output, as the judge sees it; dropped once compared (it may take GiBs)
    mutated: list[int]
    pending: bool  # the output changed after forward returned and the current stream was done
    threads: list[str]
    plain: bool  # every output leaf was a plain torch.Tensor in the candidate's process
    shared: tuple = ()  # the judge's view of the inputs the candidate's process got (CUDA IPC, shared files)


@dataclass
class Verdict:
    device: str
    integrity: list[dict[str, str]] = field(default_factory=list)

    def reject(self, code: str, message: str) -> None:
        if not any(p["code"] == code for p in self.integrity):  # one finding per code, the first occurrence
            self.integrity.append({"code": code, "message": message})


@dataclass
class HangLimits:
    """How long a request to the candidate's process may take: hangTimeoutS, plus for each forward the request
    runs HANG_FACTOR times the reference's slowest call, or OWN_FACTOR times the candidate's slowest forward request
    so far if that is longer; no limit until the reference has run."""

    floor_s: float
    reference_s: float | None = None
    forward_s: float = 0.0  # the candidate's slowest forward request, by the judge's clock

    def limit(self, op: str, runs: int, extra_s: float = 0.0) -> CallLimit | None:
        if self.reference_s is None:
            return None
        per_call = max(HANG_FACTOR * self.reference_s, OWN_FACTOR * self.forward_s)
        why = f"hangTimeoutS {self.floor_s:g} s"
        if runs:
            why += (f" + {runs} × {per_call * 1e3:.3g} ms, the longer of {HANG_FACTOR}× the reference's slowest call "
                    f"and {OWN_FACTOR}× the candidate's slowest forward so far")
        return CallLimit(self.floor_s + per_call * runs + extra_s, ASKED[op], why)


@dataclass
class Judge:
    """What every step of one verification shares: the candidate's process, the exchange and the verdict."""

    host: CandidateProcess
    exchange: Exchange
    target: torch.device
    verdict: Verdict
    hang: HangLimits
    overrides: dict[str, Tolerance] = field(default_factory=dict)  # tolerances by dtype
    own: set[str] = field(default_factory=set)  # the candidate's own kernel names
    shared_fill: str | None = None  # CUDA: "filled" while each run's shared-memory fill ran, else the first reason not
    free_poison: str | None = None  # CUDA: "covered" while each run's output fit its poisoned block, else the first why
    allowed: tuple[str, ...] = ()  # kernels the problem allows besides its own

    def ask(self, op: str, runs: int = 0, extra_s: float = 0.0, **fields: Any) -> dict[str, Any]:
        """A request to the candidate's process that runs forward `runs` times, under its HangLimits."""
        reply = self.host.ask(op, self.hang.limit(op, runs, extra_s), **fields)
        if op == "forward":
            self.hang.forward_s = max(self.hang.forward_s, self.host.wall_s[op])
        return reply


def verify_candidate(reference: str, candidate: str, options: dict[str, Any] | None = None,
                     cache_dir: str | None = None, files: dict[str, str] | None = None) -> dict[str, Any]:
    """The sandbox entry: a VerifyReport (docs/ARCHITECTURE.md), or {"verdict": "unavailable", "reason"}.
    `options`: the "verify" job's options as its config has them (kinds.options.VerifyOptions; camelCase keys,
    defaults for those missing)."""
    use_judge_build_caches()  # before the reference's torch.compile builds anything
    opts = from_config(VerifyOptions, options or {})
    started = time.perf_counter()
    target = choose_device(opts.device)
    if isinstance(target, str):
        return {"verdict": "unavailable", "reason": target}
    needs_a_gpu = gpu_only_reason((files or {}).get(candidate, "")) if target.type == "cpu" else None
    if needs_a_gpu is not None:
        return {"verdict": "unavailable", "reason": needs_a_gpu}
    sandbox = isolation_status()
    if opts.require_isolation and not sandbox.startswith("isolated"):
        return {"verdict": "unavailable", "reason": f"the candidate was not run: its sandbox cannot start here "
                                                    f"({sandbox.removeprefix('not isolated: ')}), and requireIsolation "
                                                    f"is on (kernel-lsp doctor says what is missing)"}
    PHASES.seconds.clear()
    with candidate_process(opts.allow_network, target.type, (candidate, reference)) as host:
        judge = Judge(host, Exchange(host.exchange_folder, "judge", host.channel), target, Verdict(device=target.type),
                      HangLimits(opts.hang_timeout_s))
        report = judge_candidate(judge, reference, candidate, opts.trials, opts.timed_calls, opts.warmup, opts.seed,
                                 opts.tolerances, opts.baselines, opts.allowed_kernels, opts.timing, cache_dir,
                                 files or {})
        closing = time.perf_counter()
    PHASES.seconds["closing the candidate's process"] = time.perf_counter() - closing
    if "verdict" in report and report["verdict"] != "unavailable":
        note_processes_left(host.kept, judge.verdict, report)
    report["duration_s"] = time.perf_counter() - started
    report["phases_s"] = {name: round(seconds, 3) for name, seconds in PHASES.seconds.items()}
    return report


CUTE_DSL_NEEDS_A_GPU = ("CuTe DSL kernels run only on an NVIDIA GPU, and this verification runs on the CPU: "
                        "verify on a GPU worker; without one, kernel-lsp's CuTe DSL compile check still compiles them")


CUDA_EXTENSION_NEEDS_A_GPU = ("this candidate builds CUDA (load_inline's cuda_sources, or .cu sources), which needs a "
                              "GPU and a CUDA build of torch, and this verification runs on the CPU: verify on a GPU "
                              "worker; without one, kernel-lsp check and profile still compile it and read its "
                              "kernels' figures")


def gpu_only_reason(text: str) -> str | None:
    """Why a candidate cannot be verified on the CPU (CuTe DSL kernels, CUDA sources); None if it can."""
    if not text:
        return None
    model = parse_python(text)
    if model.cute_kernels:
        return CUTE_DSL_NEEDS_A_GPU
    # a cpp_extension call with CUDA sources: a CPU build of torch cannot build it, nor a CPU run its kernels
    builds_cuda = any(ext.cuda_sources or any(str(s).endswith((".cu", ".cuh")) for s in ext.source_files)
                      for ext in model.extensions)
    return CUDA_EXTENSION_NEEDS_A_GPU if builds_cuda else None


def judge_candidate(judge: Judge, reference: str, candidate: str, trials: int, timed_calls: int, warmup: int,
                    seed: int, tolerances: dict[str, dict[str, float]], baselines: tuple[str, ...],
                    allowed_kernels: tuple[str, ...], timing: bool, cache_dir: str | None,
                    files: dict[str, str]) -> dict[str, Any]:
    target, verdict = judge.target, judge.verdict
    overrides = {name: Tolerance(**t) for name, t in tolerances.items()}
    judge.overrides, judge.own, judge.allowed = overrides, own_kernel_names(files), allowed_kernels
    try:
        with PHASES("reference set-up"):
            reference_module, ref_model = build_reference(reference, target)
            distributions, judge.hang.reference_s = accepted_distributions(reference_module.get_inputs, ref_model,
                                                                           target, seed)
    except ReferenceFailed as exc:
        return {"verdict": "unavailable", "reason": str(exc)}
    gc.freeze()  # torch, the reference and the judge live until this process ends: collections skip them
    with PHASES("waiting for the candidate's process"):
        isolation = judge.host.ready()
    with PHASES("candidate import and build"):
        state = ref_model.state_dict()
        loaded = judge.host.ask("load", candidate=str(Path(candidate).resolve()), device=str(target),
                                task_dir=os.getcwd(),
                                init=judge.exchange.send(init_inputs(reference_module)), weight_names=list(state),
                                weights=judge.exchange.send(list(state.values())))
        judge.exchange.forget()
    note_candidate_phases(loaded.get("seconds"))
    trials_report = run_trials(judge, reference_module.get_inputs, ref_model, trials, seed, distributions,
                               overrides, judge.own, allowed_kernels)
    trials_report["weights"] = loaded["weights"]
    kernels = trials_report["kernels"]
    if trials_report["passed"] == trials and kernels["custom"]:
        kernels["output_from_kernel"] = check_output_from_kernel(judge, reference_module.get_inputs, seed,
                                                                 kernels["stock"])
    with PHASES("the candidate's process report"):
        note_process_changes(judge.ask("report"), verdict)
    report: dict[str, Any] = {"device": target.type, "correctness": trials_report, "integrity": verdict.integrity,
                              "kernels": trials_report.pop("kernels"), "timing": None,
                              "speedup": {"eager": None, "compile": None}, "interval": {}, "significant": {},
                              "gpu": None, "floor": None,
                              "isolation": isolation, "shared_memory_poison": judge.shared_fill,
                              "free_memory_poison": judge.free_poison}
    correct = trials_report["passed"] == trials_report["trials"] and not verdict.integrity
    if correct and timing:
        measure(report, judge, reference_module, ref_model, timed_calls, warmup, seed, baselines,
                Path(cache_dir) if cache_dir else None, Path(reference).read_text())
    report["verdict"] = "verified" if correct and not verdict.integrity else "rejected"
    return report


CANDIDATE_PHASES = ("candidate: launch hooks installed", "candidate: import", "candidate: model built", "candidate: weights loaded",
                    "candidate: shared-memory fill loaded", "candidate: receiving inputs",
                    "candidate: poisoning free memory", "candidate: poisoning shared memory", "candidate: forward",
                    "candidate: returning memory", "candidate: sending output")


def note_candidate_phases(seconds: Any) -> None:
    """The candidate's process says how its load and its runs were spent: only its known phases, as numbers,
    are added up (its word, shown to say where time went, never used to decide)."""
    if isinstance(seconds, dict):
        for name in CANDIDATE_PHASES:
            value = seconds.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e6:
                PHASES.seconds[name] = PHASES.seconds.get(name, 0.0) + float(value)


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


@PHASES("drawing inputs")
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
                           seed: int) -> tuple[list[str], float]:
    """The problem's own distribution, plus each other one on which the reference runs and stays finite; and the
    slowest of those calls in seconds, its output checked (so a GPU's work has finished), the first one's lazy
    set-up included: what the candidate's hang limits are made of."""
    inputs = draw_inputs(get_inputs, seed, target, "own")
    started = time.perf_counter()
    if not finite(run_reference(model, inputs)):
        raise ReferenceFailed("the reference's output holds NaN or Inf on the problem's own inputs")
    slowest = time.perf_counter() - started
    accepted = ["own"]
    for distribution in DISTRIBUTIONS[1:]:
        inputs = draw_inputs(get_inputs, seed, target, distribution)
        started = time.perf_counter()
        try:
            output = run_reference(model, inputs)
        except ReferenceFailed:
            continue  # e.g. a log of a negative value raising: the problem's domain excludes this distribution
        if finite(output):
            accepted.append(distribution)
        slowest = max(slowest, time.perf_counter() - started)
    return accepted, slowest


def size_in_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensor_leaves(value))


def clone_inputs(inputs: tuple) -> tuple:
    return tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in inputs)


def differs(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape != b.shape or a.dtype != b.dtype or not torch.equal(as_bytes(a), as_bytes(b))


def run_candidate(judge: Judge, inputs: tuple, poison: int, record: bool, own_copy: bool = False,
                  footprint: Footprint = Footprint(), shared_poison: int | None = None) -> CandidateRun:
    """Runs forward once in the candidate's process on a shared copy of `inputs` (with own_copy: on a copy of
    it in the candidate's own memory), over free memory poisoned with `poison` (POISON_FOOTPRINTS times the
    run's `footprint` in bytes, the judge's room kept, but at least the output's size and POISON_MIN_BYTES) and
    shared memory filled with `shared_poison` (without it, `poison`); what the judge then sees of its output and
    of its copy of the inputs."""
    needed = footprint.output + (footprint.inputs if own_copy else 0)  # what lands on the poison before forward ends
    copied = judge.exchange.channel is not None and judge.target.type == "cuda"  # device memory as VMM copies
    with PHASES("sending inputs"):
        sent, shared = judge.exchange.share(clone_inputs(inputs))  # on CUDA the candidate writes into this memory
    with PHASES("candidate runs"):
        reply = judge.ask("forward", runs=1, inputs=sent, poison=poison, record=record, own_copy=own_copy,
                          poison_bytes=max(POISON_MIN_BYTES, POISON_FOOTPRINTS * footprint.total),
                          # across the sandbox the output crosses as copies (sent, then settled): room for them
                          reserve=JUDGE_FOOTPRINTS * footprint.total + (2 * footprint.output if copied else 0),
                          poison_floor=needed + POISON_MIN_BYTES if needed else 0,
                          shared_poison=poison if shared_poison is None else shared_poison)
        returned = judge.exchange.receive(reply["output"])
    note_candidate_phases(reply.get("seconds"))
    note_shared_fill(judge, reply.get("shared_fill"))
    note_free_poison(judge, reply.get("poisoned_bytes"), needed)
    with PHASES("pending-work checks"):
        # a device copy where it fits, else a digest; a copy that crossed the sandbox is one already
        first = [(tensor_metadata(t), as_bytes(t)) for t in tensor_leaves(returned)] if copied \
            else input_snapshot(returned)
        settled = judge.ask("settle", runs=1, join_s=THREAD_JOIN_S)
        output = judge.exchange.receive(settled["output"]) if "output" in settled else returned
        pending = bool(changed_since(first, output))
        del first
        mutated = [index for index, (given, kept) in enumerate(zip(tensor_leaves(shared), tensor_leaves(inputs)))
                   if differs(given, kept)]
    return CandidateRun(output, mutated, pending, list(reply["threads"]), bool(reply["plain"]), shared)


def note_free_poison(judge: Judge, poisoned: Any, needed: int) -> None:
    """Whether the run's output (and, with own_copy, the inputs' copies made before it) could land on poison: the
    candidate's process says how large a block it poisoned (its word, shown, never used to decide). Where it was
    smaller than the `needed` bytes (a device too full to give the judge its room and the output its poison), an
    output the candidate never writes reads what the driver handed out (zeros, not NaN): a plain mismatch then,
    or nothing where zeros happen to be right."""
    if judge.target.type != "cuda" or judge.free_poison not in (None, COVERED):
        return
    if not isinstance(poisoned, int) or isinstance(poisoned, bool):
        judge.free_poison = "the candidate's process did not say how much it poisoned"
    elif poisoned < needed:
        judge.free_poison = (f"the largest block poisoned, {readable_bytes(poisoned)}, is smaller than the "
                             f"{readable_bytes(needed)} the run's output needs: the device had no more room beside "
                             f"the judge's copies")
    else:
        judge.free_poison = COVERED


def note_shared_fill(judge: Judge, said: Any) -> None:
    """What the candidate's process says of its shared-memory fill before a run (verify/shared_fill.py), kept for the
    report: "filled", or the first reason it was not. Its word, shown, never used to decide."""
    if judge.target.type != "cuda" or judge.shared_fill not in (None, FILLED):
        return
    judge.shared_fill = said[:500] if isinstance(said, str) and said else "the candidate's process did not say"


@PHASES("releasing")
def release(judge: Judge, return_memory: bool = False) -> None:
    """The candidate's outputs and the shared inputs of a trial are dropped on both sides. Between trials the
    judge keeps its cached memory (no device allocation per trial for its inputs, reference outputs and copies)
    unless the device is short of free memory; the candidate's process empties its own after each run (its
    poison). With return_memory (before timing) both give everything back to the driver."""
    judge.ask("release", return_memory=return_memory)
    judge.exchange.forget()
    if return_memory or short_of_memory(judge.target):
        flush_allocator(judge.target)
    else:
        gc.collect()


def short_of_memory(target: torch.device) -> bool:
    if target.type != "cuda":
        return False
    free, total = torch.cuda.mem_get_info(target)
    return free < total * KEEP_CACHE_FREE_FRACTION


@PHASES("comparing outputs")
def compare_candidate(expected: Any, actual: Any, plain: bool, overrides: dict[str, Tolerance]) -> Comparison:
    """The reference's output against the candidate's; an output with a torch.Tensor subclass in it (its process
    said so) is refused before any value is compared."""
    if not plain:
        return refused("type", "the candidate returned a torch.Tensor subclass (it can change how it compares); "
                               "return plain tensors")
    return compare_outputs(expected, actual, overrides)


@PHASES("comparing outputs")
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


def run_trials(judge: Judge, get_inputs: Callable[[], list], ref_model: torch.nn.Module, trials: int, seed: int,
               distributions: list[str], overrides: dict[str, Tolerance], own: set[str],
               allowed: tuple[str, ...]) -> dict[str, Any]:
    """Correctness over `trials` fresh input sets, cycling through the distributions; integrity noted in the
    verdict. One recording session in the candidate's process covers the trials; what each run launched is
    judged once it ends."""
    target, verdict = judge.target, judge.verdict
    passed = 0
    worst: Comparison | None = None
    used: list[str] = []
    runs: list[CandidateRun] = []
    stale = stale_checks(trials)
    judge.ask("record", on=True)
    for index in range(trials):
        distribution = distributions[index % len(distributions)]
        used.append(distribution)
        inputs = draw_inputs(get_inputs, seed + index, target, distribution)
        expected = run_reference(ref_model, clone_inputs(inputs))
        footprint = Footprint(size_in_bytes(inputs), size_in_bytes(expected))
        run = run_candidate(judge, inputs, POISON_BYTE, record=True, own_copy=stale.get(index) == "storage",
                            footprint=footprint)
        comparison = compare_candidate(expected, run.output, run.plain, overrides)
        del expected
        if not comparison.ok and run.plain:
            check_earlier_answer(judge, run, index, get_inputs, ref_model, seed, used)
        passed += comparison.ok
        if worst is None or worse(comparison, worst):
            worst = comparison
        if index == 0 or not comparison.ok:
            check_rerun(judge, inputs, run, overrides, comparison, footprint)
        run.output = None
        if index in stale and comparison.ok:
            check_stale(judge, run, draw_inputs(get_inputs, seed + STALE_SEED + index, target, distribution),
                        ref_model, stale[index])
        run.shared = ()  # the inputs' shared copy may take GiBs: only the trial's facts are kept
        release(judge)
        runs.append(run)
    recorded = judge.ask("record", on=False)
    windows = [Window([KernelLaunch(*launch) for launch in window["launches"]], window["current_stream"])
               for window in recorded["windows"]]
    how = recorded["how"] if len(windows) == len(runs) else "none"
    custom: set[str] = set()
    stock: set[str] = set()
    for index, (run, window) in enumerate(zip(runs, windows + [Window()] * (len(runs) - len(windows)))):
        use = classify(window.launches, own, allowed)
        custom.update(use.custom)
        stock.update(use.stock)
        note_run_integrity(run, window, use, index, verdict, how, recorded["reason"])
    return {"trials": trials, "passed": passed, "distributions": used,
            "worst": asdict(worst) if worst is not None else None,
            "kernels": {"custom": sorted(custom), "stock": sorted(stock), "how": how}}


def note_run_integrity(run: CandidateRun, window: Window, use: Any, index: int, verdict: Verdict, how: str,
                       reason: str | None) -> None:
    trial = f"trial {index + 1}"
    if run.mutated:
        verdict.reject("integrity-input-mutated",
                       f"the candidate changed input tensor(s) {run.mutated} in place ({trial})")
    detail = "" if how != "none" else f" (kernel launches cannot be observed here: {reason})"
    note_kernel_use(verdict, use, window, trial, detail)
    if run.pending:
        verdict.reject("integrity-pending-work", "the output was still being written after forward returned "
                                                 f"and the current stream was done ({trial})")
    if run.threads:
        verdict.reject("integrity-thread", f"forward started thread(s) {', '.join(run.threads)} ({trial})")


def note_kernel_use(verdict: Verdict, use: Any, window: Window, where: str, detail: str = "") -> None:
    """What one recorded run launched: none of the candidate's own kernels (integrity-no-custom-kernel), or
    kernels on a stream other than the current one (integrity-other-stream); `where` names the run."""
    problem = use.problem()
    if problem is not None:
        verdict.reject("integrity-no-custom-kernel", f"{problem}{detail} ({where})")
    others = [launch.name for launch in launches_off_stream(window.launches, window.current_stream)]
    if others:
        verdict.reject("integrity-other-stream", f"kernels ran on a stream other than the current one: "
                                                 f"{', '.join(sorted(set(others))[:3])} ({where})")


def check_rerun(judge: Judge, inputs: tuple, first: CandidateRun, overrides: dict[str, Tolerance],
                comparison: Comparison, footprint: Footprint) -> None:
    """Run again on the same inputs over memory poisoned with other bytes: a changed output read garbage.
    The outputs stay held by the candidate's process until the trial's release, so they cannot move. When shared
    memory was filled too, a third run says which memory was read (rejected candidates only pay for it)."""
    second = run_candidate(judge, inputs, SECOND_POISON_BYTE, record=False, footprint=footprint)
    if outputs_agree(first.output, second.output, overrides):
        return
    if judge.target.type == "cuda":
        message = "the output depends on memory the candidate never wrote: two runs on the same inputs differ"
        if judge.shared_fill == FILLED:
            message += " after the free memory and every SM's shared memory were filled with different bytes; "
            message += which_memory(judge, inputs, first, second, overrides, footprint)
        else:
            message += " after the free memory was filled with different bytes"
        if comparison.reason == "nan":
            message += " (the first run read NaN poison)"
        judge.verdict.reject("integrity-uninitialized-output", message)
    else:
        judge.verdict.reject("integrity-nondeterministic", "two runs on the same inputs gave different outputs")


def which_memory(judge: Judge, inputs: tuple, first: CandidateRun, second: CandidateRun,
                 overrides: dict[str, Tolerance], footprint: Footprint) -> str:
    """A third run with the second run's free memory (0x3C) and the first run's shared memory (NaN): an output unlike
    the second's followed shared memory (only it changed between them; NaN shows through `0 *` and fmaxf, where
    another finite fill would not), one unlike the first's followed the free memory. Where the same elements read
    both, the NaN from shared memory hides the free memory's part."""
    try:
        third = run_candidate(judge, inputs, SECOND_POISON_BYTE, record=False, footprint=footprint,
                              shared_poison=POISON_BYTE)
    except CandidateFailed as exc:
        if exc.sandbox_failure.get("status") == "timeout":
            raise  # its process was killed: nothing more can be asked of it (a hang, as in any other run)
        why = (str(exc.sandbox_failure.get("message") or exc).strip().splitlines() or ["no message"])[0][:300]
        return f"a third run, to tell which memory was read, failed ({why})"  # e.g. out of memory, three outputs held
    if judge.shared_fill != FILLED:
        return f"a third run, to tell which memory was read, could not fill shared memory ({judge.shared_fill})"
    shared = not outputs_agree(second.output, third.output, overrides)
    free = not outputs_agree(first.output, third.output, overrides)
    third_run = "a third run, with the second run's free memory and the first run's shared memory,"
    if shared and free:
        return (f"{third_run} differs from both: it read shared memory that no thread of its block wrote and device "
                f"memory it never wrote")
    if shared:
        return (f"{third_run} gives the first run's output: a kernel read shared memory that no thread of its block "
                f"wrote")
    if free:
        return (f"{third_run} gives the second run's output: it read device memory it never wrote (an output or a "
                f"temporary not fully written), not shared memory")
    return f"{third_run} gives the output of both: its output changes from run to run"


def check_earlier_answer(judge: Judge, run: CandidateRun, index: int, get_inputs: Callable[[], list],
                         ref_model: torch.nn.Module, seed: int, distributions: list[str]) -> None:
    """A trial that failed: did it return the answer to an earlier trial's inputs (a cache keyed by an address
    that the new inputs happened to reuse)? Only failed trials pay for this: the earlier references run again."""
    for earlier in range(index):
        expected = run_reference(ref_model, draw_inputs(get_inputs, seed + earlier, judge.target,
                                                        distributions[earlier]))
        if compare_outputs(expected, run.output, judge.overrides).ok:
            judge.verdict.reject("integrity-stale-output", f"trial {index + 1} returned the answer to the inputs of "
                                                           f"trial {earlier + 1} (an answer kept from an earlier "
                                                           f"call, found by where or what its input was)")
            return


def check_output_from_kernel(judge: Judge, get_inputs: Callable[[], list], seed: int, stock: list[str]) -> bool | None:
    """Does the output depend on what the candidate's own kernels wrote? The candidate's process runs forward
    plainly and with every result of its own code destroyed, once with NaN and once with a finite value
    (verify/ablation.py); an output unchanged by either, or own code that ran but wrote nothing, is
    integrity-output-not-from-kernel. None when its own code could not be intercepted (no verdict then)."""
    inputs, others = (draw_inputs(get_inputs, seed + ABLATION_SEED + k, judge.target, "own") for k in (0, 1))
    with PHASES("output-from-kernel check"):
        reply = judge.ask("ablate", runs=5, inputs=judge.exchange.send(inputs), others=judge.exchange.send(others),
                          own=sorted(judge.own))
        release(judge)
    ran = ", ".join(map(str, reply.get("names", [])[:3]))
    if not reply.get("launches"):
        return None
    made_by = ", ".join(str(name) for name in [*stock, *reply.get("stock", [])][:STOCK_OPS_LISTED]) or "none seen"
    if not reply.get("destroyed"):
        judge.verdict.reject("integrity-output-not-from-kernel",
                             f"the candidate's own code ran ({ran}: {reply.get('launches')} launches or calls) but "
                             f"wrote nothing: stock operators made the output ({made_by})")
        return False
    if reply.get("changed"):
        return True
    by = reply.get("changed_by") or {}
    how = ("overwritten with a finite value (it reached the output only where NaN shows through, as `0 * k` or a "
           "clamp bound does)" if by.get("nan") and not by.get("finite") else "overwritten")
    judge.verdict.reject("integrity-output-not-from-kernel",
                         f"the output does not depend on what the candidate's own code wrote: {ran} ran, but with "
                         f"everything it wrote {how}, forward returned the same output; stock operators made it "
                         f"({made_by})")
    return False


def stale_checks(trials: int) -> dict[int, str]:
    """Which trials are followed by a stale-output check, and how: the second in the same tensor objects, the
    third in storage freed and reused, the fourth with a few scattered elements changed in the same objects (the
    first is followed by the rerun over other poison)."""
    return {index: how for index, how in ((1, "objects"), (2, "storage"), (3, "scattered")) if index < trials}


def scattered(inputs: tuple, fresh: tuple, seed: int) -> tuple:
    """`inputs` with SCATTERED_FRACTION of each tensor's elements (at least one, at random places drawn by seed)
    taken from `fresh` (another draw of the problem's inputs, so every value stays one the problem can have): a
    cache keyed by a sample of the values, which most likely misses every changed place, answers for the old
    values."""
    changed = []
    generator = torch.Generator().manual_seed(seed)
    for old, new in zip(inputs, fresh):
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.shape == new.shape and old.numel():
            count = max(1, int(old.numel() * SCATTERED_FRACTION))
            places = torch.randperm(old.numel(), generator=generator)[:count].to(old.device)
            value = old.clone()
            value.view(-1)[places] = new.reshape(-1)[places].to(old.dtype)
            changed.append(value)
        else:
            changed.append(old)
    return tuple(changed)


def check_stale(judge: Judge, run: CandidateRun, values: tuple, ref_model: torch.nn.Module, how: str) -> None:
    """forward again on new values in the old places: written into the very tensor objects of the run just
    checked (all of them, or a few scattered elements: `scattered`), or copied into tensors that took the storage
    of its inputs once freed. An answer computed for the old values (a cache keyed by identity, data pointer,
    version or a sample of the values) is integrity-stale-output."""
    if how == "scattered":
        values = scattered(tuple(run.shared), values, STALE_SEED)
    expected = run_reference(ref_model, clone_inputs(values))
    with PHASES("stale-output checks"):
        if how in ("objects", "scattered"):
            for given, value in zip(tensor_leaves(run.shared), tensor_leaves(values)):
                given.copy_(value)
            if judge.target.type == "cuda":
                torch.cuda.synchronize(judge.target)
            reply = judge.ask("again", runs=1, how="objects")
        else:
            reply = judge.ask("again", runs=1, how="storage", inputs=judge.exchange.send(values))
        output = judge.exchange.receive(reply["output"])
        comparison = compare_candidate(expected, output, bool(reply["plain"]), judge.overrides)
        del output, expected
    if not comparison.ok:
        place = ("the same tensor objects, their values changed in place" if how == "objects" else
                 f"the same tensor objects, {SCATTERED_FRACTION:.1%} of their elements changed in place"
                 if how == "scattered" else
                 "new tensors in the storage of the last inputs, freed" +
                 ("" if reply.get("reused") else " (the allocator gave other addresses this time)"))
        judge.verdict.reject("integrity-stale-output", f"called again on {place}, forward returned a wrong answer "
                                                       f"(an answer kept from the earlier call?): {comparison.message}")


def worse(a: Comparison, b: Comparison) -> bool:
    """A failure is worse than a pass; between equals, the larger absolute error."""
    if a.ok != b.ok:
        return not a.ok
    return a.max_abs_error > b.max_abs_error


def note_processes_left(kept: dict[str, Any] | None, verdict: Verdict, report: dict[str, Any]) -> None:
    """What the candidate's process left running when it ended (its keeper's report): processes that kept
    running, detached or not, are integrity-process-left, and so is a keeper killed before it could say."""
    if kept is None:
        verdict.reject("integrity-process-left", "the keeper of the candidate's process was killed before it could "
                                                 "report: what the candidate started could not be accounted for")
    elif kept.get("leftCount"):
        listed = "; ".join(kept["left"][:PROCESSES_LISTED]) + ("; ..." if kept["leftCount"] > PROCESSES_LISTED else "")
        verdict.reject("integrity-process-left", f"the candidate left {kept['leftCount']} process(es) running after "
                                                 f"its own process ended (now killed): {listed}")
    else:
        return
    report["verdict"] = "rejected"


def note_process_changes(seen: dict[str, list[str]], verdict: Verdict) -> None:
    """What the candidate's process reports it changed in itself since before the candidate's import."""
    if seen["timers"]:
        verdict.reject("integrity-timer-patched",
                       f"the candidate replaced timing functions: {', '.join(seen['timers'])}")
    patched = seen["torch"]
    if patched:
        listed = ", ".join(patched[:TORCH_PATCHES_LISTED]) + (", ..." if len(patched) > TORCH_PATCHES_LISTED else "")
        verdict.reject("integrity-torch-patched", f"the candidate changed torch itself: {listed}")
    if seen["threads"]:
        verdict.reject("integrity-thread", f"the candidate started thread(s) still alive: {', '.join(seen['threads'])}")


@PHASES("timing input sets")
def timing_sets_that_fit(first: tuple, target: torch.device, output_bytes: int) -> int:
    """How many input sets the timing may use: as many as fit (each with room for two outputs: held until its
    batch is over, and a kept copy) in a quarter of the free device memory, or TIMING_CPU_BYTES on the CPU; at
    least one, at most MAX_TIMING_INPUT_SETS. A batch calls each set at most once, so no batch is longer."""
    size = size_in_bytes(first) + 2 * output_bytes
    budget = TIMING_CPU_BYTES
    if target.type == "cuda":
        free, _ = torch.cuda.mem_get_info(target)
        budget = int(free * TIMING_MEMORY_FRACTION)
    return max(1, min(MAX_TIMING_INPUT_SETS, budget // max(size, 1)))


def no_grad_call(model: Callable[..., Any]) -> Callable[..., Any]:
    def call(*inputs: Any) -> Any:
        with torch.no_grad():
            return model(*inputs)
    return call


class Contender:
    """One of the timed: the candidate's process or a baseline, each run the same way by rounds (`measure`)."""

    kind: str
    round_trip_ms: float = 0.0
    warm_calls: int = 0

    def batch(self, indices: list[int]) -> float:
        """Runs one batch; its wall time by the judge's clock, in seconds."""
        raise NotImplementedError

    def after(self, indices: list[int], first: int, keep: tuple[int, ...] = ()) -> float:
        """What follows a batch: the outputs of the calls at offsets `keep` kept, the others let go; the seconds it
        took by the judge's clock, of which the candidate's own share counts (`measure`)."""
        return 0.0


class CandidateBatches(Contender):
    """The candidate's batches: each a request to its process, timed around the whole round trip."""

    kind = "candidate"

    def __init__(self, judge: Judge) -> None:
        self.judge = judge

    def batch(self, indices: list[int]) -> float:
        started = time.perf_counter()
        self.judge.ask("batch", runs=len(indices), sets=indices)
        return time.perf_counter() - started

    def after(self, indices: list[int], first: int, keep: tuple[int, ...] = ()) -> float:
        started = time.perf_counter()
        self.judge.ask("after_batch", runs=len(keep), sets=indices, first=first, keep=list(keep))
        return time.perf_counter() - started


class BaselineBatches(Contender):
    """A baseline's batches, run in the judge's process by the same batch function (verify/timing.py time_batch)
    on the same input sets; its outputs are held until the batch is over, as the candidate's are."""

    def __init__(self, kind: str, model: Callable[..., Any], input_sets: list[tuple], target: torch.device) -> None:
        self.kind, self.model, self.input_sets, self.target = kind, no_grad_call(model), input_sets, target
        self.held: list[Any] = []

    def batch(self, indices: list[int]) -> float:
        started = time.perf_counter()
        self.held = time_batch(self.model, self.input_sets, indices, lambda: settle(self.target))
        return time.perf_counter() - started

    def after(self, indices: list[int], first: int, keep: tuple[int, ...] = ()) -> float:
        self.held = []
        return 0.0


def settle(target: torch.device) -> None:
    if target.type == "cuda":
        torch.cuda.synchronize()


class TimingSets:
    """The timing's input sets as both processes see them (the judge's view of the shared memory, which the
    baselines run on too), refreshed by the judge between rounds: each set used in a round gets new values,
    drawn by the problem's get_inputs with a seed of its own (set, round), written in place. No timed call sees
    contents an earlier call saw, so an answer kept from one (a cache keyed by identity, pointer, version or any
    function of the values) is wrong, and the kept outputs are compared on exactly the values they were made
    from. On CUDA the judge also flushes the L2 cache between batches (its own scratch: the cache is the
    device's)."""

    def __init__(self, judge: Judge, get_inputs: Callable[[], list], seed: int, count: int) -> None:
        self.judge, self.get_inputs, self.seed, self.target = judge, get_inputs, seed, judge.target
        self.views: list[tuple] = []  # the baselines hold this list: sets added later reach them too
        self.scratch = l2_scratch(judge.target) if judge.target.type == "cuda" else None
        self.grow(count)

    @property
    def count(self) -> int:
        return len(self.views)

    def grow(self, count: int) -> None:
        """Sets up to `count` (drawn as round 0's values, shared, and sent to the candidate's process)."""
        if count <= self.count:
            return
        shared = [self.judge.exchange.share(self.values(index, 0)) for index in range(self.count, count)]
        self.judge.ask("timing_sets", input_sets=[described for described, _ in shared])
        self.views.extend(view for _, view in shared)

    def values(self, set_index: int, round_number: int) -> tuple:
        """The values set `set_index` holds in round `round_number` (round 0: as first drawn)."""
        seed = self.seed + TIMING_SEED + (set_index if round_number == 0 else
                                          REFRESH_SEED + set_index + MAX_TIMING_INPUT_SETS * round_number)
        return make_input_sets(self.get_inputs, 1, seed, str(self.target))[0]

    def refresh(self, indices: list[int], round_number: int) -> None:
        for set_index in indices:
            for view, value in zip(tensor_leaves(self.views[set_index]),
                                   tensor_leaves(self.values(set_index, round_number))):
                view.copy_(value)
        settle(self.target)

    def flush(self) -> None:
        if self.scratch is not None:
            self.scratch.zero_()
            settle(self.target)


def warm_up(contender: Contender, sets: int, calls: int, minimum_ms: float) -> float:
    """Untimed batches of `contender` (at least `calls` calls, then more, doubling, until they took minimum_ms
    or MAX_WARMUP_CALLS ran); milliseconds per call of the last batch, by the judge's clock."""
    done, spent_ms, size, per_call_ms = 0, 0.0, max(1, min(calls, sets)), 0.0
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
    judge's own copy of as many outputs of that size takes (`copy_s` each, timed once before the rounds); between
    rounds the judge refreshes the sets used."""

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
                    contender.after(indices, number * self.batch)
                self.samples.setdefault(contender.kind, []).append(max(seconds, 0.0) * 1e3 / self.batch)



def copy_seconds(output: Any, target: torch.device) -> float:
    """What the judge takes to copy one output of the reference's (the fastest of COPY_TRIES): what an honest keep
    of one costs the candidate's process."""
    best = float("inf")
    for _ in range(COPY_TRIES):
        started = time.perf_counter()
        copy = copied(output)  # as the candidate's process keeps one (host.TimedCalls)
        settle(target)
        best = min(best, time.perf_counter() - started)
        del copy
    return best


def measure(report: dict[str, Any], judge: Judge, reference_module: Any, ref_model: torch.nn.Module, calls: int,
            warmup: int, seed: int, baselines: tuple[str, ...], cache_dir: Path | None, reference_text: str) -> None:
    """The candidate and its baselines timed by the judge's clock, in interleaved rounds (`Rounds`); the speedup
    is the ratio of the medians, with a 95% interval. A cached baseline runs CACHE_CHECK_ROUNDS rounds only, and
    is timed afresh when those differ from it by more than its interval. Then the kept timed outputs are
    compared with the reference on the values they were made from, and the physical floor is checked."""
    target, verdict = judge.target, judge.verdict
    release(judge, return_memory=True)
    get_inputs = reference_module.get_inputs
    probe = run_reference(ref_model, clone_inputs(make_input_sets(get_inputs, 1, seed + TIMING_SEED, str(target))[0]))
    output_bytes, copy_s = size_in_bytes(probe), copy_seconds(probe, target)
    del probe  # the judge holds no output of its own while the candidate runs
    with PHASES("timing input sets"):
        fit = timing_sets_that_fit(make_input_sets(get_inputs, 1, seed + TIMING_SEED, str(target))[0], target,
                                   output_bytes)
        sets = TimingSets(judge, get_inputs, seed, min(fit, FIRST_TIMING_SETS))  # more once the batch is known
    with PHASES("GPU state (NVML)"):
        before = gpu_state(target)
    candidate = CandidateBatches(judge)
    with PHASES("timing: set-up"):
        trips = []
        for _ in range(ROUND_TRIPS):
            started = time.perf_counter()
            judge.ask("ping")
            trips.append((time.perf_counter() - started) * 1e3)
        candidate.round_trip_ms = statistics.median(trips)
    contenders: list[Contender] = [candidate]
    timings: dict[str, Any] = {"candidate": None, "eager": None, "compile": None, "compileError": None,
                               "cached": {"eager": False, "compile": False}}
    for kind in baselines:
        try:
            with PHASES(f"timing: the {kind} baseline's set-up"):
                model: Callable[..., Any] = ref_model
                if kind == "compile":
                    model = torch.compile(ref_model)
                    no_grad_call(model)(*sets.views[0])  # compiled here, not in its first batch
                contenders.append(BaselineBatches(kind, model, sets.views, target))
        except Exception as exc:  # torch.compile fails on some models and machines: say why, keep eager
            timings["compileError"] = first_line(exc)
    with PHASES("timing: warm-up"):
        per_call = {c.kind: warm_up(c, sets.count, warmup, WARMUP_MS) for c in contenders}
    # the round trip is the candidate's alone: its batches are sized to make it small (the baselines' are the same)
    batch = batch_size(candidate.round_trip_ms, per_call["candidate"], fit)
    with PHASES("timing input sets"):
        sets.grow(batch)
    rounds = max(min(MIN_ROUNDS, calls), math.ceil(calls / batch))  # fewer only when fewer calls are asked
    cache = BaselineCache(cache_dir) if cache_dir is not None else None
    key = cache.key(reference_text, device_name(target), torch.__version__,
                    {"protocol": JUDGE_CLOCK, "rounds": rounds, "batch": batch, "warmup": warmup, "seed": seed,
                     "sets": sets.count, "shapes": input_signature(sets.views[0])}) if cache else ""
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
        reply = judge.ask("timed_report")
        check_timed_outputs(judge, reply["kept"], sets, ref_model, timed.keeper.kept)
        check_timed_kernels(judge, reply["recorded"][:TIMED_CALLS_RECORDED])
    release(judge)
    device = target.type
    judged = {c.kind: (cached[c.kind] if c.kind in cached
                       else judged_timing(c, samples[c.kind], batch, device, sets.count, seed)) for c in contenders}
    timings["candidate"] = judged["candidate"].to_dict()
    for contender in contenders[1:]:
        kind = contender.kind
        timings[kind] = judged[kind].to_dict()
        timings["cached"][kind] = kind in cached
        if kind in cached:
            timings[kind]["check_ms"] = [round(v, 6) for v in samples[kind]]
        elif cache:
            cache.put(key, kind, timings[kind])
    if cache and cache.schedule:
        timings["schedule"] = dict(cache.schedule)  # kind -> why its fresh timing was not cached
    report["timing"] = timings
    with PHASES("GPU state (NVML)"):
        report["gpu"] = {"before": before, "after": gpu_state(target)}
    intervals, significant = report.setdefault("interval", {}), report.setdefault("significant", {})
    for contender in contenders[1:]:
        kind, base = contender.kind, judged[contender.kind]
        report["speedup"][kind] = speedup(base, judged["candidate"])
        low, high = speedup_interval(list(base.samples_ms), list(judged["candidate"].samples_ms), seed)
        intervals[kind] = [low, high]
        significant[kind] = not low <= 1.0 <= high
    first_values = sets.values(0, 0)
    report["floor"] = physical_floor(ref_model, first_values, target, cache_dir, judged["candidate"], verdict)


def within_interval(fresh_ms: float, cached: Timing) -> bool:
    """A cached baseline still holds: the median of its check rounds lies in its median's 95% interval, widened
    by CACHE_SLACK on each side (a few check rounds are noisier than the many that made the interval)."""
    low, high = cached.median_interval_ms or (cached.median_ms, cached.median_ms)
    return low * (1 - CACHE_SLACK) <= fresh_ms <= high * (1 + CACHE_SLACK)


def check_timed_outputs(judge: Judge, kept: list[dict[str, Any]], sets: TimingSets, ref_model: torch.nn.Module,
                        asked: dict[int, tuple[int, int]]) -> None:
    """The outputs the candidate's process kept of its timed calls (one per input set, the call the judge chose
    after each batch) against the judge's reference output on the values that call got: integrity-timed-output."""
    returned = {item.get("set"): item.get("call") for item in kept}
    wrong = [set_index for set_index, (call, _) in asked.items() if returned.get(set_index) != call]
    if wrong:
        judge.verdict.reject("integrity-timed-output", f"the candidate's process did not return the timed output the "
                                                       f"judge asked for, for {len(wrong)} of the {len(asked)} input "
                                                       f"sets")
    for item in kept:
        set_index, call = item.get("set"), item.get("call")
        if not isinstance(set_index, int) or set_index not in asked or asked[set_index][0] != call:
            continue
        actual = judge.exchange.receive(item["output"])
        expected = run_reference(ref_model, sets.values(set_index, asked[set_index][1]))
        comparison = compare_candidate(expected, actual, bool(item.get("plain")), judge.overrides)
        del expected, actual
        if not comparison.ok:
            judge.verdict.reject("integrity-timed-output",
                                 f"timed call {call} (input set {set_index + 1}) returned a different answer than "
                                 f"the checked calls: {comparison.message}")


def check_timed_kernels(judge: Judge, recorded: list[dict[str, Any]]) -> None:
    """What the recorded calls between the timed batches launched, judged like a trial's run (no custom kernel,
    other streams)."""
    for item in recorded:
        if item.get("how") == "none":
            continue  # nothing could observe launches here: the trials already said so
        window = Window([KernelLaunch(*launch) for launch in item.get("launches", [])], item.get("current_stream"))
        note_kernel_use(judge.verdict, classify(window.launches, judge.own, judge.allowed), window,
                        "a call between the timed batches")


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def device_name(target: torch.device) -> str:
    return torch.cuda.get_device_name(target) if target.type == "cuda" else "cpu"


def input_signature(inputs: tuple) -> list:
    return [[list(v.shape), str(v.dtype)] if isinstance(v, torch.Tensor) else repr(v) for v in inputs]


def physical_floor(ref_model: torch.nn.Module, inputs: tuple, target: torch.device, cache_dir: Path | None,
                   candidate: Timing, verdict: Verdict) -> dict[str, Any]:
    with PHASES("physical floor: the problem's work"):
        work = problem_work(ref_model, inputs)
    with PHASES("physical floor: the device's peaks"):
        peaks = device_peaks(target, cache_dir)
    floor = Floor(work, peaks)
    problem = below_floor(candidate.median_ms, floor, device=target.type)
    if problem is not None:
        verdict.reject("integrity-below-floor", problem)
    return floor.to_dict()
