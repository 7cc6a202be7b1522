"""The candidate's sandbox against a candidate that tries to escape (tests/pipeline/hostile_candidate.py), through the
worker's real sandbox and verifier on the CPU, as root and as an unprivileged user (uid 1000 in a user namespace of
its own, which is how kernel-lsp runs under any user but root: bubblewrap then makes a user namespace itself).

Each attempt must fail and leave nothing: no secret read (a file by absolute path, the API key in an ancestor's
environment), no other run's folder, no write to the worker's cache, /proc/sys or /dev/kmsg, no connection (a unix
socket by path, an abstract one, TCP on loopback), no worker or judge visible to renice, a fork burst and a memory
burst stopped at their limits, no root, and no /dev/shm file or detached process left after the run.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from kernel_lsp.process.namespaces import SANDBOX_UID, SandboxPlan, prepare_writable, sandbox_command
from kernel_lsp.worker.sandbox import Sandbox, SandboxLimits, SandboxTask
from tests.pipeline.hostile_candidate import HOSTILE
from tests.problems import relu_problem

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 2 << 30
FORKS_TRIED = 2000


class Listeners:
    """A unix socket by path, an abstract one and a TCP port, each counting the connections it accepts."""

    def __init__(self, folder: Path, tag: str) -> None:
        self.path = str(folder / "listener.sock")
        self.abstract = f"kernel-lsp-hostile-{tag}"
        self.accepted: list[str] = []
        self.sockets = []
        for family, address in ((socket.AF_UNIX, self.path), (socket.AF_UNIX, "\0" + self.abstract),
                                (socket.AF_INET, ("127.0.0.1", 0))):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.bind(address)
            sock.listen(8)
            self.sockets.append(sock)
            threading.Thread(target=self._accept, args=(sock, str(address)), daemon=True).start()
        self.port = self.sockets[2].getsockname()[1]
        os.chmod(self.path, 0o777)  # a candidate of any user could connect if it could reach the path

    def _accept(self, sock: socket.socket, name: str) -> None:
        while True:
            try:
                connection, _ = sock.accept()
            except OSError:
                return
            self.accepted.append(name)
            connection.close()

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def plant(tmp: Path, cache_dir: Path, runs: Path | None = None) -> tuple[dict, str]:
    """The targets the candidate goes for, and the API key planted in this process's environment. `runs`: where
    the worker's runs have their folders (the temporary folder)."""
    marker = secrets.token_hex(12)
    key = f"sk-ant-api03-{marker}{secrets.token_hex(16)}"
    home = tmp / "home"
    home.mkdir()
    (home / ".anthropic_key").write_text(key)
    other = Path(tempfile.mkdtemp(prefix="kernel-lsp-task-other-", dir=runs))
    (other / "candidate.py").write_text("# another run's file\n")
    (cache_dir / "baselines").mkdir(parents=True, exist_ok=True)
    targets = {"secret": str(home / ".anthropic_key"), "marker": marker, "other_run": str(other),
               "cache_file": str(cache_dir / "baselines" / "hostile.json"), "tag": f"613.{secrets.randbelow(10**6)}",
               "memory": 4 * MEMORY_LIMIT}
    return targets, key


def candidate_text(targets: dict) -> str:
    return HOSTILE.replace("__TARGETS__", repr(json.dumps(targets)))


async def run_hostile(targets: dict, cache_dir: str, device: str = "cpu", memory: int = MEMORY_LIMIT) -> dict:
    """The hostile candidate verified through the worker's sandbox: the run's ending (its exception's message)."""
    files = {"cand.py": candidate_text(targets), "reference/problem.py": relu_problem("torch.rand(8, 32) - 0.5")}
    task = SandboxTask(entry="kernel_lsp.verify.run:verify_candidate", files=files,
                       args={"reference": "reference/problem.py", "candidate": "cand.py", "uses_cuda": device == "cuda",
                             "options": {"device": device, "trials": 1, "timedCalls": 2, "warmup": 1,
                                         "baselines": ["eager"], "requireIsolation": True,
                                         # its forward tries every escape (~30 s alone, more on a loaded CI
                                         # machine): what is tested is how each attempt ends, not how fast
                                         "hangTimeoutS": 600},
                             "cache_dir": cache_dir, "files": files})
    sandbox = Sandbox(preload=("torch",))
    try:
        outcome = await sandbox.run(task, SandboxLimits(wall_time_s=300, host_memory_bytes=memory))
    finally:
        await sandbox.close()
    # the candidate raises with its attempts: the run ends as its exception
    assert outcome.status == "python-exception", (outcome.status, outcome.message, outcome.stderr[-3000:])
    return {"message": outcome.message, "stderr": outcome.stderr}


def attempts(report: dict) -> dict[str, str]:
    text = json.dumps(report)
    found = re.search(r"ATTEMPTS<<(.*?)>>", text)
    assert found, f"the candidate's report of its attempts is missing: {text[:3000]}"
    return json.loads(json.loads(f'"{found.group(1)}"'))


def leftovers(tag: str) -> list[str]:
    """Processes on the host whose command line holds the candidate's tag (its detached `sleep`)."""
    seen = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if tag in cmdline and "pytest" not in cmdline:
                seen.append(f"{entry}: {cmdline}")
    return seen


