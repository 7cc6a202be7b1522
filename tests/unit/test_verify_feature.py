"""The verification feature's pure parts: the job built from settings, the lens title in each state."""

from __future__ import annotations

from pathlib import Path

from kernel_lsp.config import resolve_settings
from kernel_lsp.server.verify_feature import RUNNING, STALE, VerifyRun, candidate_job, lens_title, outcome_of
from kernel_lsp.verify.pairing import Pairing
from kernel_lsp.worker.protocol import Result

MODEL = "class Model:\n    def forward(self, x):\n        return x\n"
LOADER = ("from torch.utils.cpp_extension import load\n"
          "ext = load(name='relu', sources=['kernels/relu.cu'])\n"
          "class ModelNew:\n    def forward(self, x):\n        return ext.relu(x)\n")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_job_options_follow_the_settings(tmp_path: Path):
    both = write(tmp_path / "both.py", MODEL + "class ModelNew(Model):\n    pass\n")
    settings, problems = resolve_settings({"verifyDevice": "cpu", "trials": 2, "timedCalls": 5, "warmupCalls": 1,
                                           "baselines": ["eager"], "allowedKernels": ["*gemm*"],
                                           "tolerances": {"float16": {"atol": 0.02, "rtol": 0.02}}})
    assert not problems
    job = candidate_job(Pairing(both, both, "same-file", ""), settings)
    assert job.kind == "verify"
    assert {k: job.config[k] for k in ("device", "trials", "timedCalls", "warmup", "baselines", "allowedKernels",
                                       "tolerances")} == {
        "device": "cpu", "trials": 2, "timedCalls": 5, "warmup": 1, "baselines": ["eager"],
        "allowedKernels": ["*gemm*"], "tolerances": {"float16": {"atol": 0.02, "rtol": 0.02}}}
    assert list(job.source_files) == ["both.py"]
    assert job.config["candidate"] == job.config["reference"] == "both.py"
    defaults = candidate_job(Pairing(both, both, "same-file", ""), resolve_settings()[0]).config
    assert (defaults["device"], defaults["trials"], defaults["timedCalls"], defaults["warmup"]) == ("auto", 5, 100, 10)
    assert defaults["baselines"] == ["eager", "compile"]


def test_job_carries_reference_from_elsewhere_and_loaded_sources(tmp_path: Path):
    reference = write(tmp_path / "problems" / "relu.py", MODEL)
    candidate = write(tmp_path / "work" / "relu_new.py", LOADER)
    cuda = write(tmp_path / "work" / "kernels" / "relu.cu", "// the kernel\n")
    job = candidate_job(Pairing(candidate, reference, "header", ""), resolve_settings()[0])
    assert job.source_files == {"relu_new.py": LOADER, "reference/relu.py": MODEL, "kernels/relu.cu": "// the kernel\n"}
    assert job.config["candidate"] == "relu_new.py" and job.config["reference"] == "reference/relu.py"
    assert job.config["origins"] == {"relu_new.py": str(candidate.resolve()),
                                     "reference/relu.py": str(reference.resolve()),
                                     "kernels/relu.cu": str(cuda.resolve())}


def test_lens_titles_for_each_state():
    ref = Path("/w/relu.py")
    assert lens_title(VerifyRun("idle", ref), "x") == "verify against relu.py"
    assert lens_title(VerifyRun("running", ref, "x"), "y") == RUNNING == "verifying…"
    summary = "correct 2/2 · 1.84× eager · 3.1 ms"
    assert lens_title(VerifyRun("done", ref, "x", summary=summary), "x") == summary
    assert lens_title(VerifyRun("done", ref, "x", summary=summary), None) == summary  # closed: disk is what ran
    assert lens_title(VerifyRun("done", ref, "x", summary=summary), "x2") == summary + STALE
    assert STALE == " (before your last edit)"
    assert lens_title(VerifyRun("done", ref, "x", summary="rejected: mismatch"), "x") == "rejected: mismatch"
    unavailable = VerifyRun("unavailable", ref, "x", message="kernel-lsp: the GPU worker (tcp:h:1) is unavailable: "
                                                            "refused\nmore detail")
    assert lens_title(unavailable, "x") == "not verified: the GPU worker (tcp:h:1) is unavailable: refused"
    long = lens_title(VerifyRun("unavailable", ref, "x", message="m" * 500), "x")
    assert len(long) < 120 and long.endswith("…")


def test_outcomes_of_results():
    finding = {"uri": "file:///w/a.py", "range": [3, 4, 3, 11], "severity": 1, "source": "kernel-lsp",
               "code": "verify-mismatch", "message": "max abs error 0.5", "related": [], "data": None}
    state, summary, findings = outcome_of(Result("ok", [finding], {"verdict": "rejected",
                                                                   "summary": "rejected: mismatch 1/2"}))
    assert (state, summary, [f.code for f in findings]) == ("done", "rejected: mismatch 1/2", ["verify-mismatch"])
    assert outcome_of(Result("ok", [], {"verdict": "verified"}))[1] == "verified"
    state, message, findings = outcome_of(Result("timeout", error="ran past 600 s"))
    assert state == "unavailable" and findings == []
    assert message == "verification did not finish (timeout): ran past 600 s"
