"""Workspace scan: gitignore rules (nested, negation, dir-only, anchored, **), excludes, pruning, links, limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernel_lsp.workspace.scan import (
    IgnoreRules,
    ScanResult,
    is_kernel_file,
    scan_folder,
)


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def names(result: ScanResult, root: Path) -> set[str]:
    return {path.relative_to(root.resolve()).as_posix() for path in result.files}


def test_scan_lists_kernel_and_dependency_files_only(tmp_path):
    for name in ("a.cu", "b.cuh", "c.h", "d.hpp", "e.inl", "f.py", "sub/g.hh", "sub/h.hxx"):
        write(tmp_path / name)
    for name in ("notes.txt", "x.cpp", "y.o", "README.md"):
        write(tmp_path / name)
    result = scan_folder(tmp_path)
    assert names(result, tmp_path) == {"a.cu", "b.cuh", "c.h", "d.hpp", "e.inl", "f.py", "sub/g.hh", "sub/h.hxx"}
    assert result.files == sorted(result.files)
    assert all(path.is_absolute() for path in result.files)
    assert not result.truncated
    assert result.seconds >= 0


def test_nested_gitignore_negation_dir_only_and_anchoring(tmp_path):
    write(tmp_path / ".gitignore", "*.cuh\n!keep.cuh\nout/\n/top.cu\n")
    write(tmp_path / "sub" / ".gitignore", "/local.cu\n!deep.cuh\ngen/**/*.h\n")
    files = ["a.cu", "a.cuh", "keep.cuh", "top.cu", "out/x.cu", "out",  # `out` below is a file: not dir-only
             "sub/top.cu", "sub/local.cu", "sub/deep.cuh", "sub/other.cuh", "sub/x/local.cu",
             "sub/gen/a/b/t.h", "sub/gen/t.h", "gen/a/t.h"]
    for name in files:
        if name != "out":
            write(tmp_path / name)
    write(tmp_path / "sub" / "out", "a file named out")  # a plain file: `out/` only matches folders
    write(tmp_path / "deeper" / "out" / "y.py")
    result = scan_folder(tmp_path)
    assert names(result, tmp_path) == {
        "a.cu", "keep.cuh",  # *.cuh ignored, keep.cuh re-included
        "sub/top.cu",  # /top.cu anchored at the root only
        "sub/deep.cuh",  # re-included by the nested .gitignore, which overrides the root one
        "sub/x/local.cu",  # /local.cu in sub/.gitignore is anchored at sub/
        "gen/a/t.h",  # sub's gen/**/*.h is relative to sub/
    }
    assert result.ignored_dirs == 2  # out/ and deeper/out/
    rules = IgnoreRules.for_folder(tmp_path)
    root = tmp_path.resolve()
    assert rules.ignored(root / "out", is_dir=True)
    assert not rules.ignored(root / "sub" / "out", is_dir=False)
    assert rules.ignored(root / "out" / "new.cu")  # below an ignored folder, even if it does not exist yet
    assert rules.ignored(root / "sub" / "other.cuh")
    assert not rules.ignored(root / "sub" / "deep.cuh")
    assert not rules.ignored(root)
    assert rules.ignored(tmp_path.parent / "elsewhere.cu")  # outside the root


def test_git_cannot_reinclude_below_an_ignored_folder(tmp_path):
    write(tmp_path / ".gitignore", "vendor/\n!vendor/keep.cu\n!vendor/sub/**\n")
    write(tmp_path / "vendor" / "keep.cu")
    write(tmp_path / "vendor" / "sub" / "k.cu")
    assert names(scan_folder(tmp_path), tmp_path) == set()
    rules = IgnoreRules.for_folder(tmp_path)
    assert rules.ignored(tmp_path / "vendor" / "keep.cu")
    assert rules.ignored(tmp_path / "vendor" / "sub", is_dir=True)
    assert rules.ignored(tmp_path / "vendor" / "sub" / "k.cu")  # its folder re-included, but vendor/ is not


def test_git_info_exclude_and_gitignore_precedence(tmp_path):
    write(tmp_path / ".git" / "info" / "exclude", "secret.cu\n*.inl\n")
    write(tmp_path / ".gitignore", "!kept.inl\n")
    for name in ("secret.cu", "plain.cu", "x.inl", "kept.inl"):
        write(tmp_path / name)
    assert names(scan_folder(tmp_path), tmp_path) == {"plain.cu", "kept.inl"}


def test_gitignore_above_the_workspace_folder_applies(tmp_path):
    (tmp_path / ".git").mkdir()
    write(tmp_path / ".gitignore", "*.cuh\n")
    write(tmp_path / "project" / "a.cuh")
    write(tmp_path / "project" / "a.cu")
    assert names(scan_folder(tmp_path / "project"), tmp_path / "project") == {"a.cu"}


def test_default_excludes_prune_without_entering(tmp_path, monkeypatch):
    for folder in ("node_modules/pkg", ".git/objects", "__pycache__", ".venv/lib", "build", "dist", "x.egg-info",
                   "sub/node_modules"):
        write(tmp_path / folder / "k.cu")
    write(tmp_path / "src" / "k.cu")
    write(tmp_path / "builder.cu")  # `build` is a whole name, not a prefix
    entered: list[str] = []
    real_scandir = os.scandir

    def spy(path):
        entered.append(Path(path).name)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", spy)
    result = scan_folder(tmp_path)
    assert names(result, tmp_path) == {"src/k.cu", "builder.cu"}
    assert not {"node_modules", "pkg", ".git", "objects", ".venv", "build", "dist"} & set(entered)
    assert result.ignored_dirs == 8


def test_excludes_argument_replaces_the_defaults_and_beats_gitignore(tmp_path):
    write(tmp_path / ".gitignore", "!generated/\n")
    write(tmp_path / "generated" / "g.cu")
    write(tmp_path / "node_modules" / "n.cu")
    write(tmp_path / "third_party" / "deep" / "t.cuh")
    write(tmp_path / "third_party" / "keep.cuh")
    rules = IgnoreRules.for_folder(tmp_path, excludes=["generated", "third_party/**/*.cuh", "!third_party/keep.cuh"])
    assert names(scan_folder(tmp_path, rules), tmp_path) == {"node_modules/n.cu", "third_party/keep.cuh"}


def test_symlinked_folders_are_not_followed(tmp_path):
    write(tmp_path / "a" / "k.cu")
    os.symlink(tmp_path, tmp_path / "a" / "loop", target_is_directory=True)
    os.symlink(tmp_path / "a", tmp_path / "again", target_is_directory=True)
    result = scan_folder(tmp_path)
    assert names(result, tmp_path) == {"a/k.cu"}


def test_symlinked_file_is_listed_resolved(tmp_path):
    write(tmp_path / "real" / "k.cuh")
    os.symlink(tmp_path / "real" / "k.cuh", tmp_path / "link.cuh")
    os.symlink(tmp_path / "missing.cu", tmp_path / "dangling.cu")
    assert names(scan_folder(tmp_path), tmp_path) == {"real/k.cuh"}


def test_max_files_truncates(tmp_path):
    for i in range(10):
        write(tmp_path / f"k{i}.cu")
    result = scan_folder(tmp_path, max_files=4)
    assert result.truncated and len(result.files) == 4
    assert names(result, tmp_path) == {"k0.cu", "k1.cu", "k2.cu", "k3.cu"}
    exact = scan_folder(tmp_path, max_files=10)
    assert not exact.truncated and len(exact.files) == 10


def test_unreadable_folder_is_skipped_and_counted(tmp_path, monkeypatch):
    write(tmp_path / "open" / "a.cu")
    write(tmp_path / "closed" / "b.cu")
    real_scandir = os.scandir

    def refuse_closed(path):  # chmod 0 does not stop root, who may run the tests
        if Path(path).name == "closed":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refuse_closed)
    result = scan_folder(tmp_path)
    assert names(result, tmp_path) == {"open/a.cu"}
    assert result.unreadable_dirs == 1


def test_rules_for_another_root_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError):
        scan_folder(tmp_path, IgnoreRules.for_folder(tmp_path / "a"))


def test_a_subfolder_is_scanned_with_the_workspace_rules(tmp_path):
    write(tmp_path / ".gitignore", "*.cuh\n/new/skip.cu\nout/\n")
    write(tmp_path / "new" / "k.cu")
    write(tmp_path / "new" / "k.cuh")
    write(tmp_path / "new" / "skip.cu")  # anchored at the workspace root, not at new/
    write(tmp_path / "new" / "out" / "o.cu")
    write(tmp_path / "out" / "x" / "o.cu")
    rules = IgnoreRules.for_folder(tmp_path)
    result = scan_folder(tmp_path / "new", rules)
    assert names(result, tmp_path) == {"new/k.cu"}
    assert result.ignored_dirs == 1
    pruned = scan_folder(tmp_path / "out" / "x", rules)  # below an ignored folder
    assert pruned.files == []


def test_ignored_after_gitignore_changes_needs_invalidate(tmp_path):
    write(tmp_path / "k.cu")
    rules = IgnoreRules.for_folder(tmp_path)
    assert not rules.ignored(tmp_path / "k.cu")
    write(tmp_path / ".gitignore", "k.cu\n")
    assert not rules.ignored(tmp_path / "k.cu")  # read once
    rules.invalidate()
    assert rules.ignored(tmp_path / "k.cu")
    write(tmp_path / "j.cu")
    write(tmp_path / ".git" / "info" / "exclude", "j.cu\n")
    rules.invalidate()
    assert rules.ignored(tmp_path / "j.cu")


@pytest.mark.parametrize("name, text, expected", [
    ("a.cu", "", True),
    ("a.cuh", "int x;", True),
    ("a.h", "__global__ void k() {}", False),
    ("plain.py", "import os\nprint('hello')\n", False),
    ("inline.py", "from torch.utils.cpp_extension import load_inline\n", True),
    ("load.py", "import torch.utils.cpp_extension as ext\next.load('k', ['k.cu'])\n", True),
    ("tri.py", "import triton\nimport triton.language as tl\n", True),
    ("tri2.py", "from triton import jit\n", True),
    ("deco.py", "import x\n@triton.jit\ndef k(p):\n    pass\n", True),
    ("mention.py", "# we might use triton_utils some day\nx = 'triton'\n", False),
    ("new.py", "class ModelNew(nn.Module):\n    pass\n", True),
    ("ref.py", "class Model(nn.Module):\n    pass\n\ndef get_inputs():\n    return []\n", True),
    ("model_only.py", "class Model(nn.Module):\n    pass\n", False),
    ("modelling.py", "class ModelConfig:\n    pass\n\ndef get_inputs():\n    return []\n", False),
    ("header.py", "# kernel-lsp: reference=ref.py\nx = 1\n", True),
])
def test_is_kernel_file(name, text, expected):
    assert is_kernel_file(Path(name), text) is expected
