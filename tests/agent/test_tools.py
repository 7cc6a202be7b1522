"""The agent's tools without a worker: line edits, compile checks, the profile rule, where candidates are written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kernel_lsp.agent.tools import Workbench, apply_line_edits, kernel_structure, static_feedback
from kernel_lsp.config import Settings
from kernel_lsp.contracts.codec import encode
from kernel_lsp.contracts.profile_report import (
    EnergyReading,
    KernelMetrics,
    KernelProfile,
    ProfileHint,
    ProfileIsolation,
    ProfileProblem,
    ProfileReport,
    PtxasFigures,
    SassSummary,
)
from kernel_lsp.findings import Finding, Range, Severity
from kernel_lsp.profile.worker_job import ON_CPU
from kernel_lsp.worker.protocol import Job, Result
from tests.problems import relu_problem, triton_relu, verified_report_wire

REFERENCE = relu_problem()

TRITON = triton_relu(64)


def energy(mj_per_call: float) -> EnergyReading:
    return EnergyReading(mj_per_call=mj_per_call, calls=100, seconds=1.0, how="NVML")


RELU_PROFILE = ProfileReport(  # a GPU run's: relu_kernel memory bound, both energies read
    source="ncu", gpu=None, ceilings=None, reference_kernels=[], problems=[],
    kernels=[KernelProfile(kernel="relu_kernel", name="relu_kernel", id=0, bound="memory", metrics=KernelMetrics(),
                           findings=[], registers=None)],
    energy=energy(40.0), isolation=ProfileIsolation(files="isolated", network="isolated", ncu="isolated"),
    reference_energy=energy(50.0))


class RecordingWorker:
    """Answers every job with a verified verdict and keeps the jobs (and whether their file was still on disk)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.files_left: list[bool] = []

    async def run(self, job: Job, progress=None, timeout_s=None) -> Result:
        self.jobs.append(job)
        self.files_left.append(Path(job.config["origins"][job.config["candidate"]]).exists())
        report = verified_report_wire(eager=0.5, median_ms=2.0)
        if job.kind == "profile":
            return Result("ok", metrics={"profile": encode(RELU_PROFILE)})
        return Result("ok", metrics={"verdict": "verified", "summary": "correct 2/2", "report": report})


@pytest.fixture
def bench(tmp_path: Path) -> tuple[Workbench, RecordingWorker]:
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "relu.py").write_text(TRITON)
    worker = RecordingWorker()
    workbench = Workbench(tmp_path / "relu.py", tmp_path / "ref.py", TRITON, Settings(), worker, {"device": "cpu"},
                          "p1")
    return workbench, worker


def test_line_edits_replace_insert_and_delete_together():
    text = "a\nb\nc\nd\n"
    edits = [{"start_line": 2, "end_line": 2, "text": "B1\nB2"}, {"start_line": 4, "end_line": 3, "text": "new"},
             {"start_line": 4, "end_line": 4, "text": ""}]
    assert apply_line_edits(text, edits) == "a\nB1\nB2\nc\nnew\n"


@pytest.mark.parametrize("edits, message", [
    ([{"start_line": 1, "end_line": 3, "text": "x"}, {"start_line": 2, "end_line": 2, "text": "y"}], "overlap"),
    ([{"start_line": 9, "end_line": 9, "text": "x"}], "outside the candidate's 1-4"),
    ([{"start_line": "1", "end_line": 1, "text": "x"}], "integer start_line"),
    ([], "non-empty list"),
])
def test_bad_line_edits_say_what_is_wrong(edits, message):
    with pytest.raises(ValueError, match=message):
        apply_line_edits("a\nb\nc\nd\n", edits)


async def test_write_candidate_takes_a_whole_file_or_edits_but_not_both(bench):
    workbench, _ = bench
    both = await workbench.execute("write_candidate", {"source": "x = 1\n", "edits": []})
    assert both.is_error and "either" in json.loads(both.content)["error"]
    edited = await workbench.execute("write_candidate", {"edits": [{"start_line": 1, "end_line": 1,
                                                                    "text": "import torch  # edited"}]})
    assert not edited.is_error and workbench.state.source.startswith("import torch  # edited\n")
    shown = json.loads((await workbench.execute("read_candidate", {})).content)
    assert shown["source"].splitlines()[0] == "   1| import torch  # edited"


