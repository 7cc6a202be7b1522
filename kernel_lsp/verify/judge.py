"""The judge's context on one verification: its phases, the candidate's process and the exchange, the hang limits,
the integrity problems found so far (`Integrity`), one run of the candidate over poisoned memory (`run_candidate`) and
what the judge keeps and lets go between runs. verify/run.py is the entry; docs/verification.md the protocol."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from kernel_lsp.candidate.exchange import Exchange
from kernel_lsp.candidate.handle import CallLimit, CandidateProcess, Said, decoded_reply
from kernel_lsp.contracts.candidate_replies import ForwardReply, SettleReply
from kernel_lsp.contracts.verify_report import IntegrityProblem
from kernel_lsp.candidate.integrity import (
    as_bytes,
    changed_since,
    flush_allocator,
    input_snapshot,
    tensor_leaves,
    tensor_metadata,
)
from kernel_lsp.candidate.shared_fill import FILLED
from kernel_lsp.verify.compare import Tolerance
from kernel_lsp.verify.floor import readable_bytes
from kernel_lsp.verify.verdict import COVERED

THREAD_JOIN_S = 1.0  # how long a thread the candidate left running gets to finish before outputs are compared
# each trial's run gets this many times its footprint (inputs and the reference's output, in bytes) of poisoned
# memory in the candidate's allocator; the judge keeps room for its own copies
POISON_FOOTPRINTS = 2
POISON_MIN_BYTES = 256 << 20
JUDGE_FOOTPRINTS = 4
KEEP_CACHE_FREE_FRACTION = 0.5  # between trials, the judge keeps its cached memory while this much is free
# a request to the candidate's process hangs after hangTimeoutS plus, per forward it runs, this many times the
# reference's slowest call (the candidate's first call may compile: the floor covers that) or OWN_FACTOR times the
# candidate's own slowest forward so far, whichever is longer (Triton's interpreter on the CPU is that much slower)
HANG_FACTOR = 100
OWN_FACTOR = 10
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
         "report": "the candidate's process (its report on itself)",
         "compile": "torch.compile of the reference (the compile baseline, in the baselines' process)"}


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
class Integrity:
    """The integrity problems one verification found so far (the verdict is made from them and correctness)."""

    device: str
    problems: list[IntegrityProblem] = field(default_factory=list)

    def reject(self, code: str, message: str) -> None:
        if not any(p.code == code for p in self.problems):  # one finding per code, the first occurrence
            self.problems.append(IntegrityProblem(code, message))


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
    """What every step of one verification shares: the candidate's process, the exchange and the integrity problems found so far."""

    process: CandidateProcess
    exchange: Exchange
    target: torch.device
    integrity: Integrity
    hang: HangLimits
    overrides: dict[str, Tolerance] = field(default_factory=dict)  # tolerances by dtype
    own: set[str] = field(default_factory=set)  # the candidate's own kernel names
    shared_fill: str | None = None  # CUDA: "filled" while each run's shared-memory fill ran, else the first reason not
    free_poison: str | None = None  # CUDA: "covered" while each run's output fit its poisoned block, else the first why
    allowed: tuple[str, ...] = ()  # kernels the problem allows besides its own
    ablation_stock: list[str] = field(default_factory=list)  # the ATen operators of the ablation's run (its word)

    def ask(self, op: str, runs: int = 0, extra_s: float = 0.0, **fields: Any) -> Said:
        """A request to the candidate's process that runs forward `runs` times, under its HangLimits."""
        reply = self.process.ask(op, self.hang.limit(op, runs, extra_s), **fields)
        if op == "forward":
            self.hang.forward_s = max(self.hang.forward_s, self.process.wall_s[op])
        return reply


CANDIDATE_PHASES = ("candidate: launch hooks installed", "candidate: import", "candidate: model built", "candidate: weights loaded",
                    "candidate: shared-memory fill loaded", "candidate: receiving inputs",
                    "candidate: poisoning free memory", "candidate: poisoning shared memory", "candidate: forward",
                    "candidate: returning memory", "candidate: sending output")


def note_candidate_phases(seconds: object) -> None:
    """The candidate's process says how its load and its runs were spent: only its known phases, as numbers,
    are added up (its word, shown to say where time went, never used to decide)."""
    if isinstance(seconds, dict):
        for name in CANDIDATE_PHASES:
            value = seconds.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e6:
                PHASES.seconds[name] = PHASES.seconds.get(name, 0.0) + float(value)


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
        reply = decoded_reply(ForwardReply, "forward", judge.ask(
                          "forward", runs=1, inputs=sent, poison=poison, record=record, own_copy=own_copy,
                          poison_bytes=max(POISON_MIN_BYTES, POISON_FOOTPRINTS * footprint.total),
                          # across the sandbox the output crosses as copies (sent, then settled): room for them
                          reserve=JUDGE_FOOTPRINTS * footprint.total + (2 * footprint.output if copied else 0),
                          poison_floor=needed + POISON_MIN_BYTES if needed else 0,
                          shared_poison=poison if shared_poison is None else shared_poison))
        returned = judge.exchange.receive(reply.output)
    note_candidate_phases(reply.seconds)
    note_shared_fill(judge, reply.shared_fill)
    note_free_poison(judge, reply.poisoned_bytes, needed)
    with PHASES("pending-work checks"):
        # a device copy where it fits, else a digest; a copy that crossed the sandbox is one already
        first = [(tensor_metadata(t), as_bytes(t)) for t in tensor_leaves(returned)] if copied \
            else input_snapshot(returned)
        settled = decoded_reply(SettleReply, "settle", judge.ask("settle", runs=1, join_s=THREAD_JOIN_S))
        output = judge.exchange.receive(settled.output) if settled.output is not None else returned
        pending = bool(changed_since(first, output))
        del first
        mutated = [index for index, (given, kept) in enumerate(zip(tensor_leaves(shared), tensor_leaves(inputs)))
                   if differs(given, kept)]
    return CandidateRun(output, mutated, pending, list(reply.threads), reply.plain, shared)


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
    """What the candidate's process says of its shared-memory fill before a run (candidate/shared_fill.py), kept for the
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


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__
