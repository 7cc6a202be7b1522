"""Shared test constants; the markers given by folder: `editors` for tests/editors, `slow` for the folders whose
tests start servers, workers, sandboxes or builds (markers registered in pyproject.toml); and the order files run in.

Files run heaviest first (their seconds in tests/file_seconds.json, from a CI run on 2 cores), so that under
pytest-xdist (`--dist loadfile --no-loadscope-reorder`, the README's test command) no long file starts last and
keeps one worker busy while the others are idle. The session's summary lists the slowest files; with
KERNEL_LSP_FILE_SECONDS set to a path it also writes every file's seconds there, to refresh tests/file_seconds.json."""

from __future__ import annotations

import atexit
import json
import os
import resource
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

# real tool output recorded on an H200, in the repository (tests/paths.py)
from tests.paths import FIXTURES  # noqa: E402,F401

# what servers, workers and the CLI started by the tests cache (results, builds, charts) goes to a folder of this
# test session, removed at its end, not to the user's ~/.cache (KERNEL_LSP_CACHE_DIR set by the caller wins)
if not os.environ.get("KERNEL_LSP_CACHE_DIR"):
    _SESSION_CACHE = tempfile.mkdtemp(prefix="kernel-lsp-tests-")
    os.environ["KERNEL_LSP_CACHE_DIR"] = _SESSION_CACHE
    atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)

# the commands the tests run start a private worker each, as before the shared one (worker/rendezvous.py): a worker
# left running by one test would outlive the session; tests of the shared worker turn it on with a folder of their own
os.environ.setdefault("KERNEL_LSP_REUSE_WORKER", "0")

# a shell that starts a command in the background (`pytest ... &` in a script) starts it with SIGINT ignored, and the
# commands the tests start would inherit that, so the Ctrl-C tests would see them ignore it: Python's own handler
# here means they start with the default again (a handler, unlike "ignored", does not pass through exec)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TESTS = Path(__file__).resolve().parent
SLOW_FOLDERS = {"lsp", "cli", "pipeline", "worker", "agent", "gpu"}


FILE_SECONDS = TESTS / "file_seconds.json"
SLOWEST_FILES_SHOWN = 15


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _recorded_seconds() -> dict[str, float]:
    try:
        recorded = json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        return {}
    return {name: float(seconds) for name, seconds in recorded.get("files", {}).items()}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path)).resolve()
        folder = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""
        if folder == "editors":
            item.add_marker(pytest.mark.editors)
        elif folder in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
    seconds = _recorded_seconds()  # a file not recorded yet (a new one) runs among the quick ones
    items.sort(key=lambda item: -seconds.get(_file_of(item.nodeid), 0.0))  # stable: a file's tests keep their order


_CPU_SECONDS: dict[str, float] = {}  # this process's: file -> CPU seconds of its tests and the processes they waited for


def _cpu_now() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    started = _cpu_now()
    yield
    name = _file_of(item.nodeid)
    _CPU_SECONDS[name] = _CPU_SECONDS.get(name, 0.0) + _cpu_now() - started


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """The controller sums what each xdist worker measured (sent back in workeroutput)."""
    for name, seconds in (getattr(node, "workeroutput", None) or {}).get("cpu_seconds", {}).items():
        _CPU_SECONDS[name] = _CPU_SECONDS.get(name, 0.0) + seconds


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the controller its measures
        workeroutput["cpu_seconds"] = dict(_CPU_SECONDS)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The slowest files (setup, call and teardown of their tests, summed), and every file's seconds written where
    KERNEL_LSP_FILE_SECONDS says."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller sums every worker's reports
        return
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(getattr(report, "duration", None), float) and isinstance(getattr(report, "nodeid", None), str):
                name = _file_of(report.nodeid)
                per_file[name] = per_file.get(name, 0.0) + report.duration
    if not per_file:
        return
    slowest = sorted(per_file.items(), key=lambda entry: -entry[1])
    terminalreporter.write_sep("=", f"slowest {min(SLOWEST_FILES_SHOWN, len(slowest))} files (wall s, CPU s)")
    for name, seconds in slowest[:SLOWEST_FILES_SHOWN]:
        terminalreporter.write_line(f"{seconds:9.1f}s {_CPU_SECONDS.get(name, 0.0):9.1f}s {name}")
    terminalreporter.write_line(f"CPU of the tests and the processes they waited for: {sum(_CPU_SECONDS.values()):.0f} s")
    target = os.environ.get("KERNEL_LSP_FILE_SECONDS")
    if target:
        Path(target).write_text(json.dumps({"files": {name: round(seconds, 1) for name, seconds in slowest},
                                            "cpu": {name: round(_CPU_SECONDS.get(name, 0.0), 1)
                                                    for name, _ in slowest}}, indent=1) + "\n")


@pytest.fixture
def without_sandbox(monkeypatch: pytest.MonkeyPatch):
    """No candidate's sandbox (as on a machine without bubblewrap): for tests whose stand-in tools (a fake ncu or
    compute-sanitizer, a shell script) write what they saw into the test's folder, which a sandbox hides."""
    from kernel_lsp.process import namespaces

    monkeypatch.setenv(namespaces.BWRAP_ENV, "/nonexistent/bwrap")
    namespaces.isolation_status.cache_clear()
    yield
    namespaces.isolation_status.cache_clear()


@pytest.fixture
def sandbox_available() -> None:
    """The candidate's sandbox starts here (bubblewrap, namespaces), else the test skips saying what is missing."""
    from kernel_lsp.process.namespaces import isolation_status
    from tests.editors.missing import missing

    status = isolation_status()
    if not status.startswith("isolated"):
        missing(f"the candidate's sandbox cannot start here: {status}")
