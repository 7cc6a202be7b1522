"""Every SM's shared memory filled with one 32-bit word, by a tiny kernel loaded through the CUDA driver API (ctypes
on libcuda, from PTX: no compiler, and it loads in milliseconds) into torch's context. Shared memory keeps its
contents from one kernel to the next (seen on an H100: after a kernel filled every SM's shared memory with a
pattern, a later kernel's never-written shared array held that pattern in 100% of its words; tests/gpu/RESULTS.md,
2026-12-05), so a kernel that reads shared memory no thread of its block wrote reads the fill. Assumed from that
one probe, not guaranteed by CUDA: that the fill's BLOCKS_PER_SM blocks per SM reach every SM, and that a later
block's shared window lies within what a block of the opt-in maximum wrote, whatever the L1/shared split then.

Two users: the verifier's candidate process (candidate/side.py) fills shared memory with the run's poison byte before
each correctness run, as it fills the free device memory, so the rerun over other bytes catches a kernel whose
output follows stale shared memory (integrity-uninitialized-output); and the sanitize job's shared-init check
(profile/shared_init.py), which fills two patterns in turn and compares the outputs element by element.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

BLOCKS_PER_SM = 4  # the fill's grid: every SM gets a block (one fits per SM at the opt-in maximum)
KERNEL = "kernel_lsp_poison"

# st.volatile: the stores are never read back, so the compiler is told they matter (ptxas 13.0 keeps a plain
# st.shared here too; the volatile one does not rest on that). tests/unit/test_shared_fill.py assembles it.
PTX = r"""
.version 7.0
.target sm_70
.address_size 64

.extern .shared .align 16 .b8 kernel_lsp_poison_smem[];

.visible .entry kernel_lsp_poison(.param .u32 pattern, .param .u32 words)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    ld.param.u32 %r1, [pattern];
    ld.param.u32 %r2, [words];
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, kernel_lsp_poison_smem;
LOOP:
    setp.ge.u32 %p1, %r3, %r2;
    @%p1 bra DONE;
    shl.b32 %r6, %r3, 2;
    add.u32 %r7, %r5, %r6;
    st.volatile.shared.u32 [%r7], %r1;
    add.u32 %r3, %r3, %r4;
    bra LOOP;
DONE:
    ret;
}
"""

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
FILL_THREADS = 1024


class PoisonUnavailable(Exception):
    """The fill kernel cannot run here (no libcuda, the PTX did not load): the check says so, never clean."""


class DriverFill:
    """The fill kernel loaded into the current CUDA context through the driver API (`library`: libcuda, opened
    with ctypes), for `bytes` of dynamic shared memory per block and `blocks` blocks."""

    def __init__(self, library: Any, bytes_per_block: int, blocks: int) -> None:
        cuda = self.cuda = library
        self.bytes, self.blocks = bytes_per_block, blocks
        context = ctypes.c_void_p()
        driver_check(cuda, cuda.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        if not context.value:
            raise PoisonUnavailable("no current CUDA context (PyTorch has not initialised CUDA on this thread)")
        self.module = ctypes.c_void_p()
        driver_check(cuda, cuda.cuModuleLoadData(ctypes.byref(self.module), ctypes.c_char_p(PTX.encode())),
                     "cuModuleLoadData (the fill kernel's PTX)")
        self.function = ctypes.c_void_p()
        driver_check(cuda, cuda.cuModuleGetFunction(ctypes.byref(self.function), self.module, KERNEL.encode()),
                     "cuModuleGetFunction")
        driver_check(cuda, cuda.cuFuncSetAttribute(self.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                   ctypes.c_int(self.bytes)), "cuFuncSetAttribute")

    def launch(self, pattern: int, stream: int | None) -> None:
        """The fill on `stream` (a CUstream handle; 0 or None: the legacy default stream), not waited for."""
        values = (ctypes.c_uint32(pattern), ctypes.c_uint32(self.bytes // 4))
        params = kernel_params(*values)
        driver_check(self.cuda, self.cuda.cuLaunchKernel(
            self.function, ctypes.c_uint(self.blocks), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(FILL_THREADS),
            ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(self.bytes), ctypes.c_void_p(stream), params, None),
            "cuLaunchKernel (the fill)")


def driver_check(cuda: Any, code: int, what: str) -> None:
    """A driver API call's result: nothing when it succeeded, else PoisonUnavailable naming the call and the error."""
    if code:
        text = ctypes.c_char_p()
        cuda.cuGetErrorString(code, ctypes.byref(text))
        raise PoisonUnavailable(f"{what} failed: CUDA error {code} ({(text.value or b'?').decode()})")


CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


def self_test(library: Any = None, device: int = 0) -> str:
    """The fill loaded and run once as the verifier runs it (every SM's opt-in shared memory, BLOCKS_PER_SM blocks
    per SM), through the driver API alone in the device's primary context, without torch: what `kernel-lsp doctor`
    shows. The context current before is current again after, the module unloaded, the primary context released.
    Its detail when it ran; PoisonUnavailable naming the step that failed (or the entry point libcuda lacks)."""
    cuda = library or load_driver()
    try:
        return _self_test(cuda, device)
    except AttributeError as exc:  # ctypes: a symbol this libcuda does not export
        raise PoisonUnavailable(f"the CUDA driver library lacks an entry point the fill needs: {exc}") from exc


