"""`kernel-lsp optimize FILE`: exit codes (improvement, none, usage and environment errors), the API key, a 401,
and --replay; a real local worker on the CPU and the real anthropic client against the fake Messages API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_lsp.cli import main
from tests.agent.fake_api import FakeMessagesApi, error_turn, raw_turn, text, tool_use_turn
from tests.agent.test_loop import FAST, SLOW, problem

pytestmark = pytest.mark.timeout(300)
CPU = ["--device", "cpu", "--trials", "2", "--calls", "5", "--baselines", "eager"]


@pytest.fixture(autouse=True)
def environment(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(tmp_path / "cache"))  # trajectories go to its trajectories/


def test_a_missing_key_is_an_environment_error_that_names_the_variable(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert main(["optimize", str(problem(tmp_path, SLOW)), "--reference", str(tmp_path / "ref.py"), *CPU]) == 2
    assert "ANTHROPIC_API_KEY" in capsys.readouterr().err


def test_a_key_the_api_refuses_is_a_clear_environment_error(tmp_path: Path, capsys, monkeypatch):
    with FakeMessagesApi([error_turn(401, "authentication_error", "invalid x-api-key")]) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status = main(["optimize", str(problem(tmp_path, None)), *CPU])
    err = capsys.readouterr().err
    assert status == 2
    assert "kernel-lsp optimize: model API error: the model API refused the API key (401" in err
    assert "test-key" not in err


def test_a_proxy_answering_instead_of_the_api_is_a_model_error_with_exit_2(tmp_path: Path, capsys, monkeypatch):
    """HTTP 200 with an HTML page, every time (retried as many times as agentMaxRetries says): no traceback."""
    (tmp_path / "pyproject.toml").write_text("[tool.kernel-lsp]\nagentMaxRetries = 1\n")
    page = raw_turn("text/html", "<html><body>Sign in to the corporate proxy</body></html>")
    with FakeMessagesApi([page, page]) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status = main(["optimize", str(problem(tmp_path, None)), *CPU])
    err = capsys.readouterr().err
    assert status == 2 and len(api.requests) == 2
    assert "kernel-lsp optimize: model API error: the answer from" in err and "is no Messages API answer" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, message", [(["--max-model-calls", "-1", "--reference", "ref.py"],
                                            "0 (unlimited) or more"),
                                           (["--reference", "nowhere.py"], "--reference: not a file")])
def test_bad_options_are_usage_errors(tmp_path: Path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["optimize", str(problem(tmp_path, SLOW)), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_file_without_a_reference_is_a_usage_error(tmp_path: Path, capsys):
    (tmp_path / "alone.py").write_text(SLOW)
    assert main(["optimize", str(tmp_path / "alone.py")]) == 2
    assert "no reference for" in capsys.readouterr().err


def test_a_verified_improvement_exits_0_and_replays(tmp_path: Path, capsys, monkeypatch):
    file = problem(tmp_path, SLOW)
    script = [tool_use_turn("write_candidate", {"source": FAST}), tool_use_turn("verify", {}),
              tool_use_turn("finish", {"summary": "one program"})]
    with FakeMessagesApi(script) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status = main(["optimize", str(file), "--reference", str(tmp_path / "ref.py"), "--format", "json", *CPU])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    document = json.loads(captured.out)
    assert document["improved"] is True and document["best_source"] == FAST
    assert Path(document["side_file"]).read_text() == FAST
    trajectory = Path(document["trajectory_path"])
    assert trajectory.parent == tmp_path / "cache" / "trajectories"
    # on the CPU the progress line says what the lens says: correctness, no interpreter ratios
    assert "[verified] #1: correct 2/2 · run on the CPU: timings not comparable" in captured.err, captured.err
    assert "best: verified (CPU: timings not comparable; 1 candidate verified)" in captured.err

    assert main(["optimize", str(file), "--replay", str(trajectory), *CPU]) == 0
    out = capsys.readouterr().out
    assert "#0: verified" in out and "#1: verified" in out
    assert "faster than the original under the CPU interpreter" in out, out
    assert "×" not in out.splitlines()[-1]  # the interpreter's times rank, but give no ratio


def test_no_improvement_exits_1(tmp_path: Path, capsys, monkeypatch):
    with FakeMessagesApi([tool_use_turn("finish", {"summary": "nothing to do"})]) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status = main(["optimize", str(problem(tmp_path, None)), "--max-model-calls", "5", *CPU])
    out = capsys.readouterr().out
    assert status == 1
    assert "no candidate verified" in out and "stopped: the model finished: nothing to do" in out


def test_the_cute_target_reaches_the_model_with_its_rule_and_the_code_search(tmp_path: Path, capsys, monkeypatch):
    script = [tool_use_turn("search_cutlass", {"query": "local_tile"}), tool_use_turn("finish", {"summary": "x"})]
    with FakeMessagesApi(script) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status = main(["optimize", str(problem(tmp_path, None)), "--target", "cute", "--max-model-calls", "3", *CPU])
    assert status == 1, capsys.readouterr().err
    first = api.requests[0].body
    assert "#include <cute/tensor.hpp>" in text(first["system"])
    assert "search_cutlass" in [tool["name"] for tool in first["tools"]]
    answer = json.loads(api.requests[1].body["messages"][-1]["content"][0]["content"])
    assert "snippets" in answer or "kernel-lsp[cutlass]" in answer.get("error", ""), answer
