"""Who the judge times, and how each is asked (verify/rounds.py runs the protocol): the candidate's process, and
the baselines' process (candidate/handle.py BaselineProcess), where the reference's Model runs eager and compiled.
Each contender's batch is one request to its process, on the judge's clock around the whole round trip."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from kernel_lsp.candidate.exchange import Exchange
from kernel_lsp.candidate.handle import CandidateProcess
from kernel_lsp.verify.judge import Integrity, Judge
from kernel_lsp.verify.reference import load_in

ROUND_TRIPS = 5  # pings to a contender's process; their median is its round trip
COMPILE_LIMIT_S = 600.0  # torch.compile of the reference in the baselines' process, besides its hang limit


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


class ProcessBatches(Contender):
    """A contender's batches, each a request to its process, timed around the whole round trip: the candidate's
    (its ModelNew), or a baseline's in the baselines' process (the reference's Model, eager or compiled), which
    runs them by the same code (candidate/side.py op_batch, op_after_batch) on its own copy of the same input
    sets, holding its outputs until the request after the batch, as the candidate's process does."""

    def __init__(self, party: Judge, kind: str = "candidate") -> None:
        self.party, self.kind = party, kind
        self.model = {} if kind == "candidate" else {"model": kind}

    def batch(self, indices: list[int]) -> float:
        started = time.perf_counter()
        self.party.ask("batch", runs=len(indices), sets=indices, **self.model)
        return time.perf_counter() - started

    def after(self, indices: list[int], first: int, keep: tuple[int, ...] = ()) -> float:
        started = time.perf_counter()
        self.party.ask("after_batch", runs=len(keep), sets=indices, first=first, keep=list(keep))
        return time.perf_counter() - started


def round_trip(party: Judge) -> float:
    """A process's round trip: the median of ROUND_TRIPS pings, in milliseconds by the judge's clock."""
    trips = []
    for _ in range(ROUND_TRIPS):
        started = time.perf_counter()
        party.ask("ping")
        trips.append((time.perf_counter() - started) * 1e3)
    return statistics.median(trips)


def load_baselines(judge: Judge, process: CandidateProcess, reference: str, reference_module: Any,
                   ref_model: torch.nn.Module) -> Judge:
    """The baselines' process, loaded: the reference's Model built there as the candidate's process builds its
    ModelNew (reference.load_in), under the judge's hang limits."""
    party = Judge(process, Exchange(process.exchange_folder, "judge", process.channel), judge.target,
                  Integrity(device=judge.target.type), judge.hang)
    load_in(party, reference, reference_module, ref_model, "Model")
    return party
