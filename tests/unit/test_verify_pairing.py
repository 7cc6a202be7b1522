"""Pairing a candidate with its reference: header, settings, same file, KernelBench; re-verify on save."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.config import resolve_settings
from kernel_lsp.verify.pairing import (
    Pairing,
    ReferenceProblem,
    files_to_reverify,
    find_reference,
)

from tests.paths import KERNELBENCH
needs_kernelbench = pytest.mark.skipif(not KERNELBENCH.is_dir(), reason=f"KernelBench problems not at {KERNELBENCH}")

MODEL = "class Model:\n    def forward(self, x):\n        return x\n"
MODEL_NEW = "class ModelNew:\n    def forward(self, x):\n        return x\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def pair(candidate: Path, workspace: Path | None = None, settings_pairs: dict[str, str] | None = None,
         roots: list[Path] | None = None) -> Pairing | ReferenceProblem | None:
    return find_reference(candidate, candidate.read_text(), workspace, settings_pairs or {}, roots or [])


def test_header_relative_to_the_candidate_folder(tmp_path: Path):
    reference = write(tmp_path / "ref" / "relu.py", MODEL)
    candidate = write(tmp_path / "work" / "relu_fast.py",
                      f"import torch\n# kernel-lsp: reference=../ref/relu.py\n{MODEL_NEW}")
    assert pair(candidate) == Pairing(candidate, tmp_path / "work" / "../ref/relu.py", "header",
                                      "line 2: # kernel-lsp: reference=../ref/relu.py")
    assert pair(candidate).reference.resolve() == reference


def test_header_absolute_path_and_slash_comment_in_cu(tmp_path: Path):
    reference = write(tmp_path / "relu.py", MODEL)
    candidate = write(tmp_path / "k" / "relu.cu", f"// kernel-lsp: reference={reference}\n__global__ void k() {{}}\n")
    assert pair(candidate) == Pairing(candidate, reference, "header", f"line 1: // kernel-lsp: reference={reference}")


def test_slash_comment_is_not_a_header_in_python(tmp_path: Path):
    write(tmp_path / "relu.py", MODEL)
    candidate = write(tmp_path / "c.py", "// kernel-lsp: reference=relu.py\n")
    assert pair(candidate) is None


def test_header_after_line_ten_is_ignored(tmp_path: Path):
    write(tmp_path / "relu.py", MODEL)
    candidate = write(tmp_path / "c.py", "\n" * 10 + "# kernel-lsp: reference=relu.py\n")
    assert pair(candidate) is None


def test_missing_header_reference_is_a_problem_on_its_line(tmp_path: Path):
    candidate = write(tmp_path / "c.py", f"import torch\n\n# kernel-lsp: reference=gone.py\n{MODEL}{MODEL_NEW}")
    assert pair(candidate) == ReferenceProblem(f"reference file not found: {tmp_path / 'gone.py'}", 2)


def test_empty_header_is_a_problem(tmp_path: Path):
    candidate = write(tmp_path / "c.py", "# kernel-lsp: reference=\n")
    assert pair(candidate) == ReferenceProblem("kernel-lsp: reference= names no file", 0)


def test_settings_pattern_with_stem_template(tmp_path: Path):
    reference = write(tmp_path / "problems" / "softmax.py", MODEL)
    candidate = write(tmp_path / "solutions" / "softmax_new.py", MODEL_NEW)
    pairs = {"solutions/*_new.py": "problems/{stem}.py"}
    assert pair(candidate, tmp_path, pairs) == Pairing(candidate, reference, "settings",
                                                       "references: 'solutions/*_new.py' -> 'problems/{stem}.py'")


def test_settings_exact_path_and_file_outside_workspace(tmp_path: Path):
    reference = write(tmp_path / "ws" / "ref.py", MODEL)
    candidate = write(tmp_path / "ws" / "c.py", MODEL_NEW)
    outside = write(tmp_path / "elsewhere" / "c.py", MODEL_NEW)
    assert pair(candidate, tmp_path / "ws", {"./c.py": "ref.py"}).reference == reference
    assert pair(outside, tmp_path / "ws", {"*": "ref.py"}) is None


def test_settings_missing_reference_is_a_problem_on_line_zero(tmp_path: Path):
    candidate = write(tmp_path / "c.py", MODEL_NEW)
    found = pair(candidate, tmp_path, {"c.py": "nope.py"})
    assert found == ReferenceProblem(f"reference file not found: {tmp_path / 'nope.py'} "
                                     "(setting references: 'c.py' -> 'nope.py')", 0)


def test_same_file(tmp_path: Path):
    candidate = write(tmp_path / "both.py", MODEL + MODEL_NEW)
    assert pair(candidate) == Pairing(candidate, candidate, "same-file", "Model and ModelNew in one file")


def test_precedence_header_then_settings_then_same_file(tmp_path: Path):
    by_header = write(tmp_path / "a.py", MODEL)
    by_settings = write(tmp_path / "b.py", MODEL)
    candidate = write(tmp_path / "c.py", f"# kernel-lsp: reference=a.py\n{MODEL}{MODEL_NEW}")
    pairs = {"c.py": "b.py"}
    assert pair(candidate, tmp_path, pairs).reference == tmp_path / "a.py" == by_header
    candidate.write_text(MODEL + MODEL_NEW)
    assert pair(candidate, tmp_path, pairs) == Pairing(candidate, by_settings, "settings",
                                                       "references: 'c.py' -> 'b.py'")
    assert pair(candidate, tmp_path, {}).how == "same-file"


def test_same_file_wins_over_kernelbench_name(tmp_path: Path):
    write(tmp_path / "kb" / "level1" / "19_ReLU.py", MODEL)
    candidate = write(tmp_path / "19_ReLU_new.py", MODEL + MODEL_NEW)
    assert pair(candidate, roots=[tmp_path / "kb"]).how == "same-file"


@needs_kernelbench
@pytest.mark.parametrize("relative", ["level1/19_ReLU.py", "level1/19_ReLU_new.py", "level1_19_ReLU.py",
                                      "19_ReLU.py", "19_ReLU_new.py"])
def test_kernelbench_names(tmp_path: Path, relative: str):
    candidate = write(tmp_path / relative, MODEL_NEW)
    assert pair(candidate, roots=[KERNELBENCH]) == Pairing(candidate, KERNELBENCH / "level1" / "19_ReLU.py",
                                                           "kernelbench", "KernelBench level1/19_ReLU.py")


@needs_kernelbench
def test_kernelbench_name_ending_in_underscore(tmp_path: Path):
    candidate = write(tmp_path / "level1" / "1_Square_matrix_multiplication__new.py", MODEL_NEW)
    problem = KERNELBENCH / "level1" / "1_Square_matrix_multiplication_.py"
    assert pair(candidate, roots=[KERNELBENCH]).reference == problem


@needs_kernelbench
def test_kernelbench_wrong_level_id_or_name_has_no_pairing(tmp_path: Path):
    for relative in ("level2/19_ReLU.py", "20_ReLU.py", "19_Relu.py", "ReLU.py"):
        assert pair(write(tmp_path / relative, MODEL_NEW), roots=[KERNELBENCH]) is None, relative


@needs_kernelbench
def test_kernelbench_problem_file_itself_has_no_pairing():
    problem = KERNELBENCH / "level1" / "19_ReLU.py"
    assert pair(problem, roots=[KERNELBENCH]) is None


def test_kernelbench_ambiguous_without_level(tmp_path: Path):
    write(tmp_path / "kb" / "level1" / "3_Add.py", MODEL)
    level2 = write(tmp_path / "kb" / "level2" / "3_Add.py", MODEL)
    assert pair(write(tmp_path / "3_Add_new.py", MODEL_NEW), roots=[tmp_path / "kb"]) is None
    assert pair(write(tmp_path / "level2_3_Add.py", MODEL_NEW), roots=[tmp_path / "kb"]).reference == level2


LOADER = """from torch.utils import cpp_extension
ext = cpp_extension.load(name="a", sources=["kernels/a.cu", "binding.cpp"])
class ModelNew:
    pass
