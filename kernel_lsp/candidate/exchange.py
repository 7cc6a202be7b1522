"""Tensors between the judge and the candidate's process, as msgpack descriptors: never a pickle.

A value crosses as a tree of plain descriptors: a tensor, a list or tuple of values, or a scalar (None, bool,
int, float, str). Nothing is unpickled, so the other side cannot make this process run code by what it sends.

- CUDA tensors cross by CUDA IPC: the receiver maps the sender's device memory (no copy, so an output of many
  GiB costs nothing extra, and the judge reads what is really there, also later). Across PID namespaces (the
  candidate in its sandbox, process/namespaces.py) legacy IPC handles do not open: with a `channel` (a unix
  socket shared by both sides) a CUDA tensor is copied into memory of the driver's own (candidate/device_share.py)
  whose file descriptor crosses the socket, all of one value's descriptors in one message tagged with a random
  batch name the value's descriptor carries (a batch the other side sent and never described is skipped).
- CPU tensors cross as files in a shared folder, mapped with MAP_SHARED by both sides (torch.from_file), so the
  judge sees the bytes the candidate's process is holding when it looks, not a copy made on its say-so.

A tensor crosses as its contiguous bytes with shape and dtype; strides do not cross (a non-contiguous tensor
arrives contiguous with the same values). Many small values cross as one `Packed` block: their tensors laid out in
one buffer (one file or one device block, one mapping on the other side), each arriving as a view of its slice.
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
from pathlib import Path
from typing import Any

import torch

from kernel_lsp.process.namespaces import prepare_writable
from kernel_lsp.candidate import device_share

SCALARS = (type(None), bool, int, float, str)
PACK_ALIGN = 256  # each tensor of a Packed block starts at a multiple of this many bytes


class Packed:
    """Values whose tensors cross together in one block: a list of values arrives as a list of values, as
    `share` and `receive` would give each, but at the cost of one share (a thousand small input sets take one
    device allocation and one mapping, not one of each per tensor, rounded up to the driver's granularity)."""

    def __init__(self, values: list[Any]) -> None:
        self.values = list(values)


class ExchangeError(ValueError):
    """A value that cannot cross, or a descriptor that does not describe one."""


class Exchange:
    """One side's end: `send` turns a value into a descriptor, `receive` turns a descriptor into a value.

    `folder` holds the CPU tensors' files; both sides use the same folder, each writing files of its own
    name prefix.
    """

    def __init__(self, folder: str | Path, prefix: str, channel: socket.socket | None = None) -> None:
        self.folder = Path(folder)
        self.prefix = prefix
        self.channel = channel  # CUDA tensors as file descriptors of the driver's memory over this socket
        self._names = itertools.count()
        self._written: list[Path] = []
        self._kept: list[torch.Tensor] = []  # CUDA tensors sent: their memory must outlive the other side's use
        self._outgoing: list[int] = []  # the descriptors of the value being shared, sent once it is described
        self._incoming: list[int] = []

    def send(self, value: Any) -> Any:
        """The descriptor alone. Device blocks copied for it are let go here at once: the descriptor that crossed
        (and the other side's mapping) keeps their memory alive, so an output does not cost its size twice."""
        kept = len(self._kept)
        described = self.share(value)[0]
        if self.channel is not None:
            del self._kept[kept:]
        return described

    def share(self, value: Any) -> tuple[Any, Any]:
        """The descriptor of value, and value as the other side will see it: the same memory (a CUDA tensor's
        contiguous copy, a CPU tensor's shared file), so that what the other side does to it shows here."""
        self._outgoing = []
        try:
            described, view = self._share(value)
            if self._outgoing:
                batch = secrets.token_hex(8)
                device_share.send_fds(self.channel, batch, self._outgoing)
                described = {**described, "batch": batch}
        finally:
            for fd in self._outgoing:
                os.close(fd)
            self._outgoing = []
        return described, view

    def _share(self, value: Any) -> tuple[Any, Any]:
        if isinstance(value, Packed):
            return self._share_packed(value.values)
        if isinstance(value, torch.Tensor):
            described, view = self._send_tensor(value)
            return {"tensor": described}, view
        if isinstance(value, (list, tuple)):
            pairs = [self._share(item) for item in value]
            views = [view for _, view in pairs]
            return ({"items": [described for described, _ in pairs], "tuple": isinstance(value, tuple)},
                    tuple(views) if isinstance(value, tuple) else views)
        if isinstance(value, SCALARS):
            return {"scalar": value}, value
        raise ExchangeError(f"a {type(value).__name__} cannot be passed between the judge and the candidate: "
                            "only tensors, lists and tuples of them, and plain scalars")

    def _share_packed(self, values: list[Any]) -> tuple[Any, Any]:
        """One uint8 block holding every tensor of `values` (each at a PACK_ALIGN-aligned offset), shared as one
        tensor; the values' descriptors name their tensors' slices, and the views this side keeps are built from
        them by the same `_receive` the other side uses."""
        layout: list[tuple[int, torch.Tensor]] = []
        end = 0

        def plan(value: Any) -> Any:
            nonlocal end
            if isinstance(value, torch.Tensor):
                _, flat, header = _flattened(value)
                offset = -(-end // PACK_ALIGN) * PACK_ALIGN
                layout.append((offset, flat))
                end = offset + flat.numel() * flat.element_size()
                return {"slice": {**header, "offset": offset}}
            if isinstance(value, (list, tuple)):
                return {"items": [plan(item) for item in value], "tuple": isinstance(value, tuple)}
            if isinstance(value, SCALARS):
                return {"scalar": value}
            raise ExchangeError(f"a {type(value).__name__} cannot be passed between the judge and the candidate: "
                                "only tensors, lists and tuples of them, and plain scalars")

        described = [plan(value) for value in values]
        devices = {flat.device for _, flat in layout}
        if len(devices) > 1:
            raise ExchangeError(f"a packed block holds tensors of one device, not {sorted(map(str, devices))}")
        size = max(end, 1)
        where, block = self._shared_bytes(size, devices.pop() if devices else torch.device("cpu"))
        for offset, flat in layout:  # straight into the shared memory: no block of the same size beside it
            if flat.numel():
                block[offset:offset + flat.numel() * flat.element_size()].copy_(flat.view(torch.uint8))
        _settle(block)
        described_block = {"shape": [size], "dtype": "uint8", "numel": size, **where}
        return ({"pack": {"tensor": described_block}, "values": described},
                [self._receive(value, block) for value in described])

    def receive(self, descriptor: Any) -> Any:
        batch = descriptor.get("batch") if isinstance(descriptor, dict) else None
        if batch is None:
            return self._receive(descriptor)
        if self.channel is None:
            raise ExchangeError("device memory descriptors came, but this side has no exchange socket")
        try:
            self._incoming = device_share.receive_fds(self.channel, str(batch))
        except device_share.ShareError as error:
            raise ExchangeError(str(error)) from None
        try:
            value = self._receive(descriptor)
            if self._incoming:
                raise ExchangeError(f"{len(self._incoming)} device memory descriptor(s) more than the value holds")
            return value
        finally:
            for fd in self._incoming:
                os.close(fd)
            self._incoming = []

    def _receive(self, descriptor: Any, block: torch.Tensor | None = None) -> Any:
        """The value `descriptor` describes; inside a pack (`block` given) its tensors are views of the block's
        slices, each checked to lie inside it, and nothing else of memory (a tensor of its own, a pack) is taken."""
        if not isinstance(descriptor, dict):
            raise ExchangeError(f"not a value descriptor: {type(descriptor).__name__}")
        if "tensor" in descriptor and block is None:
            return self._receive_tensor(descriptor["tensor"])
        if "slice" in descriptor and block is not None:
            return _slice_of(block, descriptor["slice"])
        if "items" in descriptor:
            items = [self._receive(item, block) for item in descriptor["items"]]
            return tuple(items) if descriptor.get("tuple") else items
        if "scalar" in descriptor and isinstance(descriptor["scalar"], SCALARS):
            return descriptor["scalar"]
        if "pack" in descriptor and block is None and isinstance(descriptor.get("values"), list):
            packed = self._receive(descriptor["pack"])
            if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 1:
                raise ExchangeError("a packed block is not a one-dimensional uint8 tensor")
            return [self._receive(value, packed) for value in descriptor["values"]]
        raise ExchangeError(f"not a value descriptor: keys {sorted(descriptor)}")

    def forget(self) -> None:
        """Removes the files this side wrote (the other side's mappings stay valid until dropped)."""
        for path in self._written:
            path.unlink(missing_ok=True)
        self._written.clear()
        self._kept.clear()

    def _send_tensor(self, tensor: torch.Tensor) -> tuple[dict[str, Any], torch.Tensor]:
        tensor, flat, described = _flattened(tensor)
        if flat.numel() == 0:
            return {**described, "empty": str(tensor.device)}, tensor
        if flat.is_cuda and self.channel is None:  # legacy IPC shares the tensor's own memory: no copy
            try:
                shared = flat.untyped_storage()._share_cuda_()
            except RuntimeError:  # memory this side received from the other (an input returned as the output)
                flat = flat.clone()
                shared = flat.untyped_storage()._share_cuda_()
            self._kept.append(flat)
            device, handle, size, offset, counter, counter_offset, event, sync = shared
            return ({**described, "cuda": [device, handle, size, offset, counter, counter_offset, event, sync],
                     "offset": flat.storage_offset()}, flat.view(tensor.shape))
        where, raw = self._shared_bytes(flat.numel() * flat.element_size(), flat.device)
        raw.copy_(flat.view(torch.uint8))
        _settle(raw)
        return {**described, **where}, raw.view(tensor.dtype).view(tensor.shape)

    def _shared_bytes(self, nbytes: int, device: torch.device) -> tuple[dict[str, Any], torch.Tensor]:
        """`nbytes` of memory the other side will map, as a uint8 tensor here, and where it lies (the descriptor's
        fields): on CUDA a block of the driver's memory whose file descriptor is queued for the value's batch (or,
        with no channel, memory of torch's shared by legacy IPC), else a file in the shared folder."""
        if device.type == "cuda" and self.channel is not None:
            index = device.index if device.index is not None else torch.cuda.current_device()
            try:
                block = device_share.SharedBlock.allocate(index, nbytes)
                raw = block.as_tensor(torch)
                self._outgoing.append(block.export())
            except device_share.ShareError as error:
                raise ExchangeError(str(error)) from None
            self._kept.append(raw)
            return {"vmm": [index, block.size]}, raw
        if device.type == "cuda":
            raw = torch.empty(nbytes, dtype=torch.uint8, device=device)
            index, handle, size, offset, counter, counter_offset, event, sync = raw.untyped_storage()._share_cuda_()
            self._kept.append(raw)
            return {"cuda": [index, handle, size, offset, counter, counter_offset, event, sync], "offset": 0}, raw
        path = self.folder / f"{self.prefix}-{os.getpid()}-{next(self._names)}.bin"
        with open(path, "wb") as file:
            file.truncate(nbytes)
        prepare_writable([str(path)])  # the candidate's side maps it read-write (as the sandbox's user)
        self._written.append(path)
        return {"file": path.name}, torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)

    def _receive_tensor(self, described: dict[str, Any]) -> torch.Tensor:
        dtype, shape, numel = _header(described)
        if "empty" in described:
            return torch.empty(shape, dtype=dtype, device=str(described["empty"]))
        if "vmm" in described:
            return self._receive_device_block(described, dtype, shape, numel)
        if "cuda" in described:
            device, handle, size, offset, counter, counter_offset, event, sync = described["cuda"]
            torch.cuda.init()  # opening an IPC handle before CUDA is initialised crashes the process
            storage = torch.UntypedStorage._new_shared_cuda(device, handle, size, offset, counter, counter_offset,
                                                            event, sync)
            flat = torch.empty(0, dtype=dtype, device=f"cuda:{device}")
            flat.set_(storage, int(described["offset"]), (numel,), (1,))
            return flat.view(shape)
        name = str(described.get("file", ""))
        path = self.folder / name
        if not name or "/" in name or not path.is_file():
            raise ExchangeError(f"no shared tensor file {name!r}")
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        if path.stat().st_size != nbytes:
            raise ExchangeError(f"shared tensor file {name} holds {path.stat().st_size} bytes, not {nbytes}")
        return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8).view(dtype).view(shape)


    def _receive_device_block(self, described: dict[str, Any], dtype: torch.dtype, shape: list[int],
                              numel: int) -> torch.Tensor:
        if not self._incoming:
            raise ExchangeError("a device tensor came without its memory descriptor")
        try:
            device, size = (int(value) for value in described["vmm"])
        except (TypeError, ValueError) as error:
            raise ExchangeError(f"not a device block descriptor: {error!r}") from None
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        torch.cuda.init()
        try:
            block = device_share.SharedBlock.imported(self._incoming.pop(0), device, nbytes, size)
        except device_share.ShareError as error:
            raise ExchangeError(str(error)) from None
        return block.as_tensor(torch).view(dtype).view(shape)


