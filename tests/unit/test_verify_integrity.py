"""Integrity primitives on the CPU: mutated inputs, plain outputs, patched timers, threads left running."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from kernel_lsp.verify.compare import metadata_problem
from kernel_lsp.candidate.integrity import (
    changed_since,
    input_snapshot,
    patched_timers,
    poison_free_memory,
    thread_idents,
    threads_started,
    timer_snapshot,
)


def inputs() -> tuple[torch.Tensor, list[object], dict[str, torch.Tensor]]:
    return torch.arange(6.0).reshape(2, 3), [3, torch.ones(4, dtype=torch.bfloat16)], {"mask": torch.tensor(True)}


def test_snapshots_cover_every_tensor_leaf_and_are_stable() -> None:
    args = inputs()
    assert len(input_snapshot(args)) == 3
    assert changed_since(input_snapshot(args), inputs()) == []


def test_in_place_modification_is_detected_at_its_leaf() -> None:
    args = inputs()
    before = input_snapshot(args)
    args[1][1].add_(1)
    assert changed_since(before, args) == [1]


def test_rewriting_identical_bytes_is_not_flagged() -> None:
    args = inputs()
    before = input_snapshot(args)
    args[0].copy_(args[0].clone())
    args[2]["mask"].fill_(True)
    assert changed_since(before, args) == []


def test_in_place_metadata_change_is_detected() -> None:
    args = inputs()
    before = input_snapshot(args)
    args[0].t_()  # same bytes, different shape and strides
    assert changed_since(before, args) == [0]


def test_a_leaf_that_appears_or_vanishes_counts_as_changed() -> None:
    first, second = torch.ones(2), torch.zeros(2)
    assert changed_since(input_snapshot((first, second)), (first,)) == [1]
    assert changed_since(input_snapshot((first,)), (first, second)) == [1]


def test_cpu_memory_cannot_be_poisoned() -> None:
    assert poison_free_memory("cpu") == 0


def test_plain_tensor_of_the_expected_kind_has_no_problem() -> None:
    x = torch.zeros(2, 3).t()  # non-contiguous is still a plain tensor
    assert metadata_problem(torch.zeros(3, 2), x) is None


class WrappedTensor(torch.Tensor):
    """Stands in for any subclass that could override __torch_function__."""


@pytest.mark.parametrize(("x", "problem"), [
    (torch.zeros(2).as_subclass(WrappedTensor),
     ("type", f"expected a plain torch.Tensor, got {WrappedTensor.__module__}.WrappedTensor")),
    ([0.0, 0.0], ("type", "expected a plain torch.Tensor, got builtins.list")),
    (torch.zeros(2).to_sparse(), ("type", "expected a dense (strided) tensor, got layout torch.sparse_coo")),
    (torch.nested.nested_tensor([torch.zeros(2)]), ("type", "expected a dense (strided) tensor, got a nested tensor")),
    (torch.zeros(3), ("shape", "shape: expected [2], got [3]")),
    (torch.zeros(2, dtype=torch.float16), ("dtype", "dtype: expected float32, got float16")),
    (torch.zeros(2, device="meta"), ("device", "device: expected cpu, got meta")),
])
def test_output_metadata_problems(x: object, problem: tuple[str, str]) -> None:
    assert metadata_problem(torch.zeros(2), x) == problem


def test_untouched_timers_are_not_reported() -> None:
    assert patched_timers(timer_snapshot(), timer_snapshot()) == []


def test_patched_perf_counter_and_event_record_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    before = timer_snapshot()
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(torch.cuda.Event, "record", lambda self, stream=None: None)
    assert patched_timers(before, timer_snapshot()) == ["time.perf_counter", "torch.cuda.Event.record"]


def test_replaced_event_class_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    before = timer_snapshot()
    monkeypatch.setattr(torch.cuda, "Event", type("Event", (), {}))
    assert patched_timers(before, timer_snapshot()) == [
        "torch.cuda.Event", "torch.cuda.Event.elapsed_time", "torch.cuda.Event.record", "torch.cuda.Event.synchronize"]


def test_thread_left_running_is_reported_by_name() -> None:
    before = thread_idents()
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="candidate-side-work", daemon=True)
    worker.start()
    try:
        assert threads_started(before, thread_idents()) == ["candidate-side-work"]
    finally:
        release.set()
        worker.join()
    assert threads_started(before, thread_idents()) == []


def test_input_snapshot_sees_changed_bytes_metadata_and_leaves():

    args = (torch.arange(12.0).reshape(3, 4), [torch.ones(5)], 7)
    snapshot = input_snapshot(args)
    assert changed_since(snapshot, args) == []
    args[1][0][2] = float("nan")
    assert changed_since(snapshot, args) == [1]
    assert changed_since(snapshot, (args[0].t(), args[1])) == [0, 1]  # a transposed view: other strides
    assert changed_since(snapshot, (args[0],)) == [1]  # a leaf gone


def test_the_scattered_check_changes_a_few_places_drawn_by_its_seed_and_keeps_the_rest() -> None:
    from kernel_lsp.verify.checks import SCATTERED_FRACTION, scattered

    old, fresh = torch.zeros(1000, 100), torch.ones(1000, 100)
    first, = scattered((old,), (fresh,), seed=7)
    again, = scattered((old,), (fresh,), seed=7)
    changed = int(first.sum())
    assert torch.equal(first, again) and old.sum() == 0  # seeded, and the inputs themselves are left alone
    assert 0.9 * SCATTERED_FRACTION * old.numel() <= changed <= SCATTERED_FRACTION * old.numel()
    other, = scattered((old,), (fresh,), seed=8)
    assert not torch.equal(first, other)
    one, = scattered((torch.zeros(3),), (torch.ones(3),), seed=1)
    assert int(one.sum()) == 1  # at least one place, however small the tensor
