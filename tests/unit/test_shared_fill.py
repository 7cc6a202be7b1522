"""The shared-memory fill (candidate/shared_fill.py) on the CPU: its PTX assembled by the real ptxas (the stores
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
from kernel_lsp.verify import checks as verify_checks
from kernel_lsp.candidate import shared_fill
from kernel_lsp.candidate.handle import CandidateFailed
from kernel_lsp.contracts.candidate_replies import RunFailure
from kernel_lsp.candidate.exchange import Exchange
from kernel_lsp.candidate.side import CandidateSide
from kernel_lsp.candidate.integrity import POISON_BYTE, SECOND_POISON_BYTE
from kernel_lsp.verify.checks import check_rerun
from kernel_lsp.verify.judge import CandidateRun, Integrity, note_shared_fill
from kernel_lsp.verify.verdict import report_findings
from tests.problems import recorded_report
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



# a stand-in for libcuda with the entry points the fill and its self-test use: it records what it was given, so the
# ctypes calls (argument order, the kernel's parameter array, NULL extra, handles above 4 GiB kept whole) are
# checked without a GPU. A real GPU runs the real library in tests/gpu/test_verify_pipeline_gpu.py.
DRIVER_STUB = r"""
#include <stdint.h>
#include <string.h>
#define CONTEXT ((void*)0x7f3a00001234ULL)
#define BEFORE ((void*)0x7f3a00005678ULL)
#define MODULE ((void*)0x7f3a00000010ULL)
#define FUNCTION ((void*)0x7f3a00000020ULL)
static unsigned long long seen[12];
static int fail_at = 0;  /* 1-13: that entry point returns 999 once */
static int no_context = 0;
unsigned long long* stub_seen(void) { return seen; }
void stub_fail(int which) { fail_at = which; }
void stub_no_context(int on) { no_context = on; }
static int failing(int which) { if (fail_at == which) { fail_at = 0; return 1; } return 0; }
static int current_is_set = 0;
static void* current = 0;
int cuCtxGetCurrent(void** ctx) {
    *ctx = no_context ? 0 : current_is_set ? current : CONTEXT; return failing(1) ? 999 : 0;
}
int cuModuleLoadData(void** module, const void* image) {
    if (failing(2) || !strstr((const char*)image, ".entry kernel_lsp_poison")) return 999;
    *module = MODULE; return 0;
}
int cuModuleGetFunction(void** function, void* module, const char* name) {
    if (failing(3) || module != MODULE || strcmp(name, "kernel_lsp_poison")) return 999;
    *function = FUNCTION; return 0;
}
int cuFuncSetAttribute(void* function, int attribute, int value) {
    seen[0] = attribute; seen[1] = value; seen[2] = function == FUNCTION; return failing(4) ? 999 : 0;
}
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void* stream, void** params, void** extra) {
    seen[3] = gx; seen[4] = gy * gz; seen[5] = bx; seen[6] = by * bz; seen[7] = shared;
    seen[8] = (uintptr_t)stream; seen[9] = *(unsigned*)params[0]; seen[10] = *(unsigned*)params[1];
    seen[11] = extra == 0 && f == FUNCTION;
    return failing(5) ? 999 : 0;
}
int cuGetErrorString(int code, const char** text) { *text = code == 999 ? "stub failure" : "?"; return 0; }
/* the self-test's calls: device asked, the contexts made current (first, last), syncs, releases, still retained,
   modules unloaded */
