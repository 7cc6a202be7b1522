"""The commands' shared worker (worker/rendezvous.py): a second `kernel-lsp verify` uses the worker the first left
running; a dead worker's socket is replaced; a wrong token is refused; two commands starting at once start one
worker; it exits after its idle time; --fresh-worker starts a private one; a candidate's sandbox never sees its
folder. The daemons are found by their folder on their command line (tests/processes.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kernel_lsp.process.namespaces import SandboxPlan, isolation_status, sandbox_command
from kernel_lsp.worker.client import WorkerClient, worker_environment
from kernel_lsp.worker.rendezvous import SharedWorker, private_folder
from tests.processes import marked
from tests.worker.test_worker_auth import NOOP, hello_answer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tour" / "relu_triton.py"
QUICK = ["--trials", "1", "--calls", "2", "--baselines", ""]  # the worker's reuse is tested, not the verdict's figures


@pytest.fixture
def rendezvous(monkeypatch) -> Path:
    """A folder of the test's own for the shared worker (short: a unix socket's path holds at most 107 bytes); the
    workers started there are killed after the test."""
    runtime = Path(tempfile.mkdtemp(prefix="klrt-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("KERNEL_LSP_REUSE_WORKER", "1")
    monkeypatch.setenv("KERNEL_LSP_WORKER_IDLE_S", "120")
    yield runtime / "kernel-lsp"
    for pid in marked(str(runtime)):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(runtime, ignore_errors=True)


def verify(*extra: str, candidate: Path = EXAMPLE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_lsp", "--log-level", "INFO", "verify", "--format", "json",
                           str(candidate), *QUICK, *extra], capture_output=True, text=True, timeout=280)


def shared(folder: Path, idle_s: float = 120.0) -> SharedWorker:
    return SharedWorker(sys.executable, worker_environment(), 64, folder=folder, idle_s=idle_s)


async def served(worker: SharedWorker) -> None:
    client = WorkerClient(shared=worker)
    try:
        assert (await client.run(NOOP)).status == "ok"
    finally:
        await client.close()


def test_a_second_verify_reuses_the_worker_the_first_left(rendezvous: Path):
    first = verify()
    assert first.returncode == 0, first.stderr
    daemons = marked(str(rendezvous))
    assert len(daemons) == 1, daemons  # left running, listening in the user's folder
    assert f"started a shared worker (pid {daemons[0]})" in first.stderr
    second = verify()
    assert second.returncode == 0, second.stderr
    assert marked(str(rendezvous)) == daemons
    assert f"reusing the shared worker (pid {daemons[0]})" in second.stderr  # the pid its socket's peer has


def test_fresh_worker_starts_a_private_worker(rendezvous: Path, tmp_path: Path):
    broken = tmp_path / "broken.py"  # rejected by the worker in a second: the worker is what is tested
    broken.write_text(f"# kernel-lsp: reference={EXAMPLE.parent / 'relu.py'}\nclass ModelNew(:\n")
    result = verify("--fresh-worker", candidate=broken)
    assert result.returncode == 1, result.stderr
    assert marked(str(rendezvous)) == [] and not list(rendezvous.glob("*.sock")), result.stderr


async def test_a_dead_workers_socket_is_replaced(rendezvous: Path):
    worker = shared(private_folder(rendezvous))
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(worker.socket))  # bound, never listening, closed: what a killed worker leaves
    dead.close()
    Path(f"{worker.socket}.token").write_text("a-dead-workers-token\n")
    await served(worker)  # a worker started in its place: a refused connection is no error
    assert Path(f"{worker.socket}.token").read_text().strip() != "a-dead-workers-token"
    assert len(marked(str(rendezvous))) == 1


async def test_a_wrong_token_is_refused(rendezvous: Path):
    worker = shared(rendezvous)
    await served(worker)
    token = Path(f"{worker.socket}.token").read_text().strip()
    for presented in (None, "wrong-" + token):
        answer, closed = await hello_answer(worker.address, presented)
        assert (answer["kind"], answer["code"], closed) == ("error", "auth-failed", True), answer
    await served(worker)  # refusals never stop it


async def test_two_commands_starting_at_once_start_one_worker(rendezvous: Path):
    first, second = await asyncio.gather(shared(rendezvous).reach(), shared(rendezvous).reach())
    for reached in (first, second):
        reached.writer.close()
    assert first.pid == second.pid and sorted([first.started, second.started]) == [False, True]
    assert marked(str(rendezvous)) == [first.pid]


async def test_the_worker_exits_after_its_idle_time(rendezvous: Path):
    worker = shared(rendezvous, idle_s=1.0)
    await served(worker)
    assert len(marked(str(rendezvous))) == 1
    deadline = time.monotonic() + 60
    while marked(str(rendezvous)) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert marked(str(rendezvous)) == []
    assert not worker.socket.exists() and not Path(f"{worker.socket}.token").exists()  # it removed its own


def test_the_folder_is_private_and_no_sandbox_sees_it(rendezvous: Path):
    folder = private_folder(rendezvous)
    assert folder.stat().st_mode & 0o777 == 0o700
    if not isolation_status().startswith("isolated"):
        pytest.skip(isolation_status())
    seen = subprocess.run(sandbox_command(["/bin/sh", "-c", f"ls -d {folder}"],
                                          SandboxPlan(readable=(str(ROOT),), gpu=False)),
                          capture_output=True, text=True, timeout=60)
    assert seen.returncode != 0 and "No such file" in seen.stderr, (seen.returncode, seen.stdout, seen.stderr)