async def test_compile_reports_a_syntax_error_with_its_line(bench):
    workbench, _ = bench
    await workbench.execute("write_candidate", {"source": TRITON.replace("mask = offsets < n", "mask = offsets <")})
    report = json.loads((await workbench.execute("compile", {})).content)
    assert report["ok"] is False and report["errors"][0]["line"] == 10
    assert report["errors"][0]["code"] == "python-syntax"


async def test_compile_wants_model_new(bench):
    workbench, _ = bench
    await workbench.execute("write_candidate", {"source": TRITON.replace("class ModelNew", "class Other")})
    report = json.loads((await workbench.execute("compile", {})).content)
    assert report == {"ok": False, "errors": [{"line": None, "code": "no-model-new",
                                               "message": "ModelNew is not defined"}]}


async def test_verify_skips_the_worker_for_a_file_that_does_not_compile(bench):
    workbench, worker = bench
    await workbench.execute("write_candidate", {"source": "def broken(:\n"})
    result = await workbench.execute("verify", {})
    assert worker.jobs == [] and result.worker_jobs == 0
    assert result.evaluation["compile"]["compiled"] is False and result.evaluation["verdict"] is None
    assert json.loads(result.content)["verdict"] == "compile-error"


async def test_a_candidate_job_is_named_beside_the_original_and_nothing_is_written_there(bench, tmp_path: Path):
    workbench, worker = bench
    before = sorted(p.name for p in tmp_path.iterdir())
    result = await workbench.execute("verify", {})
    job = worker.jobs[0]
    scratch = Path(job.config["origins"][job.config["candidate"]])
    assert scratch.parent == tmp_path and scratch.name.startswith(".relu.kernel-lsp-agent-p1-")
    assert job.source_files[job.config["candidate"]] == TRITON and job.config["reference"] == "ref.py"
    assert worker.files_left == [False] and not scratch.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # and none was left: the job carries the text
    assert result.evaluation["verdict"] == "verified" and result.worker_jobs == 1
    again = await workbench.execute("verify", {})
    assert len(worker.jobs) == 1 and json.loads(again.content)["unchanged"] is True and again.evaluation is None


async def test_profile_runs_once_two_verified_versions_share_their_kernels(bench):
    """The tool list stays the same for the whole pass (a changed list breaks the prompt cache): profile is always
    offered, and until it is ready it answers why and runs nothing."""
    workbench, worker = bench
    listed = [tool["name"] for tool in workbench.tool_definitions()]
    assert "profile" in listed

    async def refused() -> bool:
        before = len(worker.jobs)
        answer = await workbench.execute("profile", {})
        return answer.is_error and "not ready" in answer.content and len(worker.jobs) == before

    assert await refused()
    await workbench.execute("verify", {})
    assert await refused()  # one verified version: its structure may still change
    await workbench.execute("write_candidate", {"source": TRITON.replace("BLOCK=64", "BLOCK=1024")})
    assert await refused()  # the current text is not verified yet
    await workbench.execute("verify", {})
    assert [tool["name"] for tool in workbench.tool_definitions()] == listed
    result = await workbench.execute("profile", {})
    profiled = json.loads(result.content)
    assert profiled["kernels"][0]["name"] == "relu_kernel" and worker.jobs[-1].kind == "profile"
    assert worker.jobs[-1].config["device"] == "cpu"  # the pass's device
    assert profiled["energy"] == result.energy == {"candidate_mj_per_call": 40.0, "reference_mj_per_call": 50.0}
    await workbench.execute("write_candidate", {"source": TRITON.replace("n, BLOCK", "n, other, BLOCK")})
    assert await refused()