def device_fill(cuda: Any, device: Any) -> DriverFill:
    """The fill for every SM of `device` (a CUdevice), loaded into the current context: BLOCKS_PER_SM blocks per SM,
    each of the opt-in maximum of shared memory. The verifier's, shared-init's and doctor's self-test's."""
    sms, optin = ctypes.c_int(), ctypes.c_int()
    driver_check(cuda, cuda.cuDeviceGetAttribute(ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                                 device), "cuDeviceGetAttribute (SM count)")
    driver_check(cuda, cuda.cuDeviceGetAttribute(ctypes.byref(optin),
                                                 CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device),
                 "cuDeviceGetAttribute (opt-in shared memory per block)")
    return DriverFill(cuda, optin.value, sms.value * BLOCKS_PER_SM)


def _self_test(cuda: Any, device: int) -> str:
    driver_check(cuda, cuda.cuInit(0), "cuInit")
    handle = ctypes.c_int()
    driver_check(cuda, cuda.cuDeviceGet(ctypes.byref(handle), ctypes.c_int(device)), "cuDeviceGet")
    before, context = ctypes.c_void_p(), ctypes.c_void_p()
    driver_check(cuda, cuda.cuCtxGetCurrent(ctypes.byref(before)), "cuCtxGetCurrent")
    driver_check(cuda, cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle), "cuDevicePrimaryCtxRetain")
    fill = None
    try:
        driver_check(cuda, cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        fill = device_fill(cuda, handle)
        fill.launch(word(0xFF), None)
        driver_check(cuda, cuda.cuCtxSynchronize(), "cuCtxSynchronize (after the fill)")
    finally:
        if fill is not None:
            cuda.cuModuleUnload(fill.module)
        cuda.cuCtxSetCurrent(before)
        cuda.cuDevicePrimaryCtxRelease_v2(handle)
    return (f"the fill kernel loaded from PTX and ran on device {device}: {fill.blocks} blocks of "
            f"{fill.bytes // 1024} KiB ({fill.blocks // BLOCKS_PER_SM} SMs)")


def kernel_params(*values: Any) -> Any:
    """cuLaunchKernel's kernelParams: an array of pointers, one to each argument's value (the values must outlive
    the launch call)."""
    return (ctypes.c_void_p * len(values))(*(ctypes.addressof(value) for value in values))


def load_driver(names: tuple[str, ...] = ("libcuda.so.1",)) -> Any:
    """libcuda through ctypes: by its soname first (the one torch's runtime already loaded, found without a search,
    which in the confined candidate's process would start ldconfig), then wherever ctypes finds "cuda"."""
    tried: list[str] = []
    errors: list[str] = []

    def candidates():
        yield from names
        yield ctypes.util.find_library("cuda")  # searched only when the sonames did not load

    for name in candidates():
        if name is None or name in tried:
            continue
        tried.append(name)
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise PoisonUnavailable(f"cannot load the CUDA driver library ({', '.join(tried)}): {'; '.join(errors)}")


class Poisoner:
    """The fill of every SM's shared memory, in torch's context on one device."""

    def __init__(self, device_index: int = 0, library: Any = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise PoisonUnavailable("no CUDA device is visible to the candidate's process")
        torch.cuda.set_device(device_index)  # the fill goes to the current context: this device's
        torch.zeros(1, device=f"cuda:{device_index}")  # the runtime makes the primary context current here
        cuda = library or load_driver()
        device = ctypes.c_int()
        driver_check(cuda, cuda.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
        self.fill_kernel = device_fill(cuda, device)
        self.bytes = self.fill_kernel.bytes

    def fill(self, pattern: int) -> None:
        """Every word of every SM's shared memory (as much as one block may have) set to `pattern`; synchronous."""
        import torch

        torch.cuda.synchronize()
        self.fill_kernel.launch(pattern, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()


FILLED = "filled"  # what SharedPoison.fill says when it filled


def word(byte: int) -> int:
    """The 32-bit fill made of one poison byte (0xFF: 0xFFFFFFFF, NaN in every float dtype, as the free memory)."""
    return (byte & 0xFF) * 0x01010101


class SharedPoison:
    """The verifier's shared-memory fill in the candidate's process: made once (`make`: Poisoner), then `fill(byte)`
    before each run. When it cannot run, `problem` says why, from then on, and nothing is filled; the verdict then
    says that shared memory was not poisoned."""

    def __init__(self, device_index: int, make: Any = None) -> None:
        self.filler: Any = None
        self.problem: str | None = None
        try:
            self.filler = (make or Poisoner)(device_index)
        except Exception as exc:  # the verifier's own set-up, before the candidate's import: never the candidate's
            self.problem = str(exc) if isinstance(exc, PoisonUnavailable) else f"{type(exc).__name__}: {exc}"

    def fill(self, byte: int) -> str:
        """Every SM's shared memory set to word(byte): FILLED when done, else why not."""
        if self.problem is None:
            try:
                self.filler.fill(word(byte))
            except PoisonUnavailable as exc:
                self.problem = str(exc)
        return self.problem or FILLED
