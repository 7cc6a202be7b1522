"""`kernel-lsp verify FILE` given a file it cannot pair: each is told what it is, not a remedy for another file."""

from __future__ import annotations

from pathlib import Path

from kernel_lsp.cli import main
from tests.lsp.test_verify_feature import REFERENCE, TRITON_CANDIDATE


def test_a_reference_passed_as_the_candidate_is_told_it_is_a_reference(tmp_path: Path, capsys):
    """A reference defines Model already: it lacks ModelNew, so "define Model" would send the user the wrong way."""
    (tmp_path / "relu.py").write_text(REFERENCE)
    assert main(["verify", str(tmp_path / "relu.py")]) == 2
    err = capsys.readouterr().err
    assert "is a reference (Model, and no ModelNew to verify)" in err and "define Model" not in err, err
    assert f"--reference {tmp_path / 'relu.py'}" in err


def test_a_candidate_without_a_reference_is_told_how_to_name_one(tmp_path: Path, capsys):
    (tmp_path / "alone.py").write_text(TRITON_CANDIDATE.replace("# kernel-lsp: reference=relu.py\n", ""))
    assert main(["verify", str(tmp_path / "alone.py")]) == 2
    assert "no reference for" in capsys.readouterr().err
