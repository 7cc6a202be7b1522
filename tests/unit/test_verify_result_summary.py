"""VerifyFeature.result_summary: what the profile hover shows of a candidate's last verification (typed, instead of
reading the verify lens's title)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernel_lsp.server.verify_feature import STALE, VerifyFeature, VerifyRun

URI = "file:///w/candidate.py"


@dataclass
class Document:
    uri: str
    source: str
    version: int = 1


def feature(documents: dict) -> VerifyFeature:
    return VerifyFeature(None, None, None, documents=lambda: documents, progress=None,
                         supports_progress=lambda: False, tell_user=lambda _m: None, refresh_lenses=lambda: None)


def test_only_a_finished_verification_has_a_summary() -> None:
    verify = feature({URI: Document(URI, "text")})
    assert verify.result_summary(URI) is None  # never verified
    reference = Path("/w/ref.py")
    for state in ("idle", "running"):
        verify._runs[URI] = VerifyRun(state, reference)
        assert verify.result_summary(URI) is None
    verify._runs[URI] = VerifyRun("done", reference, "text", summary="correct 5/5 · 1.84× eager")
    assert verify.result_summary(URI) == "correct 5/5 · 1.84× eager"
    verify._runs[URI] = VerifyRun("unavailable", reference, "text", message="kernel-lsp: no worker\nmore")
    assert verify.result_summary(URI) == "not verified: no worker"


def test_a_result_for_text_edited_since_says_so() -> None:
    verify = feature({URI: Document(URI, "edited")})
    verify._runs[URI] = VerifyRun("done", Path("/w/ref.py"), "text", summary="correct 5/5")
    assert verify.result_summary(URI) == "correct 5/5" + STALE
    closed = feature({})  # a closed candidate: no text to compare, the summary as it was
    closed._runs[URI] = VerifyRun("done", Path("/w/ref.py"), "text", summary="correct 5/5")
    assert closed.result_summary(URI) == "correct 5/5"