def _flattened(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """A tensor as it crosses: a plain tensor, its contiguous bytes in one dimension, and its header (shape,
    dtype, numel)."""
    tensor = tensor.detach()
    if type(tensor) is not torch.Tensor:
        tensor = tensor.as_subclass(torch.Tensor)
    flat = tensor.contiguous().reshape(-1)
    return tensor, flat, {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
                          "numel": flat.numel()}


def _header(described: Any) -> tuple[torch.dtype, list[int], int]:
    """A received tensor header's dtype, shape and numel, checked to agree with each other."""
    try:
        dtype = getattr(torch, described["dtype"])
        shape = [int(size) for size in described["shape"]]
        numel = int(described["numel"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ExchangeError(f"not a tensor descriptor: {error!r}") from None
    if not isinstance(dtype, torch.dtype) or numel != _product(shape):
        raise ExchangeError(f"not a tensor descriptor: dtype {described['dtype']!r}, shape {shape}, numel {numel}")
    return dtype, shape, numel


def _slice_of(block: torch.Tensor, described: Any) -> torch.Tensor:
    """A packed tensor: a view of its slice of `block`, checked to lie inside it and on PACK_ALIGN."""
    dtype, shape, numel = _header(described)
    try:
        offset = int(described["offset"])
    except (KeyError, TypeError, ValueError) as error:
        raise ExchangeError(f"not a packed tensor descriptor: {error!r}") from None
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if offset < 0 or offset % PACK_ALIGN or offset + nbytes > block.numel():
        raise ExchangeError(f"a packed tensor at byte {offset} ({nbytes} bytes) lies outside its block of "
                            f"{block.numel()} bytes or off its alignment")
    return block[offset:offset + nbytes].view(dtype).view(shape)


def _settle(written: torch.Tensor) -> None:
    """The copies into shared device memory have ended before its descriptor crosses (the other side reads it at
    once, on streams of its own)."""
    if written.is_cuda:
        torch.cuda.current_stream(written.device).synchronize()


def _product(shape: list[int]) -> int:
    total = 1
    for size in shape:
        if size < 0:
            raise ExchangeError(f"negative size in shape {shape}")
        total *= size
    return total
