"""The candidate's process's replies to the judge (contracts/candidate_replies.py): written once by the side under the
keys they always had, decoded strictly where they arrive, and a forged one is the candidate's failure of that request,
never the judge's."""

from __future__ import annotations

import os
import struct

import msgpack
import pytest

from kernel_lsp.candidate.handle import CandidateFailed, CandidateProcess, decoded_reply
from kernel_lsp.contracts.candidate_replies import (
    AblationReply,
    AgainReply,
    ErrorReply,
    ForwardReply,
    KeptOutput,
    LoadReply,
    ProcessReport,
    RecordedCall,
    RecordedWindow,
    Recording,
    RunFailure,
    SettleReply,
    TimedReport,
    frame,
)
from kernel_lsp.contracts.codec import decode, encode
from kernel_lsp.process.failures import failure_parts
from kernel_lsp.verify.checks import reported_window

OUTPUT = {"tensor": {"dtype": "float32", "shape": [2]}}  # an output's descriptor: the exchange's, carried as is

# each reply as the side wrote it before it was typed: the same keys, the same values
WIRES = [
    (LoadReply("no weights", {"candidate: import": 0.5}), {"weights": "no weights", "seconds": {"candidate: import": 0.5}}),
    (ProcessReport(["time.perf_counter"], [], ["hidden"]),
     {"timers": ["time.perf_counter"], "torch": [], "threads": ["hidden"]}),
    (Recording("profiler", None, [RecordedWindow([("relu_kernel", 7, "profiler", 0.001)], 7, 0.5)]),
     {"how": "profiler", "reason": None,
      "windows": [{"launches": [["relu_kernel", 7, "profiler", 0.001]], "current_stream": 7, "seconds": 0.5}]}),
    (TimedReport([KeptOutput(0, 3, OUTPUT, True)], [RecordedCall(-1, "none", "no profiler", [], None)], True),
     {"kept": [{"set": 0, "call": 3, "output": OUTPUT, "plain": True}],
      "recorded": [{"call": -1, "how": "none", "reason": "no profiler", "launches": [], "current_stream": None}],
      "reused_output": True}),
    (ForwardReply(OUTPUT, True, [], {"candidate: forward": 0.25}, None, 0),
     {"output": OUTPUT, "plain": True, "threads": [], "seconds": {"candidate: forward": 0.25}, "shared_fill": None,
      "poisoned_bytes": 0}),
    (AgainReply(OUTPUT, False, True), {"output": OUTPUT, "reused": True, "plain": False}),
    (AblationReply(False, {"nan": True, "finite": False}, 2, 1, ["relu_kernel"], ["aten::clamp"]),
     {"changed": False, "changed_by": {"nan": True, "finite": False}, "launches": 2, "destroyed": 1,
      "names": ["relu_kernel"], "stock": ["aten::clamp"]}),
    (SettleReply(), {}),
    (SettleReply(OUTPUT), {"output": OUTPUT}),
    (ErrorReply(RunFailure("python-exception", "ValueError: no", "ValueError", [("cand.py", 3, "forward", "x")])),
     {"error": {"status": "python-exception", "message": "ValueError: no", "error_type": "ValueError",
                "frames": [["cand.py", 3, "forward", "x"]]}}),
]


@pytest.mark.parametrize(("reply", "wire"), WIRES, ids=[type(reply).__name__ for reply, _ in WIRES])
def test_each_reply_crosses_under_the_keys_it_always_had(reply, wire):
    sent = msgpack.unpackb(msgpack.packb(frame(reply)), raw=False)  # as the pipe carries it
    assert sent == wire and encode(reply) == wire
    assert decode(type(reply), sent) == reply


def test_the_cuda_fields_are_optional_with_the_defaults_they_had():
    reply = decode(ForwardReply, {"output": OUTPUT, "plain": True, "threads": []})
    assert (reply.seconds, reply.shared_fill, reply.poisoned_bytes) == ({}, None, None)
    assert decode(AgainReply, {"output": OUTPUT, "plain": True}).reused is False
    assert decode(TimedReport, {"kept": [], "recorded": []}).reused_output is False


@pytest.mark.parametrize(("cls", "op", "forged", "named"), [
    (ProcessReport, "report", {"timers": "none", "torch": [], "threads": []}, ".timers: expected an array"),
    (ProcessReport, "report", {"timers": [], "torch": []}, ".threads: missing"),
    (ForwardReply, "forward", {"output": OUTPUT, "plain": 1, "threads": [], "verdict": "verified"},
     ".plain: expected bool, got int 1; report: unknown key(s) ['verdict']"),
    (TimedReport, "timed_report", {"kept": [{"set": "0", "call": 1, "output": OUTPUT, "plain": True}],
                                   "recorded": []}, ".kept[0].set: expected int"),
    (Recording, "record", {"how": "profiler", "reason": None, "windows": [{"launches": [["k", 7, "profiler"]]}]},
     ".windows[0].launches[0]: expected 4 items, got 3"),
    (SettleReply, "settle", ["output"], "expected a mapping"),
])
def test_a_reply_that_breaks_its_contract_is_the_candidates_failure(cls, op, forged, named):
    with pytest.raises(CandidateFailed) as failed:
        decoded_reply(cls, op, forged)
    failure = failed.value.sandbox_failure
    assert (failure.status, failure.error_type) == ("python-exception", "ContractError")
    assert failure.message.startswith(f"the candidate's process answered {op!r} against its contract ({cls.__name__}")
    assert named in failure.message, failure.message


def _asked_with(written: bytes) -> CandidateFailed:
    """What CandidateProcess.ask makes of `written` on the reply pipe (no process: the pipe alone)."""
    process = object.__new__(CandidateProcess)
    process.confinement, process.wall_s = {}, {}
    drained, process._requests = os.pipe()
    process._replies, reply_end = os.pipe()
    os.write(reply_end, written)
    try:
        with pytest.raises(CandidateFailed) as failed:
            process.ask("report")
    finally:
        for fd in (drained, process._requests, process._replies, reply_end):
            os.close(fd)
    return failed.value


def _framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(("written", "named"), [
    (_framed(msgpack.packb({"error": {"status": "ok", "message": "nothing failed"}})),
     "ErrorReply: .error.status: ok not in"),
    (_framed(msgpack.packb({"error": "boom"})), "ErrorReply: .error: expected an object"),
    (_framed(msgpack.packb([1, 2])), "expected a map, got list"),
    (_framed(b"\xc1\xc1"), "not a msgpack frame"),
], ids=["error-ok", "error-text", "not-a-map", "not-msgpack"])
def test_a_forged_frame_on_the_reply_pipe_fails_the_candidate_never_the_judge(written, named):
    failure = _asked_with(written).sandbox_failure
    assert failure.status == "python-exception" and named in failure.message, failure.message


def test_a_request_that_raised_is_reported_as_the_side_described_it():
    try:
        raise MemoryError("cannot allocate memory")
    except MemoryError as error:
        said = failure_parts(error)
    failed = _asked_with(_framed(msgpack.packb(frame(ErrorReply(said)))))
    assert failed.sandbox_failure == said and failed.sandbox_failure.status == "out-of-memory"
    assert str(failed) == said.message


def test_a_recorded_window_keeps_only_plausible_durations():
    window = reported_window([("k", 7, "profiler", -1.0), ("j", None, "triton-launcher", 0.5)], 7, float("inf"))
    assert [(k.name, k.stream, k.seconds) for k in window.launches] == [("k", 7, None), ("j", None, 0.5)]
    assert (window.current_stream, window.seconds) == (7, None)
    assert reported_window([("k", None, "profiler")], None).launches[0].seconds is None