static unsigned long long context_seen[7];
unsigned long long* stub_context_seen(void) { return context_seen; }
void stub_reset(void) { current_is_set = 0; current = 0; fail_at = 0; no_context = 0; }
void stub_start_in(int before) { current_is_set = 1; current = before ? BEFORE : 0; context_seen[1] = 0; }
int cuInit(unsigned flags) { return failing(6) || flags ? 999 : 0; }
int cuDeviceGet(int* device, int ordinal) {
    context_seen[0] = ordinal; *device = 40 + ordinal; return failing(7) ? 999 : 0;
}
int cuCtxGetDevice(int* device) { *device = 40; return failing(13) ? 999 : 0; }  /* the current context's: 0 */
int cuDeviceGetAttribute(int* value, int attribute, int device) {
    if (failing(11) || device < 40) return 999;
    *value = attribute == 16 ? 132 : attribute == 97 ? 232448 : -1; return 0;
}
int cuDevicePrimaryCtxRetain(void** ctx, int device) {
    if (failing(8) || device < 40) return 999; *ctx = CONTEXT; context_seen[4] += 1; return 0;
}
int cuCtxSetCurrent(void* ctx) {
    if (!context_seen[1]) context_seen[1] = (uintptr_t)ctx;
    context_seen[2] = (uintptr_t)ctx; current = ctx; return failing(9) ? 999 : 0;
}
int cuCtxSynchronize(void) { context_seen[3] += 1; return failing(10) ? 999 : 0; }
int cuModuleUnload(void* module) { context_seen[6] += module == MODULE; return failing(12) ? 999 : 0; }
int cuDevicePrimaryCtxRelease_v2(int device) { context_seen[5] += device >= 40; context_seen[4] -= 1; return 0; }
"""


@pytest.fixture(scope="module")
def driver_library(tmp_path_factory):
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


@pytest.fixture
def driver_stub(driver_library):
    """The stand-in, built once, its state (current context, failures) reset for each test."""
    driver_library.stub_reset()
    return driver_library


def _cuda_h_value(name: str, fallback: int) -> int:
    """An enumerator's value as the toolkit's cuda.h has it (the fallback, its value in CUDA 13, without one)."""
    header = Path(nvcc_path()).parent.parent / "include" / "cuda.h"
    if header.is_file():
        import re

        found = re.search(rf"\b{name}\s*=\s*(\d+)", header.read_text(errors="replace"))
        if found:
            return int(found.group(1))
    return fallback


def test_the_driver_constants_are_cuda_hs():
    for name, fallback in (("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8),
                           ("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", 16),
                           ("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", 97)):
        assert getattr(shared_fill, name) == _cuda_h_value(name, fallback) == fallback, name


def test_the_fill_calls_the_driver_api_with_the_kernels_launch(driver_stub):
    fill = shared_fill.DriverFill(driver_stub, 232448, 132 * shared_fill.BLOCKS_PER_SM)
    fill.launch(0x5A5A5A5A, 0x7F3A0000ABC0)
    seen = driver_stub.stub_seen()[:12]
    assert seen[:3] == [8, 232448, 1]  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, on the function
    assert seen[3:8] == [528, 1, 1024, 1, 232448]  # grid, grid's y*z, block, block's y*z, dynamic shared bytes
    assert seen[8:] == [0x7F3A0000ABC0, 0x5A5A5A5A, 232448 // 4, 1]  # the stream, whole; the parameters; NULL extra
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

    def torch_refuses(index: int):
        raise RuntimeError("CUDA error: invalid device ordinal")

    assert shared_fill.SharedPoison(7, make=torch_refuses).fill(0xFF) == "RuntimeError: CUDA error: invalid device ordinal"


class _Doubler(torch.nn.Module):
    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def forward(self, x):
        self.log.append(("forward",))
        return x * 2


def test_the_candidates_process_fills_shared_memory_last_before_forward_and_says_so(tmp_path: Path, monkeypatch):
    from kernel_lsp.candidate import integrity

    log: list = []
    monkeypatch.setattr(integrity, "poison_free_memory", lambda device, byte, *rest: log.append(("free", byte)))
    host = CandidateSide(str(tmp_path))  # its model set by hand: op_load would import a file and gc.freeze this process
    host.target, host.model = torch.device("cpu"), _Doubler(log)
    judge_end = Exchange(tmp_path, "judge")
    sent = judge_end.send((torch.arange(4.0),))
    assert host.op_forward({"inputs": sent, "poison": POISON_BYTE}).shared_fill is None  # none made: no fill
    host.shared_poison = shared_fill.SharedPoison(0, make=lambda index: _Filler(index, log))
    reply = host.op_forward({"inputs": sent, "poison": SECOND_POISON_BYTE, "own_copy": True})
    assert log == [("free", 0xFF), ("forward",), ("made", 0),  # the free memory, then shared memory, then forward
                   ("free", 0x3C), ("fill", 0x3C3C3C3C), ("forward",)]
    assert reply.shared_fill == shared_fill.FILLED and "candidate: poisoning shared memory" in reply.seconds
    assert judge_end.receive(reply.output).tolist() == [0.0, 2.0, 4.0, 6.0]
    host.op_forward({"inputs": sent, "poison": SECOND_POISON_BYTE, "shared_poison": POISON_BYTE})  # a third run's
    assert log[-3:] == [("free", 0x3C), ("fill", 0xFFFFFFFF), ("forward",)]


def _judge(device: str, shared_fill_said: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(target=torch.device(device), shared_fill=shared_fill_said, integrity=Integrity(device))


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


NAN = float("nan")


def _rerun_problem(monkeypatch, said: str, outputs: list, first: list | None = None) -> tuple[dict, list]:
    """check_rerun's integrity problem when the first run returned `first` and the runs after it return `outputs`
    in turn (a value; an exception, raised; a callable, given the judge, for what the run does there), and each such
    run's poison bytes (free memory, shared memory)."""
    asked: list = []

    def run_candidate(judge, inputs, poison, record, own_copy=False, footprint=0, shared_poison=None):
        asked.append((poison, poison if shared_poison is None else shared_poison))
        output = outputs[len(asked) - 1]
        if isinstance(output, Exception):
            raise output
        if callable(output):
            output = output(judge)
        return CandidateRun(torch.tensor(output), [], False, [], True)

    monkeypatch.setattr(verify_checks, "run_candidate", run_candidate)
    judge = _judge("cuda", said)
    check_rerun(judge, (), CandidateRun(torch.tensor(first or [0.0] * 4), [], False, [], True), {},
                SimpleNamespace(reason="nan"), 0)
    [problem] = judge.integrity.problems
    assert problem.code == "integrity-uninitialized-output" and problem.message.endswith("read NaN poison)")
    return problem, asked


