"""VerifyFeature.result_summary: what the profile hover shows of a candidate's last verification (typed, instead of
reading the verify lens's title)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernel_lsp.contracts.profile_report import EnergyReading, ProfileReport
from kernel_lsp.server.verify_feature import STALE, VerifyFeature, VerifyRun

URI = "file:///w/candidate.py"


@dataclass
class Document:
    uri: str
    source: str
    version: int = 1


def profiled(mj_per_call: float | None, reference_mj_per_call: float | None = None) -> ProfileReport:
    """A profile's report with the energies it read (None: none)."""
    def reading(mj: float | None) -> EnergyReading | None:
        return EnergyReading(mj_per_call=mj, calls=10, seconds=1.0, how="NVML") if mj is not None else None
    return ProfileReport(source="ncu", gpu=None, ceilings=None, kernels=[], reference_kernels=[], problems=[],
                         energy=reading(mj_per_call), reference_energy=reading(reference_mj_per_call))


def feature(documents: dict, lens_notes=lambda _uri, _text: []) -> VerifyFeature:
    return VerifyFeature(None, None, None, documents=lambda: documents, progress=None,
                         supports_progress=lambda: False, tell_user=lambda _m: None, refresh_lenses=lambda: None,
                         lens_notes=lens_notes)


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


def test_the_verify_lens_shows_the_energy_a_profile_of_the_same_text_read(tmp_path: Path) -> None:
    """ProfileFeature keeps the energy per call of the last profile (NVML, on a GPU) with the text it profiled;
    the verify lens shows it after a result for that same text, and drops it once the text changes."""
    from kernel_lsp.server.profile_feature import ProfileFeature

    documents = {URI: Document(URI, "text")}
    profiles = []  # the server asks each feature for its lens note; here the one profile feature
    verify = feature(documents, lens_notes=lambda uri, text: [n for n in (p.lens_note(uri, text) for p in profiles) if n])
    refreshed = []
    profile = ProfileFeature(None, None, None, documents=lambda: documents, progress=None, tell_user=lambda _m: None,
                             verify_summary=verify.result_summary, chart_dir=tmp_path,
                             refresh_lenses=lambda: refreshed.append(True))
    profiles.append(profile)
    verify._runs[URI] = VerifyRun("done", Path("/w/ref.py"), "text", summary="correct 5/5 · 1.84× eager")
    titles = lambda: [lens.command.title for lens in verify.code_lenses(URI)]  # noqa: E731
    assert titles() == ["correct 5/5 · 1.84× eager"]  # no profile yet

    profile._keep_energy(URI, profiled(41.23, 50.9), "text")
    assert refreshed == [True]
    assert titles() == ["correct 5/5 · 1.84× eager · 41.2 mJ/call (0.81× the reference's)"]
    profile._keep_energy(URI, profiled(None), "text")  # the CPU: no energy
    assert titles() == ["correct 5/5 · 1.84× eager · 41.2 mJ/call (0.81× the reference's)"]  # the last reading stays

    documents[URI] = Document(URI, "edited")
    assert titles() == ["correct 5/5 · 1.84× eager" + STALE]  # neither the result nor the energy is for this text
    verify._runs[URI] = VerifyRun("done", Path("/w/ref.py"), "edited", summary="correct 5/5 · 2.0× eager")
    assert titles() == ["correct 5/5 · 2.0× eager"]  # the energy was read for the old text
    verify._runs[URI] = VerifyRun("unavailable", Path("/w/ref.py"), "edited", message="no worker")
    assert profile.lens_note(URI, "text") is not None and "mJ" not in titles()[0]