async def test_profile_on_a_gpu_classifies_first_then_runs_the_analyses_that_fit_the_bound(tmp_path: Path):
    """Stage 1: the sections that give each kernel's bound; stage 2: those and the memory-bound analyses (the
    recording worker's kernel is memory bound); the answer is stage 2's, and it cost two evaluations."""
    from profilers.ncu import CLASSIFY_SECTIONS, DEFAULT_SECTIONS, SECTIONS_BY_BOUND

    (tmp_path / "ref.py").write_text(REFERENCE)
    worker = RecordingWorker()
    workbench = Workbench(tmp_path / "relu.py", tmp_path / "ref.py", TRITON, Settings(), worker, {"device": "cuda"},
                          "p1")
    await workbench.execute("verify", {})
    await workbench.execute("write_candidate", {"source": TRITON.replace("BLOCK=64", "BLOCK=1024")})
    await workbench.execute("verify", {})
    result = await workbench.execute("profile", {})
    first, second = worker.jobs[-2:]
    assert first.kind == second.kind == "profile" and result.worker_jobs == 2
    assert first.config["sections"] == list(CLASSIFY_SECTIONS)
    assert set(second.config["sections"]) == set(CLASSIFY_SECTIONS) | set(SECTIONS_BY_BOUND["memory"])
    assert len(second.config["sections"]) < len(DEFAULT_SECTIONS)  # no compute or stall analyses
    answer = json.loads(result.content)
    assert answer["stages"] == {"bounds": {"relu_kernel": "memory"}, "sections": second.config["sections"]}
    assert answer["kernels"][0]["bound"] == "memory" and result.energy is not None


def test_the_second_stage_takes_every_fitting_analysis_and_all_of_them_for_an_unknown_bound():
    from profilers.ncu import DEFAULT_SECTIONS, sections_for_bounds

    both = sections_for_bounds({"memory", "compute"})
    assert "MemoryWorkloadAnalysis_Tables" in both and "ComputeWorkloadAnalysis" in both
    assert list(both) == [s for s in DEFAULT_SECTIONS if s in both]  # ncu's order
    assert "MemoryWorkloadAnalysis_Tables" not in sections_for_bounds({"latency"})
    assert sections_for_bounds({"something new"}) == DEFAULT_SECTIONS


def test_kernel_structure_is_the_kernels_names_and_signatures():
    assert kernel_structure(TRITON) == ("def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):",)
    assert kernel_structure(TRITON.replace("BLOCK=64", "BLOCK=8")) == kernel_structure(TRITON)
    cuda = 'from torch.utils.cpp_extension import load_inline\nm = load_inline(name="k", cpp_sources="", ' \
           'cuda_sources="__global__ void k(float* x, int n) { }")\n'
    assert kernel_structure(cuda) == ("__global__ void k(float* x, int n)",)


async def test_unknown_tools_are_refused_by_name(bench):
    workbench, _ = bench
    result = await workbench.execute("rm_rf", {})
    assert result.is_error and "unknown tool 'rm_rf'" in json.loads(result.content)["error"]


async def test_read_node_answers_by_number_and_says_when_there_is_none(bench):
    workbench, _ = bench
    missing = await workbench.execute("read_node", {"node": 0})
    assert missing.is_error and "there is no candidate #0" in missing.content  # no pass to read from
    workbench.node_view = lambda n: {"node": n, "outcome": "verified 2× eager", "source": "a\nb"} if n == 3 else None
    found = json.loads((await workbench.execute("read_node", {"node": 3})).content)
    assert found["lines"] == 2 and found["source"] == "   1| a\n   2| b" and found["outcome"] == "verified 2× eager"
    assert (await workbench.execute("read_node", {"node": "3"})).is_error


async def test_time_quick_is_a_cheap_verify_that_makes_no_node(bench):
    workbench, worker = bench
    result = await workbench.execute("time_quick", {})
    job = worker.jobs[-1]
    assert job.kind == "verify" and result.evaluation is None and result.worker_jobs == 1
    assert (job.config["trials"], job.config["timedCalls"], job.config["warmup"], job.config["baselines"]) == (
        1, 10, 2, ["eager"])
    answer = json.loads(result.content)
    assert answer["ok"] and answer["median_ms"] == 2.0 and answer["speedup_eager"] == 0.5
    assert "not a verification" in answer["note"]
    await workbench.execute("write_candidate", {"source": "def broken(:\n"})
    refused = await workbench.execute("time_quick", {})
    assert refused.is_error and len(worker.jobs) == 1  # a file that does not compile costs no job