@pytest.mark.parametrize("first, second, third, names", [
    ([NAN, 0.0], [0.5, 0.0], [NAN, 0.0], "gives the first run's output: a kernel read shared memory that no thread"),
    ([NAN, 0.0], [0.5, 0.0], [0.5, 0.0], "gives the second run's output: it read device memory it never wrote"),
    ([NAN, NAN], [0.5, 0.5], [NAN, 0.5], "differs from both: it read shared memory that no thread of its block wrote "
                                         "and device memory"),
    ([0.0, 0.0], [2e-4, 0.0], [1e-4, 0.0], "gives the output of both: its output changes from run to run"),
], ids=["shared", "free", "both", "neither"])
def test_a_third_run_changing_only_shared_memory_says_which_memory_was_read(monkeypatch, first, second, third, names):
    problem, asked = _rerun_problem(monkeypatch, shared_fill.FILLED, [second, third], first)
    assert asked == [(SECOND_POISON_BYTE, SECOND_POISON_BYTE), (SECOND_POISON_BYTE, POISON_BYTE)]
    assert "every SM's shared memory were filled with different bytes" in problem.message
    assert names in problem.message, problem.message


def test_a_third_run_that_fails_leaves_the_rejection_standing_unless_it_hung(monkeypatch):
    failed = CandidateFailed(RunFailure("out-of-memory", "", "OutOfMemoryError"))
    problem, asked = _rerun_problem(monkeypatch, shared_fill.FILLED, [[1.0] * 4, failed])
    assert len(asked) == 2 and "a third run, to tell which memory was read, failed" in problem.message

    def unfilled(judge):
        judge.shared_fill = "cuLaunchKernel (the fill) failed: CUDA error 999 (stub)"
        return [0.0] * 4

    problem, _ = _rerun_problem(monkeypatch, shared_fill.FILLED, [[1.0] * 4, unfilled])
    assert "could not fill shared memory (cuLaunchKernel" in problem.message  # no attribution on a third
    hung = CandidateFailed(RunFailure("timeout", "did not return"))
    with pytest.raises(CandidateFailed):  # its process is gone: the hang is the verdict, as in any run
        _rerun_problem(monkeypatch, shared_fill.FILLED, [[1.0] * 4, hung])


