"""shared-init, kernel-lsp's own check of shared memory read before any thread wrote it (issue 22), on the CPU: the
comparison of the runs' outputs, the check's sequence over a stand-in fill that a CPU model reads, the profile
driver's --poison-shared answer without a GPU, and the worker's finding on the `__shared__` declaration, its
problems and its summary. The fill itself is tests/unit/test_shared_fill.py's; on a real GPU,
tests/gpu/test_sanitize_gpu.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernel_lsp.contracts.codec import decode, encode
from kernel_lsp.contracts.sanitize_report import SanitizeProblem, SharedInitAnswer
from kernel_lsp.findings import Severity, uri_to_path
from kernel_lsp.kinds.sanitize import SanitizeOptions
from kernel_lsp.profile import shared_init
from kernel_lsp.profile.locations import shared_declarations
from kernel_lsp.profile.sanitize import (
    CHECKS,
    SHARED_INIT,
    SanitizePlan,
    SanitizeRun,
    ToolRun,
    _shared_init,
    sanitize_environment,
    sanitize_findings,
    sanitize_report,
    shared_init_problem,
    summary_line,
)
from tests.gpu import sanitizer_candidates as cands



def _leaves(*tensors):
    return shared_init.output_leaves(tuple(tensors))


def test_output_leaves_are_flat_copies_of_every_tensor_in_the_output():
    kept = torch.ones(2, 3)
    [leaf] = shared_init.output_leaves(kept)
    kept.fill_(5.0)  # a candidate that writes the same tensor again on its next call
    assert leaf.shape == (6,) and bool((leaf == 1.0).all())
    nested = shared_init.output_leaves({"a": [torch.ones(2, 3, dtype=torch.float16)],
                                        "b": (torch.zeros(4, dtype=torch.complex64), 7, "text")})
    assert [(w.dtype, w.numel()) for w in nested] == [(torch.float16, 6), (torch.float32, 8)]


def test_close_uses_the_verifiers_tolerance_and_agrees_on_nan_and_infinity():
    a = torch.tensor([1.0, float("nan"), float("inf"), 1e16, 0.0])
    b = torch.tensor([1.0 + 1e-6, float("nan"), float("inf"), 1.0, 1e-3])
    assert shared_init.close(a, b, 1.0).tolist() == [True, True, True, False, False]
    half = torch.tensor([1.0, 2.0], dtype=torch.float16)
    assert shared_init.close(half, half + 0.004, 1.0).tolist() == [True, True]  # within fp16's 1e-2
    ints = torch.tensor([3, 4])
    assert shared_init.close(ints, torch.tensor([3, 5]), 1.0).tolist() == [True, False]


def test_compare_counts_what_follows_the_fill_and_what_is_only_noise():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = a.clone()
    b[2] = 9.0  # element 2 follows the pattern: the same in both A runs and both B runs, different between
    answer = encode(shared_init.compare([_leaves(a), _leaves(b), _leaves(a), _leaves(b)]))
    assert answer == {"elements": 4, "dependent": 1, "unstable": 0, "first": {"output": 0, "index": 2}}
    clean = encode(shared_init.compare([_leaves(a)] * 4))
    assert clean["dependent"] == 0 and clean["unstable"] == 0 and clean["first"] is None
    last_bits = a * (1 + 1e-7)  # an honest kernel's atomics: the last bits differ from run to run
    assert encode(shared_init.compare([_leaves(a), _leaves(a), _leaves(last_bits), _leaves(a)]))["unstable"] == 0
    noisy = a.clone()
    noisy[0] = -1.0  # element 0 changed between the two A runs: nondeterminism, not evidence
    answer = encode(shared_init.compare([_leaves(a), _leaves(b), _leaves(noisy), _leaves(b)]))
    assert answer["unstable"] == 1 and answer["dependent"] == 1
    second = encode(shared_init.compare([_leaves(a, a), _leaves(a, b), _leaves(a, a), _leaves(a, b)]))
    assert second["first"] == {"output": 1, "index": 2} and second["elements"] == 8
    changed = encode(shared_init.compare([_leaves(a), _leaves(a, a), _leaves(a), _leaves(a)]))
    assert changed["problem"] and changed["dependent"] == 0
    nothing = encode(shared_init.compare([shared_init.output_leaves(1.5)] * 4))  # a forward that returns no tensor
    assert nothing["problem"] == "the forward call's output holds no tensor values to compare"


def test_compare_works_in_chunks(monkeypatch):
    monkeypatch.setattr(shared_init, "CHUNK", 3)
    a = torch.arange(10, dtype=torch.float32)
    b = a.clone()
    b[[1, 7, 9]] = -5.0
    answer = encode(shared_init.compare([_leaves(a), _leaves(b), _leaves(a), _leaves(b)]))
    assert answer["dependent"] == 3 and answer["first"] == {"output": 0, "index": 1}


class _SharedBank:
    """A stand-in for the GPU's shared memory: what the last fill left, which the model below reads half of."""

    words = torch.zeros(8, dtype=torch.int32)

    def __init__(self, device_index: int) -> None:
        self.bytes = 32

    def fill(self, pattern: int) -> None:
        _SharedBank.words = torch.full((8,), pattern, dtype=torch.int64).to(torch.int32)


