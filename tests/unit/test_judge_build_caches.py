"""The judge's build caches and the candidates' are never the same folders (process/isolation.py): Triton's cache
holds launcher libraries and cubins the reference's torch.compile loads into the judge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernel_lsp.process.isolation import (
    BUILD_CACHES,
    build_cache_root,
    candidate_environment,
    judge_build_root,
    use_judge_build_caches,
)
from kernel_lsp.candidate.handle import candidate_launch


@pytest.fixture
def worker_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(tmp_path / "cache"))
    for name in (*BUILD_CACHES, "CUDA_CACHE_PATH"):  # restored after the test, whatever use_judge_build_caches sets
        monkeypatch.setenv(name, str(tmp_path / "set-by-the-user" / name))
    return tmp_path / "cache"


def test_a_judge_builds_in_its_own_folders(worker_cache: Path):
    use_judge_build_caches()
    assert {name: os.environ[name] for name in BUILD_CACHES} == {
        "TORCH_EXTENSIONS_DIR": str(worker_cache / "judge-builds" / "torch_extensions"),
        "TRITON_CACHE_DIR": str(worker_cache / "judge-builds" / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(worker_cache / "judge-builds" / "torchinductor")}


def test_the_candidates_process_gets_the_candidates_folders_and_may_write_only_those(worker_cache: Path,
                                                                                    tmp_path: Path):
    use_judge_build_caches()  # the judge's process starts the candidate's from its own environment
    home = tmp_path / "home"
    home.mkdir()
    environment, writable = candidate_launch(home)
    for name, folder in BUILD_CACHES.items():
        assert environment[name] == str(worker_cache / "builds" / folder)
        assert Path(environment[name]).is_dir() and environment[name] in writable
    assert not [folder for folder in writable if Path(folder) == judge_build_root()
                or judge_build_root() in Path(folder).parents], writable
    assert not [folder for folder in writable if "set-by-the-user" in folder], writable
    assert environment["CUDA_CACHE_PATH"] == str(home / ".nv" / "ComputeCache")  # the driver's JIT cache: its own


def test_a_folder_the_worker_was_given_is_not_the_candidates(worker_cache: Path, tmp_path: Path):
    """A TRITON_CACHE_DIR set for the worker may be one a judge or the user's own runs load from: a candidate
    builds under builds/ instead."""
    environment = candidate_environment(dict(os.environ), str(tmp_path), build_cache_root())
    assert environment["TRITON_CACHE_DIR"] == str(worker_cache / "builds" / "triton")
    assert environment["TORCH_EXTENSIONS_DIR"] == str(worker_cache / "builds" / "torch_extensions")
    assert environment["CUDA_CACHE_PATH"] == str(tmp_path / ".nv" / "ComputeCache")
