"""How much free device memory the verifier poisons before each run, on the CPU: the budget puts the run's output
on poison before it keeps the judge's room (on an 80 GB H100 the judge's room left a 1 GB block for ReLU's 6.4 GB
output, which then read the driver's zeros and failed as a plain mismatch); the judge asks for that floor, the
candidate's process says what it poisoned, and a block smaller than the output is a `verify-poison-short` warning.
The poison on a real GPU is tests/gpu/test_verify_gpu.py's and tests/gpu/test_verify_pipeline_gpu.py's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernel_lsp.findings import Severity
from kernel_lsp.candidate import integrity
from kernel_lsp.verify import judge as verify_judge
from kernel_lsp.candidate.exchange import Exchange
from kernel_lsp.candidate.side import CandidateSide
from kernel_lsp.candidate.integrity import POISON_BYTE, POISON_FREE_FRACTION, poison_budget
from kernel_lsp.verify.judge import JUDGE_FOOTPRINTS, POISON_FOOTPRINTS, POISON_MIN_BYTES, Footprint, note_free_poison
from kernel_lsp.verify.verdict import COVERED, report_findings
from tests.problems import recorded_report

GB = 10**9
RELU = Footprint(inputs=6_442_450_944, output=6_442_450_944)  # KernelBench level1/19_ReLU: 4096 x 393216 fp32


def relu_request(free_bytes: int, own_copy: bool = False) -> int:
    """The budget the candidate's process computes for ReLU's run from what the judge asks (run_candidate's sums)."""
    needed = RELU.output + (RELU.inputs if own_copy else 0)
    return poison_budget(free_bytes, max(POISON_MIN_BYTES, POISON_FOOTPRINTS * RELU.total),
                         JUDGE_FOOTPRINTS * RELU.total, needed + POISON_MIN_BYTES)


def test_the_output_gets_its_poison_before_the_judge_keeps_its_room():
    h100 = relu_request(58 * GB)  # the candidate's free memory on an 80 GB H100, the judge's ~26 GB held
    assert RELU.output < h100 == RELU.output + POISON_MIN_BYTES  # the floor, not the 0.7 GB the room left
    assert relu_request(58 * GB, own_copy=True) == RELU.total + POISON_MIN_BYTES  # the inputs' copies land first
    h200 = relu_request(115 * GB)  # on a 141 GB H200 the room holds the whole budget
    assert h200 == POISON_FOOTPRINTS * RELU.total
    assert relu_request(5 * GB) == int(5 * GB * POISON_FREE_FRACTION)  # never more than the device has


@pytest.mark.parametrize("free, budget, reserve, floor, expected", [
    (100, None, 0, 0, 90),  # no budget: the usable fraction of the free memory
    (100, None, 50, 0, 40),
    (100, 30, 50, 0, 30),  # a budget that fits beside the reserve
    (100, 60, 50, 0, 40),  # one that does not: the reserve wins over the budget...
    (100, 60, 50, 45, 45),  # ...but not over the floor
    (100, 10, 0, 20, 20),  # the floor raises a smaller budget
    (100, 60, 95, 0, 0),  # no room and no floor: nothing beyond the cached blocks
], ids=["all", "reserve", "budget", "reserve-wins", "floor-wins", "floor-raises", "none"])
def test_the_budgets_rules(free, budget, reserve, floor, expected):
    assert poison_budget(free * GB, None if budget is None else budget * GB, reserve * GB,
                         floor * GB) == pytest.approx(expected * GB, rel=1e-9)


def test_run_candidate_asks_for_the_outputs_floor_and_notes_what_was_poisoned():
    asked: list[dict] = []

    def ask(op, runs=0, extra_s=0.0, **fields):
        asked.append({"op": op, **fields})
        if op == "forward":
            return {"output": "out", "threads": [], "plain": True, "shared_fill": "filled",
                    "poisoned_bytes": RELU.output + POISON_MIN_BYTES}
        return {}

    exchange = SimpleNamespace(share=lambda inputs: ("sent", inputs), receive=lambda sent: torch.zeros(2), channel=None)
    judge = SimpleNamespace(target=torch.device("cuda"), exchange=exchange, ask=ask, shared_fill=None,
                            free_poison=None)
    verify_judge.run_candidate(judge, (torch.ones(2),), POISON_BYTE, record=False, footprint=RELU)
    [forward] = [a for a in asked if a["op"] == "forward"]
    assert forward["poison_floor"] == RELU.output + POISON_MIN_BYTES
    assert forward["reserve"] == JUDGE_FOOTPRINTS * RELU.total
    assert judge.free_poison == COVERED
    verify_judge.run_candidate(judge, (torch.ones(2),), POISON_BYTE, record=False, own_copy=True, footprint=RELU)
    assert asked[-2]["poison_floor"] == RELU.total + POISON_MIN_BYTES  # the inputs' copies are made on it first
    assert judge.free_poison.startswith("the largest block poisoned, 6.25 GiB, is smaller than the 12 GiB")


def _judge(device: str = "cuda") -> SimpleNamespace:
    return SimpleNamespace(target=torch.device(device), free_poison=None)


def test_the_judge_keeps_the_first_shortfall_and_nothing_off_cuda():
    judge = _judge()
    for poisoned in (8 << 30, 7 << 30, 1 << 30, 9 << 30, 0):
        note_free_poison(judge, poisoned, 6 << 30)
    assert judge.free_poison == ("the largest block poisoned, 1 GiB, is smaller than the 6 GiB the run's output "
                                 "needs: the device had no more room beside the judge's copies")
    for said in (None, True, "a lot"):  # a process that said nothing, or something that is no size
        note_free_poison(silent := _judge(), said, 1)
        assert silent.free_poison == "the candidate's process did not say how much it poisoned", said
    note_free_poison(cpu := _judge("cpu"), 0, 6 << 30)
    assert cpu.free_poison is None
    note_free_poison(empty := _judge(), 0, 0)  # an output of no bytes needs no poison
    assert empty.free_poison == COVERED


def test_a_short_poison_is_a_warning_and_a_covered_one_is_not():
    uri, text = "file:///k.py", "class ModelNew:\n    pass\n"
    short = "the largest block poisoned, 1 GiB, is smaller than the 6 GiB the run's output needs"
    [finding] = report_findings(recorded_report(free_memory_poison=short), uri, text)
    assert (finding.code, finding.severity) == ("verify-poison-short", Severity.WARNING)
    assert short in finding.message and "zeros instead of NaN" in finding.message
    assert report_findings(recorded_report(free_memory_poison=COVERED), uri, text) == []
    assert report_findings(recorded_report(free_memory_poison=None), uri, text) == []  # on the CPU nothing is poisoned


def test_the_candidates_process_passes_the_floor_on_and_says_the_size(tmp_path: Path, monkeypatch):
    calls: list[tuple] = []

    def poison(device, byte, budget=None, reserve=0, floor=0):
        calls.append((byte, budget, reserve, floor))
        return 123 << 20

    monkeypatch.setattr(integrity, "poison_free_memory", poison)
    host = CandidateSide(str(tmp_path))
    host.target, host.model = torch.device("cpu"), torch.nn.Identity()
    sent = Exchange(tmp_path, "judge").send((torch.arange(4.0),))
    reply = host.op_forward({"inputs": sent, "poison": POISON_BYTE, "poison_bytes": 5, "reserve": 7,
                             "poison_floor": 3})
    assert calls == [(POISON_BYTE, 5, 7, 3)] and reply.poisoned_bytes == 123 << 20
    host.op_forward({"inputs": sent, "poison": POISON_BYTE})  # a judge that sends no floor: none
    assert calls[-1] == (POISON_BYTE, None, 0, 0)
