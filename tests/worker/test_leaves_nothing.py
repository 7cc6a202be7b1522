"""A real worker verifying candidates on the CPU leaves the machine as it found it (issue 24): a worker killed
(SIGKILL, SIGTERM) in the middle of a hanging candidate leaves no process and no folder; a candidate that leaves a
process running, however detached, is rejected and the process killed; a candidate's files are bounded and
removed; a hanging candidate is a run-timeout long before the client gives up; folders of a dead worker are swept
by the next one."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_asyncio

from kernel_lsp.contracts.options import VerifyOptions
from kernel_lsp.kinds.verify import VerifyOutcome, verify_job
from kernel_lsp.worker.client import WorkerClient
from tests.problems import relu_problem, triton_relu
from tests.processes import marked

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]

WAIT_S = 180.0  # a bound on waiting for what must happen; a first verification starts a worker and imports torch
LIMITS = {"wallTimeS": 300}
DISK_LIMIT = 32 * 2**20


def marker() -> str:
    """A number no other process on this machine has on its command line: `sleep MARKER` sleeps for years."""
    return f"7{random.randrange(10**9):09d}"


def process_tree(root: int) -> dict[int, str]:
    """Every living process below `root` (pid -> its start time in /proc/PID/stat), read here, not by the keeper."""
    parents, starts = {}, {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(name)], starts[int(name)] = int(fields[1]), fields[19]
    tree: dict[int, str] = {}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if pid not in tree and (parent == root or parent in tree):
                tree[pid], grew = starts[pid], True
    return tree


def still_running(tree: dict[int, str]) -> list[int]:
    return [pid for pid, start in process_tree(1).items() if tree.get(pid) == start]


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def run_folders(tmp: Path) -> list[str]:
    """The task folders that hold a run's files: a child waiting for the next run has its own, empty one (made
    with it, so that the candidate's process it starts ahead knows the one folder of the worker it may read)."""
    return [name for name in folders(tmp) if name.startswith("kernel-lsp-task-") and any((tmp / name).iterdir())]


