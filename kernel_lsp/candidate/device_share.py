"""Device memory that the judge and the candidate's process both map, across PID namespaces.

Legacy CUDA IPC handles (cudaIpcGetMemHandle, which torch's `_share_cuda_` uses) name the exporting process by
its PID, and the driver refuses them from another PID namespace: a candidate in a sandbox of its own cannot open
the judge's inputs that way, nor the judge its outputs. The driver's virtual memory management can share memory
as a POSIX file descriptor instead (cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
cuMemExportToShareableHandle), and a descriptor crosses any namespace over a unix socket (SCM_RIGHTS): the socket
pair is made before the sandbox starts, so no path or name of the host is involved.

`SharedBlock` is one such allocation, mapped into this process; `as_tensor` gives it to torch as bytes. The driver
is reached with ctypes on libcuda (shared_fill.load_driver), in the context torch made current on this thread.
"""

from __future__ import annotations

import array
import ctypes
import os
import socket
import sys
from typing import Any

from kernel_lsp.candidate.shared_fill import PoisonUnavailable, driver_check, load_driver

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CUDA_ERROR_OUT_OF_MEMORY = 2


class ShareError(RuntimeError):
    """Device memory could not be shared or mapped (the driver's call and error named)."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_driver: Any = None


def driver() -> Any:
    """libcuda with the entry points used here typed (64-bit handles and addresses)."""
    global _driver
    if _driver is None:
        cuda = load_driver()
        u64 = ctypes.c_uint64
        cuda.cuMemUnmap.argtypes = [u64, ctypes.c_size_t]
        cuda.cuMemAddressFree.argtypes = [u64, ctypes.c_size_t]
        cuda.cuMemRelease.argtypes = [u64]
        cuda.cuMemMap.argtypes = [u64, ctypes.c_size_t, ctypes.c_size_t, u64, u64]
        cuda.cuMemSetAccess.argtypes = [u64, ctypes.c_size_t, ctypes.POINTER(_AccessDesc), ctypes.c_size_t]
        cuda.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t, ctypes.c_size_t, u64, u64]
        cuda.cuMemCreate.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t, ctypes.POINTER(_AllocationProp), u64]
        cuda.cuMemExportToShareableHandle.argtypes = [ctypes.c_void_p, u64, ctypes.c_int, u64]
        cuda.cuMemImportFromShareableHandle.argtypes = [ctypes.POINTER(u64), ctypes.c_void_p, ctypes.c_int]
        cuda.cuMemGetAllocationGranularity.argtypes = [ctypes.POINTER(ctypes.c_size_t),
                                                       ctypes.POINTER(_AllocationProp), ctypes.c_int]
        _driver = cuda
    return _driver


def return_cached_memory(device: int) -> bool:
    """This process's PyTorch caching allocator gives its free blocks back to the driver (cuMemCreate takes memory
    from the driver, not from that cache: a judge that just ran a 7.5 GB reference holds its temporaries there);
    False where torch has no CUDA state here to give back."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    from kernel_lsp.candidate.integrity import flush_allocator

    flush_allocator(f"cuda:{device}")
    return True


def free_gb(device: int) -> str:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return "unknown"
    free, total = torch.cuda.mem_get_info(device)
    return f"{free / 1e9:.3g} of {total / 1e9:.3g} GB"


def _check(code: int, what: str) -> None:
    try:
        driver_check(driver(), code, what)
    except PoisonUnavailable as error:
        raise ShareError(str(error)) from None


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, device)
    return prop