def test_without_the_fill_the_rerun_names_the_free_memory_only_and_runs_no_third(monkeypatch):
    problem, asked = _rerun_problem(monkeypatch, "no libcuda", [[1.0] * 4])
    assert asked == [(SECOND_POISON_BYTE, SECOND_POISON_BYTE)]
    assert "after the free memory was filled" in problem.message and "shared" not in problem.message


def test_a_fill_that_did_not_run_is_a_warning_on_the_candidate():
    text = "class ModelNew:\n    def forward(self, x):\n        return x\n"
    said = "cannot load the CUDA driver library (libcuda.so.1): not found"
    [finding] = report_findings(recorded_report(shared_memory_poison=said), "file:///c.py", text)
    assert (finding.code, finding.severity) == ("verify-shared-unpoisoned", Severity.WARNING)
    assert said in finding.message
    assert report_findings(recorded_report(shared_memory_poison=shared_fill.FILLED), "file:///c.py", text) == []
    assert report_findings(recorded_report(shared_memory_poison=None), "file:///c.py", text) == []


def test_the_driver_library_is_taken_by_soname_first_and_its_absence_said(driver_stub, monkeypatch, tmp_path: Path):
    import ctypes.util

    searched: list[str] = []
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: searched.append(name) or None)
    stub = driver_stub._name  # the stand-in, loaded by its path: no search made
    assert shared_fill.load_driver((stub,))._name == stub and searched == []
    with pytest.raises(shared_fill.PoisonUnavailable, match="cannot load the CUDA driver library .*nolib.so.*"):
        shared_fill.load_driver((str(tmp_path / "nolib.so"),))
    assert searched == ["cuda"]  # searched only after the soname failed


def test_the_self_test_runs_the_fill_as_the_verifier_does_and_leaves_the_context_as_it_was(driver_stub):
    driver_stub.stub_start_in(1)  # some other context was current before
    before = driver_stub.stub_context_seen()[:7]
    detail = shared_fill.self_test(driver_stub, device=1)
    assert detail == "the fill kernel loaded from PTX and ran on device 1: 528 blocks of 227 KiB (132 SMs)"
    after = driver_stub.stub_context_seen()[:7]
    assert after[:3] == [1, 0x7F3A00001234, 0x7F3A00005678]  # device 1's context made current, then the one before
    assert after[3] == before[3] + 1 and after[6] == before[6] + 1  # synchronized; the module unloaded
    assert after[5] == before[5] + 1 and after[4] == 0  # released as often as retained
    assert driver_stub.stub_seen()[3:11] == [528, 1, 1024, 1, 232448, 0, 0xFFFFFFFF, 232448 // 4]


@pytest.mark.parametrize("which, what", [(6, "cuInit"), (7, "cuDeviceGet"), (11, "cuDeviceGetAttribute"),
                                         (8, "cuDevicePrimaryCtxRetain"), (9, "cuCtxSetCurrent"),
                                         (2, "cuModuleLoadData"), (5, "cuLaunchKernel"), (10, "cuCtxSynchronize")])
def test_a_self_test_that_fails_names_its_step_and_still_gives_the_context_back(driver_stub, which, what):
    from kernel_lsp.commands.doctor import shared_fill_check

    driver_stub.stub_start_in(0)
    driver_stub.stub_fail(which)
    check = shared_fill_check(driver_stub)
    assert (check.level, check.item) == ("FAIL", "shared-memory fill")
    assert check.detail.startswith(what) and "verify-shared-unpoisoned" in check.detail, check.detail
    seen = driver_stub.stub_context_seen()
    assert seen[4] == 0 and (which in (6, 7, 11, 8) or seen[2] == 0)  # nothing retained; no context left current
    assert shared_fill_check(driver_stub).level == "ok"  # the failure was once: the next check passes


def test_a_driver_without_an_entry_point_is_said_not_raised(tmp_path: Path):
    import ctypes
    import shutil

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler (cc or gcc) to build the libcuda stand-in")
    (tmp_path / "old.c").write_text("int cuInit(unsigned flags) { return 0; }\n")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(tmp_path / "old.so"), str(tmp_path / "old.c")], check=True)
    with pytest.raises(shared_fill.PoisonUnavailable, match="lacks an entry point the fill needs: .*cuDeviceGet"):
        shared_fill.self_test(ctypes.CDLL(str(tmp_path / "old.so")))


