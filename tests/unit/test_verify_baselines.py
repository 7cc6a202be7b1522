"""baselines: keyed reference timings stored atomically, misses instead of errors, GPU state without a GPU."""

from __future__ import annotations

import pytest

from kernel_lsp.verify.baselines import BaselineCache, gpu_state, nvml_index_of

SETTINGS = {"calls": 100, "warmup": 10, "seed": 0, "shapes": [[4096, 4096]], "l2Flush": True}
TIMING = {"device": "cuda", "clock": "cuda-events", "calls": 100, "median_ms": 3.1, "l2_flushed": True}


def reference_key(**changes: object) -> str:
    arguments = {"reference_text": "class Model: ...", "device_name": "NVIDIA H200", "torch_version": "2.9.0",
                 "settings": SETTINGS}
    arguments.update(changes)
    return BaselineCache.key(**arguments)


def test_a_stored_timing_comes_back_for_the_same_key_and_kind(tmp_path) -> None:
    cache = BaselineCache(tmp_path)
    key = reference_key()
    cache.put(key, "eager", TIMING)
    assert cache.get(key, "eager") == TIMING
    assert cache.get(key, "compile") is None
    assert [path.name for path in (tmp_path / "baselines").iterdir()] == [f"{key}-eager.json"]  # no temp left


def test_the_key_is_a_sha256_that_changes_with_everything_that_changes_the_number() -> None:
    key = reference_key()
    assert len(key) == 64 and int(key, 16) >= 0
    assert key == reference_key(settings=dict(reversed(SETTINGS.items())))  # order of settings does not matter
    variants = [reference_key(reference_text="class Model: pass"), reference_key(device_name="NVIDIA A100"),
                reference_key(torch_version="2.10.0"), reference_key(settings={**SETTINGS, "calls": 200}),
                reference_key(settings={**SETTINGS, "l2Flush": False})]
    assert len({key, *variants}) == 1 + len(variants)


def test_a_different_key_misses(tmp_path) -> None:
    cache = BaselineCache(tmp_path)
    cache.put(reference_key(), "compile", TIMING)
    assert cache.get(reference_key(device_name="NVIDIA A100"), "compile") is None


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe", b'{"key": "other", "kind": "eager"}'])
def test_a_corrupt_or_foreign_file_is_a_miss(tmp_path, content: bytes) -> None:
    cache = BaselineCache(tmp_path)
    key = reference_key()
    cache.put(key, "eager", TIMING)
    cache.path(key, "eager").write_bytes(content)
    assert cache.get(key, "eager") is None


def test_an_unreadable_cache_folder_is_a_miss_and_an_unwritable_one_is_skipped(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    cache = BaselineCache(blocker)
    cache.put(reference_key(), "eager", TIMING)
    assert cache.get(reference_key(), "eager") is None


def test_an_overwrite_replaces_the_stored_timing(tmp_path) -> None:
    cache = BaselineCache(tmp_path)
    key = reference_key()
    cache.put(key, "eager", TIMING)
    cache.put(key, "eager", {**TIMING, "median_ms": 2.0})
    assert cache.get(key, "eager")["median_ms"] == 2.0


def test_unknown_kinds_and_keys_that_are_not_digests_are_programming_errors(tmp_path) -> None:
    cache = BaselineCache(tmp_path)
    with pytest.raises(ValueError, match="eager, compile"):
        cache.get(reference_key(), "triton")
    with pytest.raises(ValueError, match="hex digest"):
        cache.put("../escape", "eager", TIMING)


def test_gpu_state_on_the_cpu_says_why_it_is_unavailable() -> None:
    assert gpu_state("cpu") == {"unavailable": "timed on cpu, which has no GPU state"}


def test_cuda_indices_map_to_nvml_indices_through_cuda_visible_devices(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml_index_of(1) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert (nvml_index_of(0), nvml_index_of(1), nvml_index_of(2)) == (3, 1, None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5a1b")
    assert nvml_index_of(0) is None
