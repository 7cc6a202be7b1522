"""A run-python job is a candidate like any other: its code runs in a child confined like a candidate's process (the
candidate's sandbox, Landlock, seccomp), through the real worker. The job's code tries what a hostile candidate
would: a secret by absolute path, the worker's ancestors' environment, a write outside its folders, a unix socket
and TCP on loopback to listeners of this test, a file left in /dev/shm. Each must fail, and the outcome says how
the child was kept in. Where no sandbox can start, the run says so in a `run-not-isolated` warning."""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
from pathlib import Path

import pytest

from kernel_lsp.process.namespaces import isolation_status
from kernel_lsp.worker.client import WorkerClient
from kernel_lsp.worker.protocol import Job
from tests.editors.missing import missing

ESCAPES = r'''
import json
import os
import socket


def attempt(seen, name, action):
    try:
        result = action()
        seen[name] = "done" if result is None else f"done: {result}"
    except Exception as error:
        seen[name] = f"refused: {type(error).__name__}"


def ancestors_with(marker):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in open(f"/proc/{entry}/environ", "rb").read():
                    found.append(int(entry))
            except OSError:
                pass
    if found:
        return found
    raise PermissionError("no process here holds the marker")


def connect(family, address):
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(address)


def write(path):
    with open(path, "w") as file:
        file.write("x")


def main(targets):
    seen = {}
    attempt(seen, "read secret", lambda: open(targets["secret"]).read())
    attempt(seen, "environ", lambda: ancestors_with(targets["marker"]))
    attempt(seen, "write outside", lambda: write(targets["outside"]))
    attempt(seen, "unix path", lambda: connect(socket.AF_UNIX, targets["listener"]))
    attempt(seen, "tcp", lambda: connect(socket.AF_INET, ("127.0.0.1", targets["port"])))
    attempt(seen, "dev shm", lambda: write("/dev/shm/" + targets["tag"]))
    attempt(seen, "write home", lambda: write(os.path.join(os.environ["HOME"], "mine.txt")))
    return json.dumps(seen)
'''


class Listeners:
    """A unix socket by path and a TCP port on loopback, counting the connections they accept."""

    def __init__(self, folder: Path) -> None:
        self.path = str(folder / "listener.sock")
        self.accepted: list[str] = []
        self.sockets = []
        for family, address in ((socket.AF_UNIX, self.path), (socket.AF_INET, ("127.0.0.1", 0))):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.bind(address)
            sock.listen(4)
            self.sockets.append(sock)
            threading.Thread(target=self._accept, args=(sock,), daemon=True).start()
        self.port = self.sockets[1].getsockname()[1]
        os.chmod(self.path, 0o777)

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                connection, address = sock.accept()
            except OSError:
                return
            self.accepted.append(str(address))
            connection.close()

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, Listeners]:
    marker = secrets.token_hex(12)
    secret = tmp_path / "secret.txt"
    secret.write_text(f"sk-ant-api03-{marker}")
    secret.chmod(0o644)  # readable by anyone who can reach the path: only the sandbox keeps it out
    os.chmod(tmp_path, 0o755)
    monkeypatch.setenv("ANTHROPIC_API_KEY", f"sk-ant-api03-{marker}")  # in this process, the worker's ancestor
    listeners = Listeners(tmp_path)
    targets = {"secret": str(secret), "marker": marker, "outside": str(tmp_path / "written.txt"),
               "listener": listeners.path, "port": listeners.port, "tag": f"kl-user-code-{marker}"}
    return targets, listeners


def escapes_job(targets: dict) -> Job:
    return Job("run-python", {"escapes.py": ESCAPES},
               {"file": "escapes.py", "function": "main", "kwargs": {"targets": targets},
                "origins": {"escapes.py": "/home/user/escapes.py"}}, "")


@pytest.fixture
def sandbox_available() -> None:
    status = isolation_status()
    if not status.startswith("isolated"):
        missing(f"the candidate's sandbox cannot start here: {status}")


async def test_run_python_code_is_confined_like_a_candidate(sandbox_available, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    targets, listeners = planted(tmp_path, monkeypatch)
    client = WorkerClient()
    try:
        result = await client.run(escapes_job(targets), timeout_s=300)
    finally:
        await client.close()
        listeners.close()
    outcome = result.artifacts["outcome"]
    assert outcome["status"] == "ok", outcome
    seen = json.loads(outcome["value"])
    for name in ("read secret", "environ", "write outside", "unix path", "tcp"):
        assert seen[name].startswith("refused"), (name, seen)
    assert seen["write home"] == "done"  # its own folder stays writable: the checks above are not blanket failures
    assert listeners.accepted == [] and not Path(targets["outside"]).exists()
    assert not Path("/dev/shm", targets["tag"]).exists()  # its /dev/shm was its own, gone with it
    isolation = outcome["isolation"]
    assert isolation["namespaces"].startswith("isolated"), isolation
    assert isolation["network"].startswith("isolated"), isolation
    assert [f["code"] for f in result.findings] == [], result.findings


async def test_without_a_sandbox_the_run_says_so(without_sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """bubblewrap missing: the code still runs (Landlock and seccomp are still on), and a warning says what was not
    isolated and what to install."""
    targets, listeners = planted(tmp_path, monkeypatch)
    client = WorkerClient()
    try:
        result = await client.run(escapes_job(targets), timeout_s=300)
    finally:
        await client.close()
        listeners.close()
    outcome = result.artifacts["outcome"]
    assert outcome["status"] == "ok", outcome
    seen = json.loads(outcome["value"])
    assert seen["write outside"].startswith("refused") and seen["tcp"].startswith("refused"), seen
    (warning,) = result.findings
    assert warning["code"] == "run-not-isolated" and warning["severity"] == 2, warning
    assert "bubblewrap" in warning["message"] and warning["uri"] == "file:///home/user/escapes.py"