"""


def test_files_to_reverify_load_sources_and_references(tmp_path: Path):
    cu = write(tmp_path / "kernels" / "a.cu", "__global__ void k() {}\n")
    builder = write(tmp_path / "builder.py", LOADER)
    other = write(tmp_path / "other" / "builder.py", LOADER)  # its kernels/a.cu is a different file
    reference = write(tmp_path / "ref.py", MODEL)
    by_header = write(tmp_path / "c.py", f"# kernel-lsp: reference=ref.py\n{MODEL_NEW}")
    by_settings = write(tmp_path / "s.py", MODEL_NEW)
    texts = {path: path.read_text() for path in (builder, other, reference, by_header, by_settings)}
    assert files_to_reverify(cu, texts) == [builder]
    assert files_to_reverify(tmp_path / "binding.cpp", texts) == [builder]
    assert files_to_reverify(tmp_path / "kernels" / "b.cu", texts) == []
    assert files_to_reverify(reference, texts) == [by_header]
    assert files_to_reverify(reference, texts, workspace=tmp_path, settings_pairs={"s.py": "ref.py"}) == [
        by_header, by_settings]


def test_files_to_reverify_skips_the_saved_file_itself(tmp_path: Path):
    both = write(tmp_path / "both.py", MODEL + MODEL_NEW)
    assert files_to_reverify(both, {both: both.read_text()}) == []


def test_references_setting_converts_merges_and_rejects():
    settings, problems = resolve_settings({"references": {"a.py": "ref_a.py"}},
                                          {"references": {"b/*.py": "ref/{stem}.py"}})
    assert problems == []
    assert settings.verify.references == {"a.py": "ref_a.py", "b/*.py": "ref/{stem}.py"}
    settings, problems = resolve_settings({"references": ["a.py"]}, {"references": {"a.py": 3}})
    assert settings.verify.references == {}
    assert problems == [
        "setting 'references': expected an object of candidate paths to reference paths, got ['a.py']; using {}",
        "setting 'references': expected candidate and reference paths as strings, got {'a.py': 3}; using {}",
    ]


def test_importing_pairing_does_not_import_torch():
    code = "import sys, kernel_lsp.verify.pairing; print('torch' in sys.modules, 'triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False False"