async def test_static_facts_asks_the_worker_for_the_static_profile(bench):
    workbench, worker = bench
    result = await workbench.execute("static_facts", {})
    job = worker.jobs[-1]
    assert job.kind == "profile" and job.config["device"] == "cpu" and result.worker_jobs == 1
    answer = json.loads(result.content)
    assert answer["ok"] and answer["kernels"][0]["name"] == "relu_kernel" and answer["problems"] == []
    sass = SassSummary(arch="sm_90", instructions=100, global_loads={}, global_stores={}, local_loads=3,
                       local_stores=0, shared_loads=0, shared_stores=0, tensor_core={}, fma=0, loops=1, line_info=True)
    kernel = KernelProfile(kernel="k", name="k", id=0, bound=None, registers=40, sass=sass, line=12,
                           metrics=KernelMetrics(ptxas=PtxasFigures("sm_90", 40, 0, 8, 0, 0, 0)),
                           findings=[ProfileHint("hint-local-memory", "information", "spills", 0.2, None, line=14)])
    static = ProfileReport(source="static", gpu=None, ceilings=None, kernels=[kernel], reference_kernels=[],
                           problems=[ON_CPU, ProfileProblem("profile-no-sass", "no SASS for cuda.cu")])
    shown = static_feedback(static)
    assert shown["kernels"][0]["ptxas"]["spill_stores"] == 8 and shown["kernels"][0]["hints"][0]["line"] == 14
    assert shown["problems"] == ["no SASS for cuda.cu"]  # the device note the tool asked for is no news


async def test_compile_makes_one_call_of_a_triton_candidate_to_catch_first_call_errors(bench):
    """Triton compiles a kernel at its first call: a tl.arange of 100 passes the syntax check and fails there."""
    workbench, worker = bench

    async def first_call_fails(job, progress=None, timeout_s=None):
        worker.jobs.append(job)
        crash = Finding(job.config["origins"][job.config["candidate"]], Range.line(10), Severity.ERROR, "kernel-lsp",
                        "run-python-exception", "CompilationError: arange's range must be a power of 2")
        return Result("ok", [crash.to_dict()], {"verdict": "rejected", "summary": "rejected: run-python-exception"})

    fine = json.loads((await workbench.execute("compile", {})).content)
    job = worker.jobs[-1]
    assert fine["ok"] and fine["first_call"].startswith("ran") and job.kind == "verify"
    assert (job.config["trials"], job.config["timing"], job.config["baselines"]) == (1, False, [])
    worker.run = first_call_fails
    result = await workbench.execute("compile", {})
    failed = json.loads(result.content)
    assert not failed["ok"] and failed["first_call"] == "failed" and result.worker_jobs == 1
    assert failed["errors"] == [{"line": 11, "code": "run-python-exception",
                                 "message": "CompilationError: arange's range must be a power of 2"}]


async def test_probe_runs_the_candidate_on_the_models_inputs_and_shows_the_mismatch_and_its_prints(tmp_path: Path,
                                                                                                  monkeypatch):
    """A real local worker on the CPU: the reference's get_inputs replaced (in the job only) by the model's
    expression; a wrong kernel's mismatch names the values; what the candidate printed comes back."""
    from kernel_lsp.worker.client import WorkerClient

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    (tmp_path / "ref.py").write_text(REFERENCE)
    wrong = triton_relu(4096).replace("tl.maximum(x, 0.0)", "x * 3.0").replace(
        "        return out", "        print('probe saw', x.tolist()[:4], '->', out.tolist()[:4])\n        return out")
    workbench = Workbench(tmp_path / "relu.py", tmp_path / "ref.py", wrong, Settings(), WorkerClient(),
                          {"device": "cpu"}, "p1")
    try:
        result = await workbench.execute("probe", {"inputs": "[torch.tensor([-1.0, 2.0, -3.0, 4.0])]"})
        answer = json.loads(result.content)
        assert result.worker_jobs == 1 and result.evaluation is None, answer
        assert answer["ok"] and answer["outputs_match"] is False, answer
        assert "probe saw [-1.0, 2.0, -3.0, 4.0] -> [-3.0, 6.0, -9.0, 12.0]" in answer["printed"], answer
        assert any("mismatch" in p["code"] or "expected" in p["message"] for p in answer["problems"]), answer
        assert (tmp_path / "ref.py").read_text() == REFERENCE  # the reference on disk is untouched

        await workbench.execute("write_candidate", {"source": triton_relu(4096)})
        honest = json.loads((await workbench.execute("probe", {"inputs": "[torch.arange(8.0) - 4]"})).content)
        assert honest["ok"] and honest["outputs_match"] is True and honest["problems"] == [], honest

        refused = await workbench.execute("probe", {"inputs": "[torch.randn(4"})
        assert refused.is_error and "not a Python expression" in refused.content
        assert (await workbench.execute("probe", {})).is_error
    finally:
        await workbench.worker.close()


