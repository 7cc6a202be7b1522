"""Values between the judge and the candidate's process: msgpack descriptors, CPU tensors in shared files."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import torch

from kernel_lsp.candidate.exchange import PACK_ALIGN, Exchange, ExchangeError, Packed


def across(value: object, folder: Path) -> tuple[object, object, Exchange, Exchange]:
    """value sent by one side, through msgpack, received by the other; also the sender's view of it."""
    judge, candidate = Exchange(folder, "judge"), Exchange(folder, "candidate")
    described, view = judge.share(value)
    wire = msgpack.unpackb(msgpack.packb(described, use_bin_type=True), raw=False)
    return candidate.receive(wire), view, judge, candidate


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool,
                                   torch.complex64])
def test_tensors_cross_with_their_values(tmp_path: Path, dtype: torch.dtype):
    value = (torch.randn(3, 5) * 4).to(dtype)
    received, _, _, _ = across(value, tmp_path)
    assert received.dtype == dtype and received.shape == value.shape and torch.equal(received, value)


def test_nested_values_keep_their_structure(tmp_path: Path):
    value = (torch.arange(6).reshape(2, 3).t(), [1, 2.5, None, "x", True], torch.empty(0, 4))
    received, _, _, _ = across(value, tmp_path)
    assert isinstance(received, tuple) and isinstance(received[1], list)
    assert torch.equal(received[0], value[0]) and received[1] == [1, 2.5, None, "x", True]
    assert received[2].shape == (0, 4)


def test_the_senders_view_sees_what_the_receiver_writes(tmp_path: Path):
    value = torch.zeros(4)
    received, view, _, _ = across(value, tmp_path)
    received[1] = 7.0  # the candidate writes into its copy: the judge sees it in the shared memory
    assert view.tolist() == [0.0, 7.0, 0.0, 0.0] and value.tolist() == [0.0] * 4


def test_forget_removes_the_senders_files(tmp_path: Path):
    _, _, judge, _ = across(torch.ones(8), tmp_path)
    assert list(tmp_path.iterdir())
    judge.forget()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("descriptor", [
    {"tensor": {"shape": [2], "dtype": "float32", "numel": 2, "file": "../../etc/passwd"}},
    {"tensor": {"shape": [2], "dtype": "float32", "numel": 3, "file": "x.bin"}},
    {"tensor": {"shape": [2], "dtype": "Tensor", "numel": 2, "file": "x.bin"}},
    {"tensor": {"shape": [4], "dtype": "float32", "numel": 4, "file": "x.bin"}},
    {"object": "os.system"},
    ["not", "a", "descriptor"],
])
def test_bad_descriptors_are_refused(tmp_path: Path, descriptor: object):
    (tmp_path / "x.bin").write_bytes(b"\0" * 8)  # 8 bytes: two float32, not four
    with pytest.raises(ExchangeError):
        Exchange(tmp_path, "judge").receive(descriptor)


def test_values_that_cannot_cross_are_named(tmp_path: Path):
    with pytest.raises(ExchangeError, match="dict"):
        Exchange(tmp_path, "judge").send({"a": torch.ones(1)})


def test_packed_values_cross_as_one_block_of_views(tmp_path: Path):
    sets = [(torch.randn(3, 5), torch.arange(7), 2.5), (torch.ones(2, 2, dtype=torch.bool), torch.empty(0, 3), None),
            (torch.randn(4, 3).t(), [torch.tensor([1, 2], dtype=torch.int16)], "x")]
    received, views, _, _ = across(Packed(sets), tmp_path)
    assert len(list(tmp_path.iterdir())) == 1  # one file for every tensor of every set
    assert isinstance(received, list) and len(received) == 3
    for got, view, value in zip(received, views, sets):
        assert isinstance(got, tuple) and isinstance(view, tuple) and got[2] == value[2]
        assert got[0].dtype == value[0].dtype and torch.equal(got[0], value[0]) and torch.equal(view[0], value[0])
    assert torch.equal(received[0][1], sets[0][1]) and received[1][1].shape == (0, 3)
    assert torch.equal(received[2][1][0], sets[2][1][0]) and isinstance(received[2][1], list)
    received[0][0][1, 2] = 99.0  # the candidate's view and the judge's are the same memory, set by set
    assert views[0][0][1, 2].item() == 99.0 and views[2][0].flatten().ne(99.0).all()
    starts = [t.data_ptr() for got in received for t in (got[0], got[1]) if isinstance(t, torch.Tensor)]
    assert all((start - starts[0]) % PACK_ALIGN == 0 for start in starts) and len(set(starts)) == len(starts)


@pytest.mark.parametrize("slice_", [
    {"offset": 4096, "shape": [4], "numel": 4, "dtype": "float32"},  # past the block's end
    {"offset": -256, "shape": [4], "numel": 4, "dtype": "float32"},
    {"offset": 4, "shape": [2], "numel": 2, "dtype": "float32"},  # off the alignment
    {"offset": 0, "shape": [3], "numel": 4, "dtype": "float32"},
    {"offset": 0, "shape": [2], "numel": 2, "dtype": "Tensor"},
])
def test_packed_slices_outside_their_block_are_refused(tmp_path: Path, slice_: dict):
    described, _ = Exchange(tmp_path, "judge").share(Packed([torch.ones(16)]))
    described["values"] = [{"slice": slice_}]
    with pytest.raises(ExchangeError):
        Exchange(tmp_path, "candidate").receive(described)
