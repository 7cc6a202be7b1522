"""The shared-memory fill (verify/shared_fill.py) on the CPU: its PTX assembled by the real ptxas (the stores
kept), its driver-API calls made against a libcuda stand-in built here, the verifier's use of it (the candidate's
process fills shared memory with the run's poison byte last before forward and says whether it could; the judge
names shared memory in integrity-uninitialized-output only when it was filled, and warns when it was not). The
fill on a real GPU is tests/gpu/test_verify_pipeline_gpu.py's and tests/gpu/test_sanitize_gpu.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kernel_lsp.findings import Severity
from kernel_lsp.profile.program import nvcc_path
from kernel_lsp.verify import run as verify_run
from kernel_lsp.verify import shared_fill
from kernel_lsp.verify.candidate_process import CandidateFailed
from kernel_lsp.verify.exchange import Exchange
from kernel_lsp.verify.host import Host
from kernel_lsp.verify.integrity import POISON_BYTE, SECOND_POISON_BYTE
from kernel_lsp.verify.run import CandidateRun, Verdict, check_rerun, note_shared_fill
from kernel_lsp.verify.verdict import report_findings
from profilers.sass import parse_sass, sass_for_cubin


def test_the_fill_kernels_ptx_assembles_and_keeps_its_shared_stores(tmp_path: Path):
    ptxas = Path(nvcc_path()).with_name("ptxas")
    if not ptxas.exists():
        pytest.skip(f"needs ptxas (the CUDA toolkit's), not found beside {nvcc_path()}")
    (tmp_path / "fill.ptx").write_text(shared_fill.PTX)
    for arch in ("sm_80", "sm_90"):
        cubin = tmp_path / f"fill_{arch}.cubin"
        done = subprocess.run([str(ptxas), f"-arch={arch}", str(tmp_path / "fill.ptx"), "-o", str(cubin)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        [function] = parse_sass(sass_for_cubin(cubin))
        assert function.mangled == shared_fill.KERNEL
        opcodes = [i.opcode for i in function.instructions]
        assert "STS" in opcodes, opcodes  # the volatile store is not dropped as dead



# a stand-in for libcuda with the six entry points the fill uses: it records what it was given, so the ctypes
# calls (argument order, the kernel's parameter array, NULL extra) are checked without a GPU. A real GPU runs the
# real library in tests/gpu/test_sanitize_gpu.py.
DRIVER_STUB = r"""
#include <stdint.h>
#include <string.h>
static unsigned long long seen[12];
static int fail_at = 0;  /* 1-5: that entry point returns 999 once */
static int no_context = 0;
unsigned long long* stub_seen(void) { return seen; }
void stub_fail(int which) { fail_at = which; }
void stub_no_context(int on) { no_context = on; }
static int failing(int which) { if (fail_at == which) { fail_at = 0; return 1; } return 0; }
int cuCtxGetCurrent(void** ctx) { *ctx = no_context ? 0 : (void*)0x1234; return failing(1) ? 999 : 0; }
int cuModuleLoadData(void** module, const void* image) {
    if (failing(2) || !strstr((const char*)image, ".entry kernel_lsp_poison")) return 999;
    *module = (void*)0x10; return 0;
}
int cuModuleGetFunction(void** function, void* module, const char* name) {
    if (failing(3) || module != (void*)0x10 || strcmp(name, "kernel_lsp_poison")) return 999;
    *function = (void*)0x20; return 0;
}
int cuFuncSetAttribute(void* function, int attribute, int value) {
    seen[0] = attribute; seen[1] = value; seen[2] = function == (void*)0x20; return failing(4) ? 999 : 0;
}
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void* stream, void** params, void** extra) {
    seen[3] = gx; seen[4] = gy * gz; seen[5] = bx; seen[6] = by * bz; seen[7] = shared;
    seen[8] = (uintptr_t)stream; seen[9] = *(unsigned*)params[0]; seen[10] = *(unsigned*)params[1];
    seen[11] = extra == 0 && f == (void*)0x20;
    return failing(5) ? 999 : 0;
}
int cuGetErrorString(int code, const char** text) { *text = code == 999 ? "stub failure" : "?"; return 0; }
/* the primary-context calls of self_test: the context it retains, makes current and releases, in order */
static unsigned long long context_seen[5];  /* device asked, context made current, syncs, releases, retained */
unsigned long long* stub_context_seen(void) { return context_seen; }
int cuInit(unsigned flags) { return failing(6) || flags ? 999 : 0; }
int cuDeviceGet(int* device, int ordinal) { context_seen[0] = ordinal; *device = 40 + ordinal; return failing(7) ? 999 : 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int device) {
    if (failing(8) || device < 40) return 999; *ctx = (void*)0x1234; context_seen[4] += 1; return 0;
}
int cuCtxSetCurrent(void* ctx) { context_seen[1] = (uintptr_t)ctx; return failing(9) ? 999 : 0; }
int cuCtxSynchronize(void) { context_seen[2] += 1; return failing(10) ? 999 : 0; }
int cuDevicePrimaryCtxRelease_v2(int device) { context_seen[3] += device >= 40; context_seen[4] -= 1; return 0; }
"""


@pytest.fixture(scope="module")
def driver_stub(tmp_path_factory):
    import ctypes
    import shutil

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler (cc or gcc) to build the libcuda stand-in")
    folder = tmp_path_factory.mktemp("driver_stub")
    (folder / "stub.c").write_text(DRIVER_STUB)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / "libcuda_stub.so"), str(folder / "stub.c")],
                   check=True)
    library = ctypes.CDLL(str(folder / "libcuda_stub.so"))
    library.stub_seen.restype = ctypes.POINTER(ctypes.c_ulonglong)
    library.stub_context_seen.restype = ctypes.POINTER(ctypes.c_ulonglong)
    return library


def test_the_fill_calls_the_driver_api_with_the_kernels_launch(driver_stub):
    fill = shared_fill.DriverFill(driver_stub, 232448, 132 * shared_fill.BLOCKS_PER_SM)
    fill.launch(0x5A5A5A5A, 0xABC0)
    seen = driver_stub.stub_seen()[:12]
    assert seen[:3] == [shared_fill.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 232448, 1]
    assert seen[3:8] == [528, 1, 1024, 1, 232448]  # grid, grid's y*z, block, block's y*z, dynamic shared bytes
    assert seen[8:] == [0xABC0, 0x5A5A5A5A, 232448 // 4, 1]  # stream, the two parameters, NULL extra
    fill.launch(0x3F803F80, 0)
    assert driver_stub.stub_seen()[8:11] == [0, 0x3F803F80, 232448 // 4]


@pytest.mark.parametrize("which, what", [(1, "cuCtxGetCurrent"), (2, "cuModuleLoadData"),
                                         (3, "cuModuleGetFunction"), (4, "cuFuncSetAttribute")])
def test_a_driver_error_is_said_never_raised_past_the_check(driver_stub, which, what):
    driver_stub.stub_fail(which)
    with pytest.raises(shared_fill.PoisonUnavailable, match=f"{what}.*CUDA error 999 \\(stub failure\\)"):
        shared_fill.DriverFill(driver_stub, 1024, 4)
    driver_stub.stub_no_context(1)
    try:
        with pytest.raises(shared_fill.PoisonUnavailable, match="no current CUDA context"):
            shared_fill.DriverFill(driver_stub, 1024, 4)
    finally:
        driver_stub.stub_no_context(0)
    fill = shared_fill.DriverFill(driver_stub, 1024, 4)
    driver_stub.stub_fail(5)
    with pytest.raises(shared_fill.PoisonUnavailable, match="cuLaunchKernel"):
        fill.launch(1, None)


def test_kernel_params_point_at_each_value():
    import ctypes

    values = (ctypes.c_uint32(7), ctypes.c_uint32(0xFFFFFFFF))
    params = shared_fill.kernel_params(*values)
    assert [ctypes.c_uint32.from_address(p).value for p in params] == [7, 0xFFFFFFFF]


def test_the_fill_word_is_the_poison_byte_four_times_nan_first_then_finite():
    assert shared_fill.word(POISON_BYTE) == 0xFFFFFFFF and shared_fill.word(SECOND_POISON_BYTE) == 0x3C3C3C3C
    first, second = (torch.tensor([shared_fill.word(b)], dtype=torch.int64).to(torch.int32).view(torch.uint8)
                     for b in (POISON_BYTE, SECOND_POISON_BYTE))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):  # as a kernel reading it as floats sees it
        assert first.view(dtype).isnan().all() and second.view(dtype).isfinite().all(), dtype


class _Filler:
    """Stands in for Poisoner: records each word; fails the way the driver does when told to."""

    def __init__(self, device_index: int, log: list, fail_at: int | None = None) -> None:
        self.log, self.fail_at = log, fail_at
        log.append(("made", device_index))

    def fill(self, pattern: int) -> None:
        if len(self.log) == self.fail_at:
            raise shared_fill.PoisonUnavailable("cuLaunchKernel (the fill) failed: CUDA error 999 (stub)")
        self.log.append(("fill", pattern))


def test_shared_poison_fills_each_byte_and_says_why_not_once_it_cannot():
    log: list = []
    poison = shared_fill.SharedPoison(3, make=lambda index: _Filler(index, log, fail_at=2))
    assert poison.fill(0xFF) == shared_fill.FILLED and log == [("made", 3), ("fill", 0xFFFFFFFF)]
    said = poison.fill(0x3C)
    assert said.startswith("cuLaunchKernel") and said != shared_fill.FILLED
    assert poison.fill(0xFF) == said and len(log) == 2  # no further fill is tried, and none is said done

    def unloadable(index: int):
        raise shared_fill.PoisonUnavailable("cannot load the CUDA driver library (libcuda.so.1): not found")

    assert shared_fill.SharedPoison(0, make=unloadable).fill(0xFF).startswith("cannot load the CUDA driver")


class _Doubler(torch.nn.Module):
    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def forward(self, x):
        self.log.append(("forward",))
        return x * 2


def test_the_candidates_process_fills_shared_memory_last_before_forward_and_says_so(tmp_path: Path):
    log: list = []
    host = Host(str(tmp_path))  # its model set by hand: op_load would import a file and gc.freeze this process
    host.target, host.model = torch.device("cpu"), _Doubler(log)
    judge_end = Exchange(tmp_path, "judge")
    sent = judge_end.send((torch.arange(4.0),))
    assert host.op_forward({"inputs": sent, "poison": POISON_BYTE})["shared_fill"] is None  # none made: no fill
    host.shared_poison = shared_fill.SharedPoison(0, make=lambda index: _Filler(index, log))
    reply = host.op_forward({"inputs": sent, "poison": SECOND_POISON_BYTE})
    assert log == [("forward",), ("made", 0), ("fill", 0x3C3C3C3C), ("forward",)]
    assert reply["shared_fill"] == shared_fill.FILLED and "candidate: poisoning shared memory" in reply["seconds"]
    assert judge_end.receive(reply["output"]).tolist() == [0.0, 2.0, 4.0, 6.0]
    host.op_forward({"inputs": sent, "poison": SECOND_POISON_BYTE, "shared_poison": POISON_BYTE})  # a third run's
    assert log[-2:] == [("fill", 0xFFFFFFFF), ("forward",)]


def _judge(device: str, shared_fill_said: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(target=torch.device(device), shared_fill=shared_fill_said, verdict=Verdict(device))


def test_the_judge_keeps_the_first_reason_the_fill_did_not_run_and_nothing_off_cuda():
    judge = _judge("cuda")
    for said in (shared_fill.FILLED, shared_fill.FILLED, "no libcuda", shared_fill.FILLED, "later"):
        note_shared_fill(judge, said)
    assert judge.shared_fill == "no libcuda"
    silent = _judge("cuda")
    note_shared_fill(silent, None)  # a process that sent nothing is not taken as filled
    assert silent.shared_fill == "the candidate's process did not say"
    note_shared_fill(long := _judge("cuda"), "x" * 10_000)
    assert len(long.shared_fill) == 500
    cpu = _judge("cpu")
    note_shared_fill(cpu, shared_fill.FILLED)
    assert cpu.shared_fill is None


def _rerun_problem(monkeypatch, said: str, outputs: list) -> tuple[dict, list]:
    """check_rerun's integrity problem when the runs after the first return `outputs` in turn, and each such run's
    poison bytes (free memory, shared memory)."""
    asked: list = []

    def run_candidate(judge, inputs, poison, record, own_copy=False, footprint=0, shared_poison=None):
        asked.append((poison, poison if shared_poison is None else shared_poison))
        output = outputs[len(asked) - 1]
        if isinstance(output, Exception):
            raise output
        return CandidateRun(output, [], False, [], True)

    monkeypatch.setattr(verify_run, "run_candidate", run_candidate)
    judge = _judge("cuda", said)
    check_rerun(judge, (), CandidateRun(torch.zeros(4), [], False, [], True), {}, SimpleNamespace(reason="nan"), 0)
    [problem] = judge.verdict.integrity
    assert problem["code"] == "integrity-uninitialized-output" and problem["message"].endswith("read NaN poison)")
    return problem, asked


@pytest.mark.parametrize("third, names", [
    (torch.zeros(4), "a third run gave the first run's output: a kernel read shared memory that no thread"),
    (torch.ones(4), "a third run gave the second run's output: it read device memory it never wrote"),
    (torch.full((4,), 2.0), "a third run matched neither"),
], ids=["shared", "free", "both"])
def test_a_third_run_changing_only_the_free_memory_says_which_memory_was_read(monkeypatch, third, names):
    problem, asked = _rerun_problem(monkeypatch, shared_fill.FILLED, [torch.ones(4), third])
    assert asked == [(SECOND_POISON_BYTE, SECOND_POISON_BYTE), (SECOND_POISON_BYTE, POISON_BYTE)]
    assert "every SM's shared memory were filled with different bytes" in problem["message"]
    assert names in problem["message"], problem["message"]


def test_a_third_run_that_fails_leaves_the_rejection_standing(monkeypatch):
    failed = CandidateFailed({"status": "crash", "error_type": "OutOfMemoryError", "frames": []})
    problem, asked = _rerun_problem(monkeypatch, shared_fill.FILLED, [torch.ones(4), failed])
    assert len(asked) == 2 and "a third run, to tell which memory was read, failed" in problem["message"]


def test_without_the_fill_the_rerun_names_the_free_memory_only_and_runs_no_third(monkeypatch):
    problem, asked = _rerun_problem(monkeypatch, "no libcuda", [torch.ones(4)])
    assert asked == [(SECOND_POISON_BYTE, SECOND_POISON_BYTE)]
    assert "after the free memory was filled" in problem["message"] and "shared" not in problem["message"]


def test_a_fill_that_did_not_run_is_a_warning_on_the_candidate():
    text = "class ModelNew:\n    def forward(self, x):\n        return x\n"
    said = "cannot load the CUDA driver library (libcuda.so.1): not found"
    [finding] = report_findings({"shared_memory_poison": said}, "file:///c.py", text)
    assert (finding.code, finding.severity) == ("verify-shared-unpoisoned", Severity.WARNING)
    assert said in finding.message
    assert report_findings({"shared_memory_poison": shared_fill.FILLED}, "file:///c.py", text) == []
    assert report_findings({"shared_memory_poison": None}, "file:///c.py", text) == []


def test_the_driver_library_is_taken_by_soname_first_and_its_absence_said(driver_stub, monkeypatch, tmp_path: Path):
    import ctypes.util

    searched: list[str] = []
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: searched.append(name) or None)
    stub = driver_stub._name  # the stand-in, loaded by its path: no search made
    assert shared_fill.load_driver((stub,))._name == stub and searched == []
    with pytest.raises(shared_fill.PoisonUnavailable, match="cannot load the CUDA driver library .*nolib.so.*"):
        shared_fill.load_driver((str(tmp_path / "nolib.so"),))
    assert searched == ["cuda"]  # searched only after the soname failed


def test_the_self_test_runs_the_fill_in_the_primary_context_and_gives_it_back(driver_stub):
    before = driver_stub.stub_context_seen()[:5]
    detail = shared_fill.self_test(driver_stub, device=1)
    assert detail == "the fill kernel loaded from PTX and ran on device 1 (one block, 48 KiB)"
    after = driver_stub.stub_context_seen()[:5]
    assert after[:2] == [1, 0x1234] and after[2] == before[2] + 1  # device 1's context made current; synchronized
    assert after[3] == before[3] + 1 and after[4] == 0  # released as often as retained
    assert driver_stub.stub_seen()[3:11] == [1, 1, 1024, 1, 48 * 1024, 0, 0xFFFFFFFF, 48 * 1024 // 4]


@pytest.mark.parametrize("which, what", [(6, "cuInit"), (7, "cuDeviceGet"), (8, "cuDevicePrimaryCtxRetain"),
                                         (9, "cuCtxSetCurrent"), (10, "cuCtxSynchronize"), (5, "cuLaunchKernel")])
def test_a_self_test_that_fails_names_its_step_and_still_gives_the_context_back(driver_stub, which, what):
    from kernel_lsp.commands.doctor import shared_fill_check

    driver_stub.stub_fail(which)
    check = shared_fill_check(driver_stub)
    assert (check.level, check.item) == ("FAIL", "shared-memory fill")
    assert check.detail.startswith(what) and "verify-shared-unpoisoned" in check.detail, check.detail
    assert driver_stub.stub_context_seen()[4] == 0  # nothing left retained
    assert shared_fill_check(driver_stub).level == "ok"  # the failure was once: the next check passes