def granularity(device: int) -> int:
    size = ctypes.c_size_t()
    _check(driver().cuMemGetAllocationGranularity(ctypes.byref(size), ctypes.byref(_prop(device)),
                                                  CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
    return size.value


class SharedBlock:
    """`nbytes` of device memory on `device`, mapped here read-write; `export()` gives a descriptor another process
    imports (`SharedBlock.imported`). Unmapped and released by `close()` or when collected."""

    def __init__(self, device: int, nbytes: int, handle: int, size: int) -> None:
        self.device, self.nbytes, self.size = device, nbytes, size
        self.handle = handle
        self.address = 0
        cuda = driver()
        address = ctypes.c_uint64()
        try:
            _check(cuda.cuMemAddressReserve(ctypes.byref(address), size, granularity(device), 0, 0),
                   "cuMemAddressReserve")
            self.address = address.value
            _check(cuda.cuMemMap(self.address, size, 0, handle, 0), "cuMemMap")
            access = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, device), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            _check(cuda.cuMemSetAccess(self.address, size, ctypes.byref(access), 1), "cuMemSetAccess")
        except BaseException:
            self.close()
            raise

    @classmethod
    def allocate(cls, device: int, nbytes: int) -> SharedBlock:
        step = granularity(device)
        size = max(step, -(-nbytes // step) * step)
        handle = ctypes.c_uint64()
        code = driver().cuMemCreate(ctypes.byref(handle), size, ctypes.byref(_prop(device)), 0)
        if code == CUDA_ERROR_OUT_OF_MEMORY and return_cached_memory(device):
            code = driver().cuMemCreate(ctypes.byref(handle), size, ctypes.byref(_prop(device)), 0)
        if code == CUDA_ERROR_OUT_OF_MEMORY:
            raise ShareError(f"cuMemCreate failed: CUDA error 2 (out of memory) for {size / 1e9:.3g} GB of shared "
                             f"device memory, {free_gb(device)} free on the device")
        _check(code, "cuMemCreate")
        return cls(device, nbytes, handle.value, size)

    @classmethod
    def imported(cls, fd: int, device: int, nbytes: int, size: int) -> SharedBlock:
        """The block another process exported as `fd` (closed here either way)."""
        handle = ctypes.c_uint64()
        try:
            if size < nbytes or size <= 0 or size % granularity(device):
                raise ShareError(f"a shared block of {size} bytes cannot hold {nbytes}")
            _check(driver().cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd),
                                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   "cuMemImportFromShareableHandle")
        finally:
            os.close(fd)
        return cls(device, nbytes, handle.value, size)

    def export(self) -> int:
        """A new file descriptor for this block (the caller sends and closes it)."""
        fd = ctypes.c_int(-1)
        _check(driver().cuMemExportToShareableHandle(ctypes.byref(fd), self.handle,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
               "cuMemExportToShareableHandle")
        return fd.value

    def close(self) -> None:
        cuda = driver()
        if self.address:
            cuda.cuCtxSynchronize()  # no kernel of this process may still use the mapping
            cuda.cuMemUnmap(self.address, self.size)
            cuda.cuMemAddressFree(self.address, self.size)
            self.address = 0
        if self.handle:
            cuda.cuMemRelease(self.handle)
            self.handle = 0

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the process's mappings go with it
            pass

    def as_tensor(self, torch: Any) -> Any:
        """This block's first `nbytes` as a uint8 tensor on its device; the tensor keeps the block alive."""
        holder = _ArrayInterface(self)
        return torch.as_tensor(holder, device=f"cuda:{self.device}")


class _ArrayInterface:
    def __init__(self, block: SharedBlock) -> None:
        self.block = block
        self.__cuda_array_interface__ = {"shape": (block.nbytes,), "typestr": "|u1", "data": (block.address, False),
                                         "version": 2, "strides": None}


MAX_FDS = 250  # the kernel passes at most 253 descriptors in one message (SCM_MAX_FD)
MAX_SKIPPED = 64  # batches the other side sent and never described, skipped before giving up


def send_fds(channel: socket.socket, batch: str, fds: list[int]) -> None:
    """One value's descriptors in one message named `batch` (the sender still closes its own copies)."""
    if len(fds) > MAX_FDS:
        raise ShareError(f"a value of {len(fds)} device tensors cannot cross at once (at most {MAX_FDS})")
    channel.sendmsg([batch.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def receive_fds(channel: socket.socket, batch: str, timeout_s: float = 60.0) -> list[int]:
    """The descriptors of the batch named `batch`, in order; messages of other batches (sent by a side whose
    value then failed to go) are closed and skipped. ShareError when the batch does not come."""
    channel.settimeout(timeout_s)
    try:
        for _ in range(MAX_SKIPPED):
            try:
                message, ancillary, _flags, _address = channel.recvmsg(
                    64, socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize))
            except OSError as error:
                raise ShareError(f"no device memory descriptors came over the exchange socket ({error})") from None
            if not message:
                raise ShareError("the exchange socket was closed before the device memory descriptors came")
            fds = array.array("i")
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            if message == batch.encode():
                return list(fds)
            for fd in fds:
                _close_quietly(fd)
        raise ShareError(f"batch {batch} did not come among {MAX_SKIPPED} messages on the exchange socket")
    finally:
        channel.settimeout(None)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
