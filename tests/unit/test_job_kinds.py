"""The job kinds' shared parts (kernel_lsp/kinds): typed options with one set of defaults, the files a job carries
(from disk or from texts that were never saved), the typed outcome, and the handlers' answer to bad options."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from kernel_lsp.config import Settings, resolve_settings
from kernel_lsp.findings import Finding, Range, Severity
from kernel_lsp.kinds import profile, verify
from kernel_lsp.jobs.files import gather_files
from kernel_lsp.contracts.options import ProfileOptions, VerifyOptions, from_config, to_config
from kernel_lsp.worker.protocol import Job, Result

LOADER = ("import torch\nimport helpers\nfrom torch.utils.cpp_extension import load\n"
          "ext = load(name='relu', sources=['csrc/relu.cu'])\nclass ModelNew(torch.nn.Module):\n"
          "    def forward(self, x):\n        return ext.relu(x) * helpers.SCALE\n")
REFERENCE = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def test_the_settings_take_their_verify_defaults_from_the_verify_options():
    defaults, settings = VerifyOptions(), Settings()
    v = settings.verify
    assert (v.device, v.trials, v.timed_calls, v.warmup_calls) == (
        defaults.device, defaults.trials, defaults.timed_calls, defaults.warmup)
    assert (v.baselines, v.allowed_kernels, v.allow_network) == (
        defaults.baselines, defaults.allowed_kernels, defaults.allow_network)
    assert verify.verify_options(settings) == defaults  # the settings' names map to the options' in one place
    changed, problems = resolve_settings({"trials": 2, "timedCalls": 7, "warmupCalls": 1, "verifyDevice": "cpu",
                                          "verifyAllowNetwork": True})
    assert not problems
    options = verify.verify_options(changed, baselines=("eager",))
    assert (options.trials, options.timed_calls, options.warmup, options.device, options.allow_network,
            options.baselines) == (2, 7, 1, "cpu", True, ("eager",))


def test_options_travel_as_camel_case_config_and_come_back_equal():
    options = VerifyOptions(device="cpu", trials=3, timed_calls=9, baselines=("eager",), allowed_kernels=("*gemm*",),
                            tolerances={"float16": {"atol": 0.01, "rtol": 0.01}}, limits={"wallTimeS": 60})
    config = to_config(options)
    assert config["timedCalls"] == 9 and config["allowedKernels"] == ["*gemm*"] and config["allowNetwork"] is False
    assert from_config(VerifyOptions, config) == options
    assert from_config(ProfileOptions, to_config(ProfileOptions(kernels=("k",), launch_count=2))) == ProfileOptions(
        kernels=("k",), launch_count=2)


@pytest.mark.parametrize(("config", "message"), [
    ({"timed_calls": 5}, "unknown verify options: timed_calls"),
    ({"trials": "5"}, "trials: expected a non-negative whole number"),
    ({"trials": True}, "trials: expected a non-negative whole number"),
    ({"trials": 0}, "trials: must be at least 1"),
    ({"device": "tpu"}, "device: expected one of auto, cuda, cpu"),
    ({"baselines": ["eager", "jit"]}, "baselines: expected some of eager, compile"),
    ({"allowNetwork": "yes"}, "allowNetwork: expected true or false"),
    ({"limits": {"wallTime": 5}}, "limits: unknown keys wallTime"),
])
def test_bad_verify_options_are_refused_by_name(config: dict, message: str):
    with pytest.raises(ValueError, match=message):
        from_config(VerifyOptions, config)


def test_every_wrong_value_is_named_in_one_message():
    with pytest.raises(ValueError) as raised:
        from_config(VerifyOptions, {"trials": "5", "allowNetwork": "yes", "baselines": "eager", "timedCalls": 2.5,
                                    "tolerances": [1]})
    message = str(raised.value)
    for part in ("trials: expected a non-negative whole number, got '5'", "allowNetwork: expected true or false",
                 "baselines: expected a list of strings, got 'eager'", "timedCalls: expected a non-negative whole",
                 "tolerances: expected an object"):
        assert part in message, message
    assert from_config(VerifyOptions, {"hangTimeoutS": 5}).hang_timeout_s == 5  # a whole number is a number


def test_a_job_built_from_texts_never_saved_carries_the_same_files_as_one_built_from_disk(tmp_path: Path):
    """The agent's candidates and the editor's unsaved buffers: modules, loaded sources and their headers are
    found in the texts first, then on disk."""
    on_disk = tmp_path / "disk"
    (on_disk / "csrc").mkdir(parents=True)
    (on_disk / "ref.py").write_text(REFERENCE)
    (on_disk / "helpers.py").write_text("SCALE = 1\n")
    (on_disk / "csrc" / "relu.cu").write_text('#include "relu.cuh"\n__global__ void relu() {}\n')
    (on_disk / "csrc" / "relu.cuh").write_text("#pragma once\n")
    (on_disk / "cand.py").write_text(LOADER)
    saved = gather_files(on_disk / "cand.py", on_disk / "ref.py")
    assert set(saved.texts) == {"cand.py", "ref.py", "helpers.py", "csrc/relu.cu", "csrc/relu.cuh"}

    in_memory = tmp_path / "memory"
    in_memory.mkdir()
    (in_memory / "ref.py").write_text(REFERENCE)
    texts = {in_memory / "cand.py": LOADER, in_memory / "helpers.py": "SCALE = 2\n",
             in_memory / "csrc" / "relu.cu": '#include "relu.cuh"\n', in_memory / "csrc" / "relu.cuh": "// h\n"}
    unsaved = gather_files(in_memory / "cand.py", in_memory / "ref.py", texts)
    assert set(unsaved.texts) == set(saved.texts)
    assert unsaved.texts["helpers.py"] == "SCALE = 2\n" and unsaved.texts["csrc/relu.cuh"] == "// h\n"
    assert sorted(p.name for p in in_memory.iterdir()) == ["ref.py"]  # nothing was written

    # an unsaved buffer wins over the file on disk
    edited = gather_files(on_disk / "cand.py", on_disk / "ref.py", {on_disk / "helpers.py": "SCALE = 3\n"})
    assert edited.texts["helpers.py"] == "SCALE = 3\n" and (on_disk / "helpers.py").read_text() == "SCALE = 1\n"


def test_the_profile_job_carries_what_the_verify_job_carries(tmp_path: Path):
    """A candidate that imports a helper module, or builds a source that includes a header, is profiled with them
    (the two jobs' files once drifted apart: the profile job lacked both)."""
    (tmp_path / "csrc").mkdir()
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "helpers.py").write_text("SCALE = 1\n")
    (tmp_path / "csrc" / "relu.cu").write_text('#include "relu.cuh"\n')
    (tmp_path / "csrc" / "relu.cuh").write_text("#pragma once\n")
    (tmp_path / "cand.py").write_text(LOADER)
    verify_job = verify.verify_job(tmp_path / "cand.py", tmp_path / "ref.py", VerifyOptions())
    profile_job = profile.profile_job(tmp_path / "cand.py", tmp_path / "ref.py", ProfileOptions())
    assert profile_job.source_files == verify_job.source_files
    assert profile_job.config["origins"] == verify_job.config["origins"]
    assert "helpers.py" in profile_job.source_files and "csrc/relu.cuh" in profile_job.source_files


