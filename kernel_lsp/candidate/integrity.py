"""Primitives for the anti-cheating checks: mutated inputs, poisoned memory, plain outputs, patched timers, threads.

Each one observes and reports; the findings are made by the caller. They run in the sandbox child, next to the
candidate, so they are written against the candidate's own torch and time modules.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import importlib
import inspect
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from itertools import zip_longest
from pathlib import Path
from typing import Any, NamedTuple

import torch

POISON_BYTE = 0xFF  # every float dtype reads 0xFF..FF as NaN, so an output never written cannot pass
SECOND_POISON_BYTE = 0x3C  # finite in every float dtype (fp32 0.0115, fp16 1.06): a rerun that differs read it
POISON_FREE_FRACTION = 0.9
DIGEST_CHUNK_BYTES = 1 << 30
DEVICE_CHUNK_BYTES = 1 << 26  # 64 MiB of bytes -> three 512 MiB int64 temporaries at a time
CHECKSUM_PRIME = 65521
LARGE_CHUNK_BYTES = 64 << 20  # the smallest single block tried for the large pool
SMALL_CHUNK_BYTES = 512 << 10  # the caching allocator serves requests <= 1 MiB from a separate small pool
SMALL_POOL_POISON_BYTES = 64 << 20


def copied(value: Any, device: torch.device | str | None = None) -> Any:
    """Tensors cloned (onto `device` where one is given), in the same tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return value.clone() if device is None else value.to(device, copy=True)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple takes its items one by one
        return type(value)(*(copied(item, device) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(copied(item, device) for item in value)
    if isinstance(value, dict):
        return {key: copied(item, device) for key, item in value.items()}
    return value


def outputs_share_memory(outputs: Sequence[object]) -> bool:
    """Two of these outputs (all alive at once) hold a tensor on the same storage: the model writes one buffer
    again on every call (as CUDA graphs do), so an earlier call's answer is gone once a later call returns."""
    seen: set[int] = set()
    for output in outputs:
        here = {t.untyped_storage().data_ptr() for t in tensor_leaves(output) if t.untyped_storage().nbytes()}
        if here & seen:
            return True
        seen |= here
    return False


def tensor_leaves(obj: object) -> Iterator[torch.Tensor]:
    """Tensors in (nested) tuples, lists and dict values, in order."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from tensor_leaves(value)
    elif isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)):
        for item in obj:
            yield from tensor_leaves(item)


def tensor_digest(tensor: torch.Tensor) -> str:
    """Hash of the bytes and the metadata an in-place op could change (resize_, as_strided_, set_).

    CUDA tensors are summed on the device (copying many GiB to the host would take seconds per trial).
    """
    tensor = tensor.detach()
    meta = repr((tuple(tensor.shape), str(tensor.dtype), tensor.stride(), tensor.storage_offset(),
                 str(tensor.device)))
    raw = tensor.contiguous().reshape(-1).view(torch.uint8)
    if raw.is_cuda:
        return f"{meta}:{device_checksum(raw)}"
    digest = hashlib.blake2b(meta.encode(), digest_size=16)
    for start in range(0, raw.numel(), DIGEST_CHUNK_BYTES):  # chunks: ctypes takes at most 2 GiB at once
        chunk = raw[start:start + DIGEST_CHUNK_BYTES].cpu().contiguous()
        digest.update(ctypes.string_at(chunk.data_ptr(), chunk.numel()))  # no numpy needed; a dense CPU buffer
    return digest.hexdigest()


def device_checksum(raw: torch.Tensor) -> str:
    """Two sums over the bytes, one weighted by position, computed where the bytes are.

    A plain sum misses swapped bytes; weighting each byte by (position mod a prime) + 1 catches moves too.
    Each term is below 2^24, so the int64 sums cannot overflow for tensors below 512 GiB.
    """
    plain = torch.zeros((), dtype=torch.int64, device=raw.device)
    weighted = torch.zeros((), dtype=torch.int64, device=raw.device)
    for start in range(0, raw.numel(), DEVICE_CHUNK_BYTES):
        chunk = raw[start:start + DEVICE_CHUNK_BYTES].to(torch.int64)
        weights = torch.arange(start, start + chunk.numel(), device=raw.device, dtype=torch.int64) % CHECKSUM_PRIME
        plain += chunk.sum()
        weighted += (chunk * (weights + 1)).sum()
    return f"{int(plain)}:{int(weighted)}"


def tensor_metadata(tensor: torch.Tensor) -> tuple:
    return (tuple(tensor.shape), str(tensor.dtype), tensor.stride(), tensor.storage_offset(), str(tensor.device))


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def room_for_copy(tensor: torch.Tensor) -> bool:
    """Whether a device copy fits with room to spare (cached free blocks count: the allocator reuses them)."""
    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    free, _ = torch.cuda.mem_get_info(index)
    cached_free = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    return free + cached_free > 2 * tensor.numel() * tensor.element_size()


def input_snapshot(obj: object) -> list[tuple[tuple, torch.Tensor | str]]:
    """Per tensor leaf, its metadata and its bytes: a device copy on a GPU (comparing is one pass at memory
    bandwidth), a digest on the CPU or where a copy does not fit."""
    snapshot = []
    for tensor in tensor_leaves(obj):
        kept = as_bytes(tensor).clone() if tensor.is_cuda and room_for_copy(tensor) else tensor_digest(tensor)
        snapshot.append((tensor_metadata(tensor), kept))
    return snapshot


def changed_since(snapshot: list[tuple[tuple, torch.Tensor | str]], obj: object) -> list[int]:
    """Indices of tensor leaves that differ from the snapshot in bytes or metadata (an added or lost leaf too)."""
    changed = []
    for index, (record, tensor) in enumerate(zip_longest(snapshot, list(tensor_leaves(obj)))):
        if record is None or tensor is None or record[0] != tensor_metadata(tensor):
            changed.append(index)
            continue
        kept = record[1]
        same = torch.equal(kept, as_bytes(tensor)) if isinstance(kept, torch.Tensor) else kept == tensor_digest(tensor)
        if not same:
            changed.append(index)
    return changed


def fill_chunks(device: torch.device, chunk_bytes: int, budget_bytes: int, chunks: list[torch.Tensor],
                byte: int) -> None:
    """Allocate poisoned chunks until the budget is spent or the allocator refuses."""
    for _ in range(budget_bytes // chunk_bytes):
        try:
            chunks.append(torch.empty(chunk_bytes, dtype=torch.uint8, device=device).fill_(byte))
        except torch.cuda.OutOfMemoryError:
            return


def fill_largest_block(device: torch.device, budget_bytes: int, chunks: list[torch.Tensor], byte: int) -> int:
    """One block as large as the allocator grants (halving from the budget), poisoned.

    Any later large request, up to that size, is split from this one cached segment, so even an output
    of many GiB lands on poison rather than on memory the driver hands back with old contents (filling
    100 GiB takes tens of milliseconds at HBM bandwidth). Returns its size in bytes (0: none was granted).
    """
    size = budget_bytes
    while size >= LARGE_CHUNK_BYTES:
        try:
            chunks.append(torch.empty(size, dtype=torch.uint8, device=device).fill_(byte))
            return size
        except torch.cuda.OutOfMemoryError:
            size //= 2
    return 0


def fill_cached_blocks(device: torch.device, chunks: list[torch.Tensor], byte: int) -> None:
    """Poison every free block the allocator keeps inside segments that are still partly in use (seen on an
    H200: a freed 4 MiB block came back with its old values).

    Asking for each block's exact size, smallest first, makes the best-fit allocator hand out exactly that block.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    sizes = sorted(block["size"] for segment in torch.cuda.memory_snapshot() if segment["device"] == index
                   for block in segment["blocks"] if block["state"] == "inactive")
    for size in sizes:
        try:
            chunks.append(torch.empty(size, dtype=torch.uint8, device=device).fill_(byte))
        except torch.cuda.OutOfMemoryError:
            return


def poison_budget(free_bytes: int, budget: int | None, reserve: int, floor: int) -> int:
    """How many bytes to poison: `budget` (without it, POISON_FREE_FRACTION of the free memory), never taking the
    last `reserve` bytes, except that at least `floor` bytes are poisoned wherever the free memory holds them: the
    run's output must land on poison, or an output the candidate never writes reads memory the driver zeroed, not
    NaN (seen on an 80 GB H100, where the judge's room left 1 GB for a 6.4 GB output)."""
    usable = int(free_bytes * POISON_FREE_FRACTION)
    room = max(usable - reserve, min(floor, usable))  # never below 0: floor and usable are not
    return room if budget is None else min(max(budget, floor), room)


def poison_free_memory(device: torch.device | str, byte: int = POISON_BYTE, budget: int | None = None,
                       reserve: int = 0, floor: int = 0) -> int:
    """Fill the memory the CUDA caching allocator will hand out next with `byte` (NaN by default); returns the size
    of the one large block poisoned (0: none; what any larger request cannot land on).

    Wholly free cached segments go back to the driver; the free blocks of segments still partly in use are
    filled; then a block of `poison_budget` bytes (the judge's `reserve` kept, but never less than `floor` where
    the device has it) is allocated and filled. The chunks go back to the allocator's cache, not to the driver,
    so a candidate's `torch.empty` output that it never writes reads NaN instead of whatever the reference left
    there. (Allocating and freeing ~125 GB took 0.4 s on an H200: a budget sized to the run keeps that cost to its
    footprint.) CPU allocations come straight from the system allocator and cannot be poisoned this way: on CPU
    this does nothing and returns 0.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free_bytes, _ = torch.cuda.mem_get_info(device)
    budget = poison_budget(free_bytes, budget, reserve, floor)
    chunks: list[torch.Tensor] = []
    fill_cached_blocks(device, chunks, byte)  # e.g. a freed output beside a live one in the same segment
    fill_chunks(device, SMALL_CHUNK_BYTES, min(SMALL_POOL_POISON_BYTES, budget), chunks, byte)
    # the cached blocks and small chunks come out of the budget, but never out of the output's floor
    largest = fill_largest_block(device, max(budget - sum(c.numel() for c in chunks), min(floor, budget)), chunks,
                                 byte)
    torch.cuda.synchronize(device)
    del chunks
    return largest


def flush_allocator(device: torch.device | str) -> None:
    """Drop dead tensors and, on CUDA, return cached blocks to the driver so the next run starts clean."""
    gc.collect()
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


TIMER_MODULES: dict[str, object] = {"time": time, "torch.cuda": torch.cuda}

TIMER_NAMES = (
    "time.perf_counter", "time.perf_counter_ns", "time.time", "time.time_ns", "time.monotonic",
    "time.monotonic_ns", "torch.cuda.synchronize", "torch.cuda.Event", "torch.cuda.current_stream",
    "torch.cuda.Event.elapsed_time", "torch.cuda.Event.record", "torch.cuda.Event.synchronize",
    "torch.cuda.Stream.synchronize",
)


def resolve(dotted_name: str) -> object:
    """The object a timing call reaches now, looked up from its module, so a replaced Event class shows too."""
    owner_name, _, attribute = dotted_name.rpartition(".")
    owner = TIMER_MODULES[owner_name] if owner_name in TIMER_MODULES else resolve(owner_name)
    return getattr(owner, attribute, None)


def timer_snapshot() -> dict[str, object]:
    """The identities of the timing and synchronization functions, to compare after the candidate ran."""
    return {name: resolve(name) for name in TIMER_NAMES}


def patched_timers(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """Names of timing functions replaced between two snapshots."""
    return [name for name in before if after.get(name) is not before[name]]


def thread_idents() -> set[int]:
    """Idents of the threads alive now (the argument threads_started compares)."""
    return {thread.ident for thread in threading.enumerate() if thread.ident is not None}


def threads_started(before: set[int], after: set[int]) -> list[str]:
    """Names of threads alive in `after` that were not in `before`: work the candidate may have hidden there."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return [names.get(ident, f"thread {ident} (since exited)") for ident in sorted(after - before)]


TORCH_PACKAGE = Path(torch.__file__).resolve().parent
PATCHABLE_MODULES = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special")
TENSOR_DUNDERS = ("__add__", "__sub__", "__mul__", "__truediv__", "__matmul__", "__getitem__", "__setitem__",
                  "__neg__", "__pow__", "__radd__", "__rmul__", "__iadd__", "__imul__", "__torch_function__")


def _public_callables(owner: object, prefix: str, extra: tuple[str, ...] = ()) -> dict[str, object]:
    """Static look-ups: a classmethod is the same object each time only before it is bound."""
    found: dict[str, object] = {}
    for name in [n for n in dir(owner) if not n.startswith("_")] + list(extra):
        try:
            value = inspect.getattr_static(owner, name)
        except Exception:  # a lazy attribute that cannot load here is no candidate's doing
            continue
        if callable(value) or isinstance(value, (classmethod, staticmethod, property)):
            found[f"{prefix}.{name}"] = value
    return found


def numerics_flags() -> dict[str, object]:
    """The global settings that change what the reference computes (precision, algorithms, default dtype)."""
    cuda_matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return {
        "torch.backends.cuda.matmul.allow_tf32": cuda_matmul.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
            cuda_matmul.allow_fp16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
            cuda_matmul.allow_bf16_reduced_precision_reduction,
        "torch.backends.cudnn.allow_tf32": cudnn.allow_tf32, "torch.backends.cudnn.enabled": cudnn.enabled,
        "torch.backends.cudnn.deterministic": cudnn.deterministic,
        "torch.get_default_dtype()": str(torch.get_default_dtype()),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
        "flush denormal": _flushes_denormals(),
    }


def _flushes_denormals() -> bool:
    """torch.set_flush_denormal has no getter: a denormal that survives a multiply by one is not flushed."""
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    return bool((tiny * 1.0 == 0).item())


def _torch_wraps(now: object, before: object) -> bool:
    """torch's own lazy wrappers (torch._dynamo wraps torch.manual_seed when it is first imported, which the
    profiler does): a wrapper of the same callable whose code lives in torch's own package files."""
    code = getattr(now, "__code__", None)
    return (getattr(now, "__wrapped__", None) is before and code is not None
            and Path(code.co_filename).resolve().is_relative_to(TORCH_PACKAGE))


class TorchState(NamedTuple):
    callables: dict[str, object]  # compared by identity
    flags: dict[str, object]  # compared by value


def torch_snapshot() -> TorchState:
    """The identities of torch's public callables (torch, torch.nn.functional, torch.linalg, torch.fft,
    torch.special, torch.Tensor's methods, torch.nn's modules and their forward) and the numerics flags."""
    importlib.import_module("torch._dynamo")  # wraps some of torch's functions on import: before, not after
    callables: dict[str, object] = {}
    for module_name in PATCHABLE_MODULES:
        callables.update(_public_callables(importlib.import_module(module_name), module_name))
    callables.update(_public_callables(torch.Tensor, "torch.Tensor", TENSOR_DUNDERS))
    for name, value in vars(torch.nn).items():
        if isinstance(value, type) and issubclass(value, torch.nn.Module):
            callables[f"torch.nn.{name}"] = value
            callables[f"torch.nn.{name}.forward"] = value.__dict__.get("forward", value.forward)
    return TorchState(callables, numerics_flags())


def torch_patches(before: TorchState) -> list[str]:
    """What changed since `before`: replaced callables, and flags with their old and new values."""
    after = torch_snapshot()
    replaced = [name for name, value in before.callables.items()
                if after.callables.get(name) is not value and not _torch_wraps(after.callables.get(name), value)]
    flipped = [f"{name} {value!r} -> {after.flags[name]!r}" for name, value in before.flags.items()
               if after.flags[name] != value]
    return replaced + flipped