def test_the_verifiers_fill_is_sized_from_the_current_contexts_device_as_the_self_test_is(driver_stub, monkeypatch):
    import types

    calls: list = []  # torch's side, stood in: the context made current, and the stream the fill goes to
    stream = types.SimpleNamespace(cuda_stream=0x7F3A0000ABC0)
    for name, value in (("is_available", lambda: True), ("set_device", lambda i: calls.append(("device", i))),
                        ("synchronize", lambda: calls.append(("sync",))), ("current_stream", lambda: stream)):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(torch, "zeros", lambda *args, **kwargs: calls.append(("zeros", kwargs["device"])))
    poisoner = shared_fill.Poisoner(0, library=driver_stub)
    assert (poisoner.bytes, poisoner.fill_kernel.blocks) == (232448, 132 * shared_fill.BLOCKS_PER_SM)
    poisoner.fill(0x3C3C3C3C)
    assert calls == [("device", 0), ("zeros", "cuda:0"), ("sync",), ("sync",)]
    assert driver_stub.stub_seen()[3:11] == [528, 1, 1024, 1, 232448, 0x7F3A0000ABC0, 0x3C3C3C3C, 232448 // 4]
    driver_stub.stub_fail(13)
    with pytest.raises(shared_fill.PoisonUnavailable, match="cuCtxGetDevice"):
        shared_fill.Poisoner(0, library=driver_stub)


def test_the_third_run_is_judged_on_a_bounded_sample_of_where_the_first_two_differ(monkeypatch):
    """Only the elements where the first two runs differ are kept for the third (a few MiB on the host, not two
    copies of the outputs): a sample spread over them, with both runs' values, compared where the third run has them."""
    from kernel_lsp.verify import compare

    monkeypatch.setattr(verify_checks, "COMPARE_CHUNK", 1000)
    monkeypatch.setattr(compare, "COMPARE_CHUNK", 1000)
    first = torch.zeros(10_000)
    second = first.clone()
    second[::3] = 1.0  # 3,334 elements differ, over ten chunks
    found = verify_checks.differing_elements((first, torch.arange(5)), (second, torch.arange(5)), {}, limit=50)
    kept = torch.cat([sample.positions for sample in found])
    assert {sample.leaf for sample in found} == {0} and 10 <= len(found)  # each chunk with differences, leaf 0
    assert kept.numel() <= 10 * 1024 and bool((kept % 3 == 0).all())  # at most per_chunk a chunk, only differing
    assert all(bool((s.first == 0).all()) and bool((s.second == 1).all()) for s in found)
    assert verify_checks.agrees_at((second, torch.arange(5)), found, "second", {})
    assert not verify_checks.agrees_at((second, torch.arange(5)), found, "first", {})
    third = second.clone()
    third[:5000] = 0.0  # the first run's values in the first half, the second's in the other
    assert not verify_checks.agrees_at((third,), found, "second", {}) and not verify_checks.agrees_at((third,), found,
                                                                                                 "first", {})
    assert not verify_checks.agrees_at((torch.zeros(10),), found, "first", {})  # shorter than the positions
    ints = verify_checks.differing_elements(torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3]), {})
    assert [(s.positions.tolist(), s.first.tolist(), s.second.tolist()) for s in ints] == [([1], [2], [5])]
