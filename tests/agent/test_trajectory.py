"""Trajectories: JSON lines flushed per event, read back (a cut-off last line tolerated), candidates for replay,
and no API key ever written."""

from __future__ import annotations

import json

import pytest

from kernel_lsp.agent.trajectory import TrajectoryWriter, candidates_of, read_trajectory

KEY = "sk-ant-api03-AbC_def-123456789"


def test_events_round_trip_in_order(tmp_path) -> None:
    with TrajectoryWriter(tmp_path / "passes", pass_id="p1") as writer:
        writer.write("start", model="claude-x", budget={"model_calls": 3})
        writer.write("tool_call", id="t1", name="verify", input={"candidate": "model_new.py"})
        writer.write("evaluation", node=1, source="v1", evaluation={"verdict": "verified"})
        writer.write("score", node=1, score=1.3, reason="verified 1.4× eager")
        writer.write("end", reason="the budget of 3 model calls is spent")
    assert writer.path == tmp_path / "passes" / "p1.jsonl"
    events = read_trajectory(writer.path)
    assert [e["kind"] for e in events] == ["start", "tool_call", "evaluation", "score", "end"]
    assert events[3] == {"t": events[3]["t"], "kind": "score", "node": 1, "score": 1.3,
                         "reason": "verified 1.4× eager"}
    assert all(isinstance(e["t"], float) for e in events)
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)


def test_each_event_is_on_disk_as_soon_as_it_is_written(tmp_path) -> None:
    writer = TrajectoryWriter(tmp_path)
    writer.write("message", role="assistant", content=[{"type": "text", "text": "trying tiles"}])
    lines = writer.path.read_text().splitlines()  # read before close: a killed pass keeps this line
    assert len(lines) == 1 and json.loads(lines[0])["content"][0]["text"] == "trying tiles"
    writer.write("spend", model_calls=1)
    assert len(writer.path.read_text().splitlines()) == 2
    writer.close()


def test_pass_ids_are_distinct_and_sort_by_time(tmp_path) -> None:
    first, second = TrajectoryWriter(tmp_path), TrajectoryWriter(tmp_path)
    assert first.path != second.path and first.pass_id[:8].isdigit()
    first.close()
    second.close()


def test_an_api_key_is_never_written(tmp_path) -> None:
    with TrajectoryWriter(tmp_path) as writer:
        event = writer.write("message", role="user", headers={"x-api-key": KEY, "Authorization": f"Bearer {KEY}"},
                             content=f"my key is {KEY}, please keep it", api_key="not even key-shaped",
                             usage={"input_tokens": 12, "output_tokens": 3})
    text = writer.path.read_text()
    assert "sk-ant-" not in text and "not even key-shaped" not in text
    assert event["headers"] == {"x-api-key": "[redacted]", "Authorization": "[redacted]"}
    assert event["content"] == "my key is [redacted], please keep it"
    assert event["usage"] == {"input_tokens": 12, "output_tokens": 3}  # counters are not credentials


def test_a_key_inside_nested_lists_is_redacted(tmp_path) -> None:
    with TrajectoryWriter(tmp_path) as writer:
        writer.write("tool_result", content=[{"type": "text", "text": f"env: ANTHROPIC_API_KEY={KEY}"}])
    assert "sk-ant-" not in writer.path.read_text()


def test_unknown_kinds_and_evaluations_without_source_are_refused(tmp_path) -> None:
    with TrajectoryWriter(tmp_path) as writer:
        with pytest.raises(ValueError, match="unknown trajectory event kind"):
            writer.write("thought", text="hmm")
        with pytest.raises(ValueError, match="source"):
            writer.write("evaluation", node=1, evaluation={})
    assert writer.path.read_text() == ""


def test_a_cut_off_last_line_is_left_out_but_a_corrupt_middle_line_is_an_error(tmp_path) -> None:
    with TrajectoryWriter(tmp_path) as writer:
        writer.write("start")
        writer.write("spend", model_calls=1)
    with writer.path.open("a") as file:
        file.write('{"t": 3.2, "kind": "mess')  # killed mid-write
    assert [e["kind"] for e in read_trajectory(writer.path)] == ["start", "spend"]
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"kind": "start"}\nnot json\n{"kind": "end"}\n')
    with pytest.raises(ValueError, match="corrupt.jsonl:2"):
        read_trajectory(corrupt)


def test_candidates_of_lists_each_evaluated_source_once_in_order(tmp_path) -> None:
    with TrajectoryWriter(tmp_path) as writer:
        writer.write("tool_call", name="write_candidate", input={"source": "not evaluated"})
        writer.write("evaluation", node=1, source="v1", evaluation={"verdict": "rejected"})
        writer.write("evaluation", node=2, source="v2", evaluation={"verdict": "verified"})
        writer.write("evaluation", node=3, source="v1", evaluation={"verdict": "rejected"})
    assert candidates_of(writer.path) == ["v1", "v2"]


def test_values_json_cannot_hold_are_written_as_text(tmp_path) -> None:
    with TrajectoryWriter(tmp_path) as writer:
        writer.write("end", file=tmp_path / "model_new.py")
    assert read_trajectory(writer.path)[0]["file"] == str(tmp_path / "model_new.py")