def check(seen: dict[str, str], report: dict, targets: dict, key: str, listeners: Listeners, uid: int) -> None:
    for stage in ("import", "forward"):
        for name in ("read secret", "other run", "write cache", "core_pattern", "kmsg", "unix path",
                     "unix abstract", "tcp"):
            assert seen[f"{stage} {name}"].startswith("refused"), (stage, name, seen)
        assert seen[f"{stage} environ with key"] in ("done: []", "refused"), seen
    assert listeners.accepted == [], listeners.accepted
    assert not Path(targets["cache_file"]).exists()
    assert key not in json.dumps(report)
    visible = seen["visible"]
    assert visible.startswith("done") and "kernel_lsp.worker.child" not in visible and "pytest" not in visible, visible
    assert "kernel-lsp" not in seen["unix sockets"] and "listener.sock" not in seen["unix sockets"], seen
    forks = re.search(r"after (\d+) forks", seen["fork burst"])
    assert seen["fork burst"].startswith("refused") and forks and int(forks.group(1)) < FORKS_TRIED, seen
    assert seen["memory burst"].startswith("refused: MemoryError"), seen
    assert seen["uid"] == f"done: [{uid}, {uid}, True]", seen
    assert seen["shm leftover"] == "done"  # its own /dev/shm, gone with the sandbox:
    assert not Path("/dev/shm", targets["tag"]).exists()
    assert leftovers(targets["tag"]) == []
    assert seen["daemon"] == "done"


def unmasked_proc(argv: list[str]) -> list[str]:
    """A sandbox command with the host's /proc whole instead of its own, parts read-only: the kernel lets a user
    namespace mount a new /proc (the inner sandbox's) only where no part of an existing one is covered, and bwrap's
    own /proc always has parts covered. The host's /proc shows the host's PIDs, so this sandbox keeps the host's
    PID namespace: the inner bubblewrap finds its child under /proc by the PID it knows it by."""
    kept: list[str] = []
    index = 0
    while index < len(argv):
        if argv[index] == "--unshare-pid":
            index += 1
            continue
        if argv[index] == "--ro-bind" and argv[index + 2].startswith("/proc/"):
            index += 3
            continue
        if argv[index:index + 2] == ["--proc", "/proc"]:
            kept += ["--bind", "/proc", "/proc"]
            index += 2
            continue
        kept.append(argv[index])
        index += 1
    return kept


@pytest.mark.asyncio
async def test_hostile_candidate_as_the_worker_runs_it(sandbox_available, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    cache_dir = tmp_path / "cache"
    targets, key = plant(tmp_path, cache_dir)
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)  # in the environment of every ancestor of the worker's sandbox
    listeners = Listeners(tmp_path, targets["marker"])
    targets.update(listener=listeners.path, abstract=listeners.abstract, port=listeners.port)
    try:
        report = await run_hostile(targets, str(cache_dir))
        seen = attempts(report)
        check(seen, report, targets, key, listeners, SANDBOX_UID if os.geteuid() == 0 else os.geteuid())
    finally:
        listeners.close()
        shutil.rmtree(targets["other_run"], ignore_errors=True)


def test_hostile_candidate_under_an_unprivileged_user(sandbox_available, tmp_path: Path):
    """The same run by a worker of an ordinary user (uid 1000): root's path (setpriv to SANDBOX_UID) is not taken;
    bubblewrap makes a user namespace of its own. Run as root, this test starts that worker as uid 1000 in a sandbox
    of kernel-lsp's own (the host's network, so that the listeners are the inner sandbox's to refuse), where the
    Python and the checkout are readable whatever the permissions of the folders above them."""
    user = 1000
    runs = tmp_path / "runs"
    runs.mkdir()
    cache_dir = tmp_path / "cache"
    targets, key = plant(tmp_path, cache_dir, runs)
    listeners = Listeners(tmp_path, targets["marker"])
    targets.update(listener=listeners.path, abstract=listeners.abstract, port=listeners.port)
    script = ("import asyncio, json, sys; from tests.pipeline.test_hostile_candidate import run_hostile; "
              "print('REPORT' + json.dumps(asyncio.run(run_hostile(json.loads(sys.argv[1]), sys.argv[2]))))")
    command = [sys.executable, "-c", script, json.dumps(targets), str(cache_dir)]
    environment = {**os.environ, "ANTHROPIC_API_KEY": key, "PYTHONPATH": str(REPO), "TMPDIR": str(runs),
                   "KERNEL_LSP_CACHE_DIR": str(cache_dir), "HOME": str(tmp_path / "home")}
    if os.geteuid() == 0:
        prepare_writable([str(tmp_path)], user)
        os.chmod(tmp_path / "home" / ".anthropic_key", 0o600)  # the worker's user's own secret
        command = unmasked_proc(sandbox_command(command, SandboxPlan(
            writable=(str(tmp_path),), readable=(str(REPO),), network=True, pids=1 << 20, user=user, gpu=False)))
    else:
        user = os.geteuid()
    try:
        ran = subprocess.run(command, capture_output=True, text=True, timeout=500, cwd=REPO, env=environment)
        assert ran.returncode == 0 and "REPORT" in ran.stdout, (ran.stdout[-2000:], ran.stderr[-3000:])
        report = json.loads(ran.stdout.split("REPORT", 1)[1])
        check(attempts(report), report, targets, key, listeners, user)
    finally:
        listeners.close()
