"""The memory of earlier passes on one file: what they tried, kept between passes, safe against bad files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from kernel_lsp.agent import memory as memory_module
from kernel_lsp.agent.memory import KernelMemory
from kernel_lsp.agent.search import SearchTree
from tests.agent.test_search import compile_error, evaluate, verified


def a_pass(speeds: list[float]) -> SearchTree:
    tree = SearchTree("original")
    for number, speed in enumerate(speeds):
        evaluate(tree, 0, f"candidate {number}", verified(speed))
    evaluate(tree, 0, "broken", compile_error())
    return tree


def test_each_pass_adds_its_attempts_and_the_next_reads_them_newest_first(tmp_path: Path):
    memory = KernelMemory(tmp_path, tmp_path / "relu.py")
    assert memory.prompt() == ""
    memory.add_pass("p1", a_pass([1.5, 3.0]))
    memory.add_pass("p2", a_pass([0.5]))
    lines = KernelMemory(tmp_path, tmp_path / "relu.py").prompt().splitlines()
    assert [line.split()[1] for line in lines] == ["p2", "p2", "p1", "p1", "p1"]  # newest first
    assert "compile error" in lines[0] and lines[1].endswith("(fastest of that pass)")
    assert lines[3].endswith("(fastest of that pass)") and "3× eager" in lines[3]
    other = KernelMemory(tmp_path, tmp_path / "other" / "relu.py")  # the same name elsewhere: its own memory
    assert other.path != memory.path and other.prompt() == ""


def test_a_damaged_memory_is_started_afresh_and_a_long_one_keeps_its_newest(tmp_path: Path, caplog, monkeypatch):
    memory = KernelMemory(tmp_path, tmp_path / "relu.py")
    memory.path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert memory.prompt() == ""
    assert "cannot be read" in caplog.text
    monkeypatch.setattr(memory_module, "MAX_ENTRIES", 4)
    memory.add_pass("p1", a_pass([1.0, 2.0]))
    memory.add_pass("p2", a_pass([4.0, 8.0]))
    entries = memory.entries()
    assert len(entries) == 4 and {e["pass"] for e in entries} == {"p2", "p1"} and entries[-1]["pass"] == "p2"


def test_a_memory_that_cannot_be_written_is_logged_not_raised(tmp_path: Path, caplog):
    blocker = tmp_path / "memory"
    blocker.write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING):
        KernelMemory(blocker, tmp_path / "relu.py").add_pass("p1", a_pass([1.0]))
    assert "cannot write the memory" in caplog.text


def test_profile_gists_and_the_finish_summary_reach_the_next_pass(tmp_path: Path):
    from kernel_lsp.agent.loop import profile_gist
    from kernel_lsp.agent.search import source_hash

    answer = json.dumps({"ok": True, "kernels": [{"name": "relu_kernel", "bound": "memory", "hints": [
        {"code": "ncu-uncoalesced", "message": "Loads are strided by 4. Use a contiguous layout.", "line": 9},
        {"code": "ncu-occupancy", "message": "Occupancy is 25%. Fewer registers would help."}]}], "problems": []})
    gist = profile_gist(answer)
    assert gist == ("relu_kernel (memory-bound): ncu-uncoalesced: Loads are strided by 4; "
                    "ncu-occupancy: Occupancy is 25%")
    assert profile_gist("not json") == "" and profile_gist(json.dumps({"kernels": []})) == ""
    memory = KernelMemory(tmp_path, tmp_path / "relu.py")
    tree = a_pass([1.5, 3.0])
    fastest = tree.best_verified()
    memory.add_pass("p1", tree, {source_hash(fastest.source): gist}, finish="vectorized\nthe loads  by four")
    lines = memory.prompt().splitlines()
    [line] = [line for line in lines if "(fastest of that pass)" in line]
    assert line.endswith(f"(fastest of that pass) · its profile: {gist} · the pass ended: vectorized the loads by four")
    assert not any("its profile" in other or "the pass ended" in other for other in lines if other != line)
    memory.add_pass("p2", a_pass([1.1]), {}, finish="x" * 1000)  # a long summary is cut
    assert len(memory.entries()[-2].get("finish", "")) <= memory_module.NOTE_CHARS
