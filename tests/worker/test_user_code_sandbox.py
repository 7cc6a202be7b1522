"""A run-python job is a candidate like any other: its code runs in a child confined like a candidate's process (the
candidate's sandbox, Landlock, seccomp), through the real worker. The job's code is the hostile candidate's
(tests/pipeline/hostile_candidate.py), from its import and from a call: a secret by absolute path, the worker's
ancestors' environment, another run's folder, writes to a cache, /proc/sys and /dev/kmsg, unix sockets and TCP on
loopback to listeners of this test, a file left in /dev/shm. Each must fail, and the outcome says how
the child was kept in. Where no sandbox can start, the run says so in a `run-not-isolated` warning."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kernel_lsp.worker.client import WorkerClient
from kernel_lsp.worker.protocol import Job
from tests.pipeline.test_hostile_candidate import Listeners, candidate_text, plant

# the hostile candidate's module (tests/pipeline/hostile_candidate.py) makes its attempts when imported, and again
# when this calls them; the last attempt is the control: its own HOME stays writable
RUNNER = '''import os

import hostile


def main():
    hostile.escape("call")
    hostile.attempt("write home", lambda: hostile.write(os.path.join(os.environ["HOME"], "mine.txt")))
    return hostile.SEEN
'''
ESCAPES = ("read secret", "other run", "write cache", "core_pattern", "kmsg", "unix path", "unix abstract", "tcp")


async def run_escapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict, dict, Listeners]:
    """The hostile module's attempts as a run-python job through a real worker: its result, what each attempt
    did, the planted targets and the listeners."""
    os.chmod(tmp_path, 0o755)  # the planted files are readable by anyone who can reach them: only the sandbox hides them
    targets, key = plant(tmp_path, tmp_path / "cache")
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)  # in this process, the worker's ancestor
    listeners = Listeners(tmp_path, targets["marker"])
    targets.update(listener=listeners.path, abstract=listeners.abstract, port=listeners.port)
    job = Job("run-python", {"hostile.py": candidate_text(targets), "run.py": RUNNER},
              {"file": "run.py", "function": "main", "origins": {"run.py": "/home/user/run.py"}}, "")
    client = WorkerClient()
    try:
        result = await client.run(job, timeout_s=300)
    finally:
        await client.close()
        listeners.close()
        shutil.rmtree(targets["other_run"], ignore_errors=True)
    outcome = result.artifacts["sandbox_run"]
    assert outcome["status"] == "ok", outcome
    return result, outcome["value"], targets, listeners


async def test_run_python_code_is_confined_like_a_candidate(sandbox_available, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    result, seen, targets, listeners = await run_escapes(tmp_path, monkeypatch)
    for stage in ("import", "call"):
        for name in ESCAPES:
            assert seen[f"{stage} {name}"].startswith("refused"), (stage, name, seen)
        assert seen[f"{stage} environ with key"] in ("done: []", "refused"), seen  # no process holding the key
    assert seen["write home"] == "done"  # its own folder stays writable: the checks above are not blanket failures
    assert listeners.accepted == [] and not Path(targets["cache_file"]).exists()
    assert not Path("/dev/shm", targets["tag"]).exists()  # its /dev/shm was its own, gone with it
    isolation = result.artifacts["sandbox_run"]["isolation"]
    assert isolation["namespaces"].startswith("isolated"), isolation
    assert isolation["network"].startswith("isolated"), isolation
    assert [f["code"] for f in result.findings] == [], result.findings


async def test_without_a_sandbox_the_run_says_so(without_sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """bubblewrap missing: the code still runs (Landlock and seccomp are still on), and a warning says what was not
    isolated and what to install."""
    result, seen, targets, _ = await run_escapes(tmp_path, monkeypatch)
    assert seen["call write cache"].startswith("refused") and seen["call tcp"].startswith("refused"), seen
    Path("/dev/shm", targets["tag"]).unlink(missing_ok=True)  # the shared /dev/shm, without a sandbox
    (warning,) = result.findings
    assert warning["code"] == "run-not-isolated" and warning["severity"] == 2, warning
    assert "bubblewrap" in warning["message"] and warning["uri"] == "file:///home/user/run.py"