def test_the_handlers_answer_bad_options_with_a_failed_result_naming_them():
    bad = Job("verify", {"c.py": ""}, {"candidate": "c.py", "reference": "c.py", "origins": {}, "trials": "many"}, "k")
    result = asyncio.run(verify.handle(bad, context=None))  # refused before the context is touched
    assert result.status == "failed" and "trials: expected a non-negative whole number" in result.error
    odd = Job("profile", {"c.py": ""}, {"candidate": "c.py", "origins": {}, "seeds": [1]}, "k")
    result = asyncio.run(profile.handle(odd, context=None))
    assert result.status == "failed" and "unknown profile options: seeds" in result.error


def test_a_verify_outcome_reads_each_way_a_job_can_end():
    finding = Finding("file:///c.py", Range.line(3), Severity.ERROR, "kernel-lsp", "verify-mismatch", "worst:  a\n b")
    rejected = verify.VerifyOutcome.of(Result("ok", [finding.to_dict()], {"verdict": "rejected", "summary": "s"}))
    assert (rejected.verdict, rejected.summary, rejected.finished) == ("rejected", "s", True)
    assert rejected.findings == [finding] and rejected.reason() == "verify-mismatch: worst: a b"
    lost = verify.VerifyOutcome.of(Result("timeout", [], {}, {}, "no answer in 600 s"))
    assert (lost.verdict, lost.finished, lost.summary) == ("unavailable", False, "job timeout: no answer in 600 s")
    assert lost.reason() == lost.summary
    odd = verify.VerifyOutcome.of(Result("ok", [], {"verdict": "great"}))
    assert odd.verdict == "unavailable" and odd.report is None


def test_a_profile_outcome_keeps_what_it_reads_of_a_report_in_another_form():
    partial = {"kernels": [{"name": "k"}], "problems": []}  # no source: a worker of another version
    outcome = profile.ProfileOutcome.of(Result("ok", [], {"profile": partial}))
    assert outcome.report is not None and outcome.error is None and outcome.report.kernels == []
    (broken,) = outcome.report.problems  # said, not raised: the reader goes on
    assert broken.code == "profile-contract" and ".source: missing" in broken.message
    assert ".kernels[0].kernel: missing" in broken.message and "another version" in outcome.summary
    failed = profile.ProfileOutcome.of(Result("failed", [], {}, {}, "ncu crashed"))
    assert failed.report is None and failed.error == "the profile job failed: ncu crashed"


def test_options_are_frozen_and_replace_checks_again():
    options = VerifyOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.trials = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="trials"):
        dataclasses.replace(options, trials=-1)


def test_a_new_kinds_options_travel_the_same_way():
    """A kind added later defines its options in its own module; from_config and to_config carry them too."""

    @dataclasses.dataclass(frozen=True)
    class SanitizeOptions:
        tool: str = "memcheck"
        kernels: tuple[str, ...] = ()

    options = from_config(SanitizeOptions, {"tool": "racecheck", "kernels": ["k"]})
    assert options == SanitizeOptions("racecheck", ("k",)) and to_config(options) == {"tool": "racecheck",
                                                                                      "kernels": ["k"]}
    with pytest.raises(ValueError, match="unknown sanitize options: launchCount"):
        from_config(SanitizeOptions, {"launchCount": 1})