class _HalfUnwritten(torch.nn.Module):
    def forward(self, x):  # the first half comes from x; the second half is whatever the "shared memory" held
        return torch.cat([x[:4], _SharedBank.words[4:].view(torch.float32)])


class _Honest(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_the_check_runs_a_fill_before_each_forward_call_and_finds_the_half_that_follows_it():
    x = torch.arange(8, dtype=torch.float32)
    forward = lambda model, inputs, calls: model(*inputs)  # noqa: E731
    answer = encode(shared_init.run_check(_HalfUnwritten(), (x,), forward, poisoner=_SharedBank))
    assert answer["dependent"] == 4 and answer["elements"] == 8 and answer["unstable"] == 0
    assert answer["first"] == {"output": 0, "index": 4}
    assert answer["patterns"] == [f"0x{p:08x}" for p in shared_init.PATTERNS] and answer["fillBytes"] == 32
    assert encode(shared_init.run_check(_Honest(), (x,), forward, poisoner=_SharedBank))["dependent"] == 0

    def raising(model, inputs, calls):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    assert "illegal memory access" in shared_init.run_check(_Honest(), (x,), raising, poisoner=_SharedBank).problem


async def test_without_a_gpu_the_confined_drivers_answer_says_why(tmp_path: Path):
    """The worker's own run of the check (_shared_init): the driver started confined as the warm call is, its
    answer written into the scratch HOME it may write, read back, and turned into the run's problem."""
    folder, home = tmp_path / "run", tmp_path / "run" / "home"
    (folder / "task").mkdir(parents=True)
    home.mkdir()
    (folder / "task" / "cand.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        return x + 1\n\n\ndef get_inputs():\n    return [torch.randn(16)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    environment, writable = sanitize_environment(home, tmp_path / "cache")
    plan = SanitizePlan(candidate="cand.py", reference=None, tools=(SHARED_INIT,), device="cpu")
    run = await _shared_init(plan, folder, home, environment, writable)
    assert run.shared == SharedInitAnswer(problem="no CUDA device is visible to the candidate's process"), run.problem
    assert run.problem.message == "shared-init could not check the candidate: no CUDA device is visible to the " \
                                  "candidate's process"
    assert run.to_report().complete is False and not run.timed_out


def _run_with(answer: dict | None, problem: str | None = None, timed_out: bool = False) -> SanitizeRun:
    shared = decode(SharedInitAnswer, answer) if answer is not None else None
    run = ToolRun(SHARED_INIT, None, 3.0, timed_out=timed_out, shared=shared)
    run.problem = (SanitizeProblem("test", problem) if problem is not None else
                   shared_init_problem(shared, 0, timed_out, 300, "tail"))
    return SanitizeRun(runs=[run])


FOUND = {"elements": 1048576, "dependent": 524288, "unstable": 0, "first": {"output": 0, "index": 128},
         "patterns": ["0x5a5a5a5a", "0x3f803f80"], "fillBytes": 232448}


def test_the_finding_sits_on_the_shared_declaration_of_the_candidates_kernel(tmp_path: Path):
    path = str(tmp_path / "uninit_shared.py")
    files = {"cand.py": cands.UNINIT_SHARED}
    run = _run_with(FOUND)
    findings, library = sanitize_findings(run, files, files, {"cand.py": path}, "cand.py")
    [finding] = findings
    declaration = next(i for i, line in enumerate(cands.UNINIT_SHARED.splitlines()) if "__shared__" in line)
    assert (finding.code, finding.severity, finding.range.start.line) == ("sanitizer-shared-init", Severity.ERROR,
                                                                          declaration)
    assert uri_to_path(finding.uri) == Path(path) and not library
    assert "524288 of 1048576 output elements" in finding.message and "scale_tile" in finding.message
    assert "0x5a5a5a5a then 0x3f803f80" in finding.message
    # the read on the line marked BUG is related information: where the user looks next
    assert [(uri_to_path(r.uri), r.range.start.line) for r in finding.related] == [
        (Path(path), cands.bug_line(cands.UNINIT_SHARED) - 1)]
    assert "a read of `tile`" in finding.related[0].message
    summary = summary_line(run, findings, library)
    assert summary == "errors found: shared-init 1", summary
    report = encode(sanitize_report(run, findings, library))
    assert report["errors"] == 1 and not report["clean"]
    assert report["tools"][0]["sharedInit"]["dependent"] == 524288 and report["tools"][0]["complete"]


KERNELS_CU = r"""
#include <cuda_runtime.h>
__device__ float helper(const float* p) { return p[0]; }
__global__ void two(const float* x, float* y) {
    __shared__ __align__(16) float a[32][33], b[64];  // one declaration, two arrays
    extern __shared__ float dynamic_smem[];
    a[threadIdx.y][threadIdx.x] = x[threadIdx.x];
    b [threadIdx.x] += 1.f;
    dynamic_smem[threadIdx.x] = a[threadIdx.x][0] == 0.f ? 1.f : 2.f;
    float* alias = dynamic_smem;
    // a[0][0] in a comment is not a read
    y[threadIdx.x] = helper(b) + alias[1];
}
__global__ void other(float* y) { y[0] = 1.f; }
"""


def test_shared_declarations_name_their_arrays_and_find_their_reads():
    lines = KERNELS_CU.splitlines()
    found = shared_declarations({"k.cu": KERNELS_CU}, {"k.cu": "/src/k.cu"})
    assert [(d.kernel, d.names, d.location.file, d.location.range.start.line) for d in found] == [
        ("two", ("a", "b"), "/src/k.cu", 4), ("two", ("dynamic_smem",), "/src/k.cu", 5)]
    reads = {(lines[r.range.start.line].strip(),
              lines[r.range.start.line][r.range.start.character:r.range.end.character]) for r in found[0].reads}
    assert reads == {("b [threadIdx.x] += 1.f;", "b"),  # a compound assignment reads
                     ("dynamic_smem[threadIdx.x] = a[threadIdx.x][0] == 0.f ? 1.f : 2.f;", "a"),  # == is no store
                     ("y[threadIdx.x] = helper(b) + alias[1];", "b")}
    assert [lines[r.range.start.line].strip() for r in found[1].reads] == ["float* alias = dynamic_smem;"]


def test_a_candidate_without_shared_declarations_gets_it_on_model_new():
    text = cands.CLEAN  # its kernel declares no shared memory (a library's or the compiler's would be the cause)
    assert not shared_declarations({"cand.py": text}, {})
    [finding] = sanitize_findings(_run_with(FOUND), {"cand.py": text}, {"cand.py": text}, {}, "cand.py")[0]
    assert text.splitlines()[finding.range.start.line].startswith("class ModelNew")
    assert "no `__shared__` declaration" in finding.message


@pytest.mark.parametrize("answer, timed_out, expected", [
    ({**FOUND, "unstable": 12, "dependent": 0}, False, "inconclusive: 12 of 1048576 output elements changed"),
    (None, False, "gave no answer (exit 0): tail"),
    ({**FOUND, "unstable": 3}, True, "ran past 300 s"),
])
def test_a_check_that_proves_nothing_is_incomplete_never_clean_nor_an_error(answer, timed_out, expected):
    run = _run_with(answer, timed_out=timed_out)
    assert expected in (run.runs[0].problem.message if run.runs[0].problem else "")
    findings, library = sanitize_findings(run, {"c.py": cands.UNINIT_SHARED}, {"c.py": cands.UNINIT_SHARED}, {},
                                          "c.py")
    assert findings == []
    assert summary_line(run, findings, library).startswith("incomplete: shared-init 0 (")
    assert not sanitize_report(run, findings, library).clean


def test_a_clean_answer_is_clean():
    run = _run_with({**FOUND, "dependent": 0, "first": None})
    findings, library = sanitize_findings(run, {"c.py": cands.UNINIT_SHARED}, {"c.py": cands.UNINIT_SHARED}, {},
                                          "c.py")
    assert findings == [] and summary_line(run, findings, library) == "clean: shared-init 0"
    assert sanitize_report(run, findings, library).clean


def test_shared_init_is_one_of_the_checks_a_job_runs_by_default():
    assert CHECKS[-1] == SHARED_INIT and SanitizeOptions().tools == CHECKS
    assert SanitizeOptions(tools=("shared-init",)).tools == ("shared-init",)
    with pytest.raises(ValueError, match="shared-init"):
        SanitizeOptions(tools=("sharedcheck",))


def test_the_agent_counts_a_shared_init_finding_as_an_error(tmp_path: Path):
    from kernel_lsp.agent.safety import sanitize_entry
    from kernel_lsp.kinds.sanitize import SanitizeOutcome
    from kernel_lsp.worker.protocol import Result

    path = tmp_path / "cand.py"
    files = {"cand.py": cands.UNINIT_SHARED}
    run = _run_with(FOUND)
    findings, library = sanitize_findings(run, files, files, {"cand.py": str(path)}, "cand.py")
    result = Result("ok", [f.to_dict() for f in findings], {"sanitize": sanitize_report(run, findings, library),
                                                           "summary": summary_line(run, findings, library)}, {})
    outcome = SanitizeOutcome.of(result)
    assert [f.code for f in outcome.user_errors] == ["sanitizer-shared-init"]
    entry = sanitize_entry(outcome, path, tmp_path)
    assert entry["status"] == "errors" and entry["errors"][0]["tool"] == "shared-init"
    assert entry["errors"][0]["line"] == findings[0].range.start.line + 1
