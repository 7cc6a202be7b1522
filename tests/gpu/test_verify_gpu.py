"""Verification primitives on a real GPU: poisoned allocator memory, comparisons across devices."""

from __future__ import annotations

import pytest

from tests.gpu.test_worker_gpu import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch")]


def test_an_unwritten_output_reads_poison_after_poisoning():
    import torch

    from kernel_lsp.verify.compare import compare_outputs
    from kernel_lsp.candidate.integrity import flush_allocator, poison_free_memory

    flush_allocator("cuda")
    leftover = torch.full((1 << 20,), 3.0, device="cuda")  # what a reference would leave behind
    expected = leftover.clone()
    del leftover
    assert poison_free_memory("cuda") >= 1 << 20  # the large block it poisoned, in bytes
    lazy = torch.empty(1 << 20, device="cuda")  # a cheating candidate that writes nothing
    assert torch.isnan(lazy).all().item()
    verdict = compare_outputs(expected, lazy)
    assert (verdict.ok, verdict.reason) == (False, "nan")
    flush_allocator("cuda")


def test_right_values_on_the_wrong_device_and_honest_gpu_outputs():
    import torch

    from kernel_lsp.verify.compare import compare_outputs

    expected = torch.randn(256, 256, device="cuda")
    assert compare_outputs(expected, expected.cpu()).reason == "device"
    honest = (expected.double() * 1.0).float()
    assert compare_outputs(expected, honest).ok
    half = expected.half()
    assert compare_outputs(half, (half.float() + 5e-3).half()).ok
    assert not compare_outputs(half, (half.float() + 5e-2).half()).ok


def test_cuda_event_timing_is_stable_and_orders_work():
    import torch

    from kernel_lsp.candidate.timing import make_input_sets, speedup, time_callable

    sets = make_input_sets(lambda: [torch.randn(4096, 4096)], count=3, seed=0, device="cuda")
    assert all(s[0].is_cuda for s in sets) and not torch.equal(sets[0][0], sets[1][0])
    small = make_input_sets(lambda: [torch.randn(1024, 1024)], count=3, seed=0, device="cuda")
    big = time_callable(lambda a: a @ a, sets, device="cuda", calls=50, warmup=5)
    again = time_callable(lambda a: a @ a, sets, device="cuda", calls=50, warmup=5)
    little = time_callable(lambda a: a @ a, small, device="cuda", calls=50, warmup=5)
    assert (big.clock, big.l2_flushed, big.input_sets) == ("cuda-events", True, 3)
    assert abs(big.median_ms - again.median_ms) / big.median_ms < 0.15  # same work, same figure
    assert speedup(big, little) > 8  # 64x the FLOPs is far more than 8x the time
