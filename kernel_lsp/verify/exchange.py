"""Tensors between the judge and the candidate's process, as msgpack descriptors: never a pickle.

A value crosses as a tree of plain descriptors: a tensor, a list or tuple of values, or a scalar (None, bool,
int, float, str). Nothing is unpickled, so the other side cannot make this process run code by what it sends.

- CUDA tensors cross by CUDA IPC: the receiver maps the sender's device memory (no copy, so an output of many
  GiB costs nothing extra, and the judge reads what is really there, also later).
- CPU tensors cross as files in a shared folder, mapped with MAP_SHARED by both sides (torch.from_file), so the
  judge sees the bytes the candidate's process is holding when it looks, not a copy made on its say-so.

A tensor crosses as its contiguous bytes with shape and dtype; strides do not cross (a non-contiguous tensor
arrives contiguous with the same values).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import torch

SCALARS = (type(None), bool, int, float, str)


class ExchangeError(ValueError):
    """A value that cannot cross, or a descriptor that does not describe one."""


class Exchange:
    """One side's end: `send` turns a value into a descriptor, `receive` turns a descriptor into a value.

    `folder` holds the CPU tensors' files; both sides use the same folder, each writing files of its own
    name prefix.
    """

    def __init__(self, folder: str | Path, prefix: str) -> None:
        self.folder = Path(folder)
        self.prefix = prefix
        self._names = itertools.count()
        self._written: list[Path] = []
        self._kept: list[torch.Tensor] = []  # CUDA tensors sent: their memory must outlive the other side's use

    def send(self, value: Any) -> Any:
        return self.share(value)[0]

    def share(self, value: Any) -> tuple[Any, Any]:
        """The descriptor of value, and value as the other side will see it: the same memory (a CUDA tensor's
        contiguous copy, a CPU tensor's shared file), so that what the other side does to it shows here."""
        if isinstance(value, torch.Tensor):
            described, view = self._send_tensor(value)
            return {"tensor": described}, view
        if isinstance(value, (list, tuple)):
            pairs = [self.share(item) for item in value]
            views = [view for _, view in pairs]
            return ({"items": [described for described, _ in pairs], "tuple": isinstance(value, tuple)},
                    tuple(views) if isinstance(value, tuple) else views)
        if isinstance(value, SCALARS):
            return {"scalar": value}, value
        raise ExchangeError(f"a {type(value).__name__} cannot be passed between the judge and the candidate: "
                            "only tensors, lists and tuples of them, and plain scalars")

    def receive(self, descriptor: Any) -> Any:
        if not isinstance(descriptor, dict):
            raise ExchangeError(f"not a value descriptor: {type(descriptor).__name__}")
        if "tensor" in descriptor:
            return self._receive_tensor(descriptor["tensor"])
        if "items" in descriptor:
            items = [self.receive(item) for item in descriptor["items"]]
            return tuple(items) if descriptor.get("tuple") else items
        if "scalar" in descriptor and isinstance(descriptor["scalar"], SCALARS):
            return descriptor["scalar"]
        raise ExchangeError(f"not a value descriptor: keys {sorted(descriptor)}")

    def forget(self) -> None:
        """Removes the files this side wrote (the other side's mappings stay valid until dropped)."""
        for path in self._written:
            path.unlink(missing_ok=True)
        self._written.clear()
        self._kept.clear()

    def _send_tensor(self, tensor: torch.Tensor) -> tuple[dict[str, Any], torch.Tensor]:
        tensor = tensor.detach()
        if type(tensor) is not torch.Tensor:
            tensor = tensor.as_subclass(torch.Tensor)
        flat = tensor.contiguous().reshape(-1)
        described: dict[str, Any] = {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
                                     "numel": flat.numel()}
        if flat.numel() == 0:
            return {**described, "empty": str(tensor.device)}, tensor
        if flat.is_cuda:
            try:
                shared = flat.untyped_storage()._share_cuda_()
            except RuntimeError:  # memory this side received from the other (an input returned as the output)
                flat = flat.clone()
                shared = flat.untyped_storage()._share_cuda_()
            self._kept.append(flat)
            device, handle, size, offset, counter, counter_offset, event, sync = shared
            return ({**described, "cuda": [device, handle, size, offset, counter, counter_offset, event, sync],
                     "offset": flat.storage_offset()}, flat.view(tensor.shape))
        path = self.folder / f"{self.prefix}-{os.getpid()}-{next(self._names)}.bin"
        nbytes = flat.numel() * flat.element_size()
        with open(path, "wb") as file:
            file.truncate(nbytes)
        self._written.append(path)
        mapped = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
        mapped.copy_(flat.view(torch.uint8))
        return {**described, "file": path.name}, mapped.view(tensor.dtype).view(tensor.shape)

    def _receive_tensor(self, described: dict[str, Any]) -> torch.Tensor:
        try:
            dtype = getattr(torch, described["dtype"])
            shape = [int(size) for size in described["shape"]]
            numel = int(described["numel"])
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ExchangeError(f"not a tensor descriptor: {error!r}") from None
        if not isinstance(dtype, torch.dtype) or numel != _product(shape):
            raise ExchangeError(f"not a tensor descriptor: dtype {described['dtype']!r}, shape {shape}, numel {numel}")
        if "empty" in described:
            return torch.empty(shape, dtype=dtype, device=str(described["empty"]))
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


def _product(shape: list[int]) -> int:
    total = 1
    for size in shape:
        if size < 0:
            raise ExchangeError(f"negative size in shape {shape}")
        total *= size
    return total