def folders(tmp: Path, pid: int | None = None) -> list[str]:
    """The sandbox's folders in `tmp` (those of the worker `pid` only, when given)."""
    names = [entry.name for entry in tmp.iterdir() if entry.name.startswith(("kernel-lsp-home-", "kernel-lsp-task-"))]
    return sorted(name for name in names if pid is None or name.split("-")[3].split(".")[0] == str(pid))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory):
    """The workers' temporary folder (TMPDIR), where every folder of a run lives."""
    folder = tmp_path_factory.mktemp("worker-tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        yield folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker(tmp: Path):
    client = WorkerClient()
    yield client
    await client.close()


def write_problem(folder: Path, candidate: str) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cand.py").write_text(candidate)
    (folder / "problem.py").write_text(relu_problem("torch.rand(8, 64) - 0.5"))
    return folder / "cand.py", folder / "problem.py"


async def verify(client: WorkerClient, folder: Path, candidate: str, **options) -> VerifyOutcome:
    cand, problem = write_problem(folder, candidate)
    settings = {"device": "cpu", "trials": 2, "timed_calls": 3, "warmup": 1, "baselines": (), "limits": LIMITS,
                **options}
    return VerifyOutcome.of(await client.run(verify_job(cand, problem, VerifyOptions(**settings))))


def codes(outcome: VerifyOutcome) -> list[str]:
    return [finding.code for finding in outcome.findings]


HANGS_WITH_A_DETACHED_SLEEPER = '''
import subprocess
import time
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        subprocess.Popen(["sleep", "{mark}"], start_new_session=True)
        while True:
            time.sleep(1)
'''


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
async def test_a_worker_killed_mid_verification_leaves_no_process_and_no_folder(tmp: Path, tmp_path: Path,
                                                                                 how: signal.Signals):
    mark = marker()
    client = WorkerClient()
    try:
        running = asyncio.ensure_future(verify(client, tmp_path, HANGS_WITH_A_DETACHED_SLEEPER.format(mark=mark),
                                               hang_timeout_s=600.0))
        await until(lambda: marked(mark), "the candidate hangs in forward, its detached sleeper started")
        worker = client._connection.process.pid
        tree = process_tree(worker)
        assert len(tree) >= 6  # two keepers, the judge, the candidate's keeper and process, the sleeper, the waiting
        assert folders(tmp, worker)
        os.kill(worker, how)
        lost = await asyncio.wait_for(running, WAIT_S)
        assert lost.verdict == "unavailable" and not lost.finished
        await until(lambda: not still_running(tree), f"the worker's processes ended: {still_running(tree)}")
        await until(lambda: not folders(tmp, worker), f"its folders were removed: {folders(tmp, worker)}")
        assert marked(mark) == []
    finally:
        await client.close()


def leaves_running(how: str, mark: str) -> str:
    """An honest Triton ReLU that, when imported, leaves a process running, detached in the way `how` names."""
    spawn = {
        "setsid-double-fork": f'''
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "{mark}"])
    os._exit(0)
os.wait()
''',
        # a new pid every few milliseconds, SIGTERM ignored, every descriptor closed, the environment emptied
        "re-forking": f'''
import subprocess, sys
subprocess.Popen([sys.executable, "-c", """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.closerange(0, 1024)
os.environ.clear()
while True:  # {mark}
    if os.fork():
        os._exit(0)
    time.sleep(0.005)
"""], start_new_session=True)
''',
    }[how]
    return triton_relu() + spawn


@pytest.mark.parametrize("how", ["setsid-double-fork", "re-forking"])
async def test_a_candidate_that_leaves_a_process_running_is_rejected_and_the_process_killed(
        worker: WorkerClient, tmp: Path, tmp_path: Path, how: str):
    mark = marker()
    outcome = await verify(worker, tmp_path, leaves_running(how, mark))
    assert outcome.verdict == "rejected", outcome.summary
    assert codes(outcome) == ["integrity-process-left"], outcome.findings
    assert "process(es) running" in outcome.findings[0].message
    assert marked(mark) == []
    assert run_folders(tmp) == []


async def test_an_honest_candidate_is_still_verified(worker: WorkerClient, tmp_path: Path):
    outcome = await verify(worker, tmp_path, triton_relu())
    assert outcome.verdict == "verified", outcome.findings
    assert outcome.report.isolation.processes.startswith("isolated"), outcome.report.isolation


WRITES = {
    # one file of 2 GiB, written the way a candidate caches something "in /tmp"
    "one big file": '''
        with open(os.path.join(tempfile.gettempdir(), "big"), "wb") as file:
            for _ in range(2048):
                file.write(bytes(2**20))
''',
    # many files, each well under the size of one, together 8 times the limit
    "many files": '''
        for index in range(64):
            with open(os.path.join(tempfile.gettempdir(), f"part{index}"), "wb") as file:
                file.write(os.urandom(4 * 2**20))
        time.sleep(600)
''',
    # files deleted while held open: no folder shows them, the disk holds them
    "deleted but open": '''
        self.held = [tempfile.TemporaryFile() for _ in range(16)]
        for file in self.held:
            file.write(os.urandom(4 * 2**20))
            file.flush()
        time.sleep(600)
''',
}


@pytest.mark.parametrize("how", list(WRITES))
async def test_a_candidates_files_are_bounded_and_removed(worker: WorkerClient, tmp: Path, tmp_path: Path,
                                                          how: str):
    candidate = ("import os, tempfile, time\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
                 "    def forward(self, x):" + WRITES[how] + "        return x.relu()\n")
    outcome = await verify(worker, tmp_path, candidate, hang_timeout_s=600.0,
                           limits={**LIMITS, "diskBytes": DISK_LIMIT})
    assert outcome.verdict == "rejected"
    assert codes(outcome) == ["run-disk-limit"], outcome.findings
    assert "limits.diskBytes" in outcome.findings[0].message
    assert run_folders(tmp) == []
    assert len(folders(tmp)) <= 2  # only the home and the task folder of the child waiting for the next run


async def test_a_hanging_candidate_is_a_run_timeout_long_before_the_job_timeout(tmp_path: Path):
    """With the job timeout at 120 s, the client would give up ("unavailable") if the judge waited for forward."""
    mark = marker()
    candidate = ("import subprocess\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
                 "    def forward(self, x):\n"
                 f"        subprocess.Popen(['sleep', '{mark}'])\n"
                 "        while True:\n"
                 "            pass\n")
    client = WorkerClient(job_timeout_s=120.0)
    try:
        await client.run(verify_job(*write_problem(tmp_path / "warm", triton_relu()), VerifyOptions(
            device="cpu", trials=1, timed_calls=1, warmup=0, baselines=())))  # started and warm
        outcome = await verify(client, tmp_path / "hangs", candidate, hang_timeout_s=5.0)
    finally:
        await client.close()
    assert outcome.finished and outcome.verdict == "rejected", outcome.summary
    assert codes(outcome) == ["run-timeout"], outcome.findings
    message = outcome.findings[0].message
    assert "forward did not return within" in message and "hangTimeoutS 5 s" in message, message
    assert marked(mark) == []


async def test_a_new_worker_removes_the_folders_of_a_dead_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    namespace = os.stat("/proc/self/ns/pid").st_ino
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = [tmp_path / f"kernel-lsp-home-{gone.pid}.{namespace}-a1", tmp_path / f"kernel-lsp-task-{gone.pid}.{namespace}-b2"]
    alive = [tmp_path / f"kernel-lsp-home-{os.getpid()}.{namespace}-c3",  # this process runs
             tmp_path / f"kernel-lsp-home-{gone.pid}.{namespace + 1}-d4",  # another PID namespace's
             tmp_path / "kernel-lsp-home-e5"]  # not named after a worker
    for folder in dead + alive:
        (folder / "inside").mkdir(parents=True)
    client = WorkerClient()
    try:
        await client.ping()
        await until(lambda: not any(folder.exists() for folder in dead), "the dead worker's folders were removed")
    finally:
        await client.close()
    assert all(folder.exists() for folder in alive)