async def test_search_cutlass_is_offered_for_cute_targets_and_answers_snippets_with_paths(bench, monkeypatch):
    import importlib.util

    from kernel_lsp.compile import toolchain

    workbench, worker = bench
    names = lambda: [tool["name"] for tool in workbench.tool_definitions()]  # noqa: E731
    assert "search_cutlass" not in names()  # the auto target: the candidate's own language
    workbench.target = "cute"
    assert "search_cutlass" in names()
    assert (await workbench.execute("search_cutlass", {"query": " "})).is_error
    if importlib.util.find_spec("cutlass_library") is not None:
        result = await workbench.execute("search_cutlass", {"query": "make_tiled_mma SM90 GMMA"})
        answer = json.loads(result.content)
        assert not result.is_error and result.worker_jobs == 0 and worker.jobs == []  # runs here
        assert 1 <= len(answer["snippets"]) <= 5
        top = answer["snippets"][0]
        assert "make_tiled_mma" in top["text"] and f"{top['line']:5d}| " in top["text"]
        assert top["path"].startswith(("include/", "examples/"))
    monkeypatch.setattr(toolchain, "_cutlass_package_include", lambda: None)
    monkeypatch.delenv("CUTLASS_PATH", raising=False)
    missing = await workbench.execute("search_cutlass", {"query": "tma"})
    assert missing.is_error and "pip install 'kernel-lsp[cutlass]'" in missing.content


def test_the_system_prompt_names_the_target_language(bench, tmp_path: Path):
    from kernel_lsp.agent.budget import Budget
    from kernel_lsp.agent.loop import LANGUAGE_RULES, Optimizer
    from kernel_lsp.agent.trajectory import TrajectoryWriter
    from kernel_lsp.compile.toolchain import cutlass_headers

    workbench, _ = bench
    optimizer = Optimizer(None, workbench, Budget(), TrajectoryWriter(tmp_path / "t"), "cuda")
    assert LANGUAGE_RULES["auto"] in optimizer.system_prompt()
    workbench.target = "triton"
    assert "written in Triton" in optimizer.system_prompt()
    workbench.target = "cute"
    prompt = optimizer.system_prompt()
    assert "#include <cute/tensor.hpp>" in prompt and "search_cutlass" in prompt
    headers = cutlass_headers("")
    assert (repr(headers.include) in prompt) if headers else "pip install 'kernel-lsp[cutlass]'" in prompt


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("nvidia_cutlass_dsl") is None,
                    reason="the CuTe DSL is not installed (pip install 'kernel-lsp[cute-dsl]')")
async def test_compile_of_a_cute_dsl_candidate_compiles_it_on_the_worker_without_a_gpu(tmp_path: Path):
    """The DSL compiles at a @cute.jit function's first call: the compile tool has the worker compile it (never
    launched), so a wrong layout is a compile error on its line and a good kernel comes back with its figures."""
    from kernel_lsp.worker.client import WorkerClient
    from tests.worker.test_cute_dsl_check import ADD, INDEX_LINE, REFERENCE as DSL_REFERENCE, with_line_after_index

    (tmp_path / "add_ref.py").write_text(DSL_REFERENCE)
    broken = with_line_after_index("    bad = cute.make_layout((4, 8), stride=(8, 1, 2))")
    workbench = Workbench(tmp_path / "add.py", tmp_path / "add_ref.py", broken, Settings(), WorkerClient(),
                          {"device": "cpu"}, "p1")
    try:
        result = await workbench.execute("compile", {})
        failed = json.loads(result.content)
        assert result.worker_jobs == 1 and not failed["ok"], failed
        [error] = failed["errors"]
        assert error["line"] == INDEX_LINE + 2 and error["code"] == "cute-dsl-error" and "congruent" in error["message"]
        await workbench.execute("write_candidate", {"source": ADD})
        fine = json.loads((await workbench.execute("compile", {})).content)
        assert fine["ok"] and fine["dsl"].endswith("1 kernel(s) compiled"), fine
        [kernel] = fine["kernels"]
        assert kernel["kernel"] == "add_kernel" and "registers" in kernel["figures"]
    finally:
        await workbench.worker.close()
