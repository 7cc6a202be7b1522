"""The keeper (kernel_lsp/process/keeper.py) with real processes: what a program leaves running is named and killed
however it detached, a lost lifeline ends the whole tree and removes the folders, the disk limit counts hidden
files, and the keeper exits as its program did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kernel_lsp.process.keeper import KeeperLink, disk_use, keeper_command
from tests.processes import marked

WAIT_S = 30.0  # a bound on waiting for what must happen (never a measured time)


def start(program: str, *, grace_s: float = 0.2, remove: tuple[str, ...] = ()) -> tuple[subprocess.Popen, KeeperLink]:
    link = KeeperLink()
    keeper = subprocess.Popen(keeper_command(sys.executable, [sys.executable, "-c", program], *link.child_fds,
                                             new_session=True, grace_s=grace_s, remove=remove),
                              pass_fds=link.child_fds)
    link.started()
    return keeper, link


def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def sleeper(marker: str, how: str) -> str:
    """Python that leaves a process holding `marker` behind, detached in the way `how` names."""
    body = f"import time\ntime.sleep(600)  # {marker}\n"
    return {
        "double-fork": f"import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                       f"        exec({body!r})\n    os._exit(0)\nos.wait()\n",
        # a new process group, every fd closed, SIGTERM ignored, the environment emptied
        "hidden": f"import os, signal\nif os.fork() == 0:\n    os.setpgid(0, 0)\n    os.closerange(0, 1024)\n"
                  f"    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    os.environ.clear()\n    exec({body!r})\n",
        # a new pid every few milliseconds: each generation forks and exits
        "re-forking": f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True:\n"
                      f"        if os.fork():\n            os._exit(0)\n        time.sleep(0.005)  # {marker}\n",
        # the main thread exits while another thread runs: the leader looks like a zombie, the process lives
        "leader-exited": f"import ctypes, os, threading, time\nif os.fork() == 0:\n"
                         f"    threading.Thread(target=time.sleep, args=(600,)).start()  # {marker}\n"
                         f"    ctypes.CDLL(None).pthread_exit(None)\n",
    }[how]


@pytest.mark.parametrize("how", ["double-fork", "hidden", "re-forking", "leader-exited"])
def test_what_the_program_leaves_running_is_named_and_killed(how: str):
    marker = f"kernel-lsp-test-{uuid.uuid4().hex}"
    keeper, link = start(sleeper(marker, how))
    assert keeper.wait(WAIT_S) == 0  # the program's own exit code
    end = link.end()
    link.close()
    assert end.reason is None and end.left_count >= 1 and end.left, end
    assert end.unkilled == []
    assert marked(marker) == []


def test_a_program_that_starts_nothing_leaves_nothing():
    keeper, link = start("import subprocess\nsubprocess.run(['true'])\n")
    assert keeper.wait(WAIT_S) == 0
    assert link.start() is not None and link.start().subreaper is None
    end = link.end()
    link.close()
    assert (end.left_count, end.left, end.status) == (0, [], 0)


@pytest.mark.parametrize("program, returncode", [
    ("import sys\nsys.exit(3)\n", 3),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", -signal.SIGSEGV),
])
def test_the_keeper_exits_as_its_program_did(program: str, returncode: int):
    keeper, link = start(program)
    assert keeper.wait(WAIT_S) == returncode
    assert link.end().status == returncode
    link.close()


@pytest.mark.parametrize("end_it", ["close the lifeline", "kill the parent"])
def test_a_lost_lifeline_kills_the_tree_and_removes_the_folders(tmp_path: Path, end_it: str):
    marker = f"kernel-lsp-test-{uuid.uuid4().hex}"
    folder = tmp_path / "kernel-lsp-home-x"
    (folder / "inside").mkdir(parents=True)
    ready = tmp_path / "ready"  # written once the detached process exists (its parent has exited and been waited)
    program = (sleeper(marker, "double-fork") + f"open({str(ready)!r}, 'w').close()\n"
               f"import time\ntime.sleep(600)  # {marker}\n")
    if end_it == "close the lifeline":
        keeper, link = start(program, remove=(str(folder),))
        until(ready.exists, "the program and its detached process started")
        link.release()
        assert keeper.wait(WAIT_S) == -signal.SIGKILL
        assert link.end().reason == "lifeline"
        link.close()
    else:  # the keeper's parent dies of SIGKILL: no code of it runs, only its end of the lifeline closes
        parent = subprocess.Popen([sys.executable, "-c", (
            "import subprocess, sys, time\n"
            "from kernel_lsp.process.keeper import KeeperLink, keeper_command\n"
            "link = KeeperLink()\n"
            f"subprocess.Popen(keeper_command(sys.executable, [sys.executable, '-c', {program!r}], *link.child_fds,"
            f" new_session=True, remove=[{str(folder)!r}]), pass_fds=link.child_fds, start_new_session=True)\n"
            "link.started()\n"
            "time.sleep(600)\n")], env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        until(ready.exists, "the program and its detached process started")
        parent.kill()
        parent.wait()
    until(lambda: not marked(marker), "the tree was killed")
    until(lambda: not folder.exists(), "the folder was removed")


def test_the_disk_limit_counts_files_held_open_after_deletion(tmp_path: Path):
    """A program that writes its files and deletes them while it keeps them open hides them from a folder walk;
    they take the room all the same."""
    watched = tmp_path / "watched"
    watched.mkdir()
    program = ("import os, tempfile, time\n"
               f"files = [tempfile.TemporaryFile(dir={str(watched)!r}) for _ in range(4)]\n"
               "for file in files:\n"
               "    file.write(os.urandom(4 << 20))\n"
               "    file.flush()\n"
               "time.sleep(600)\n")
    keeper, link = start(program)
    link.send(watch=[str(watched)], diskBytes=8 << 20)
    assert keeper.wait(WAIT_S) == -signal.SIGKILL
    end = link.end()
    link.close()
    assert end.reason == "disk" and end.disk_bytes > 8 << 20 and end.disk_limit == 8 << 20


def test_disk_use_counts_each_inode_once_and_follows_no_link(tmp_path: Path):
    (tmp_path / "a").write_bytes(b"x" * (1 << 20))
    os.link(tmp_path / "a", tmp_path / "b")
    (tmp_path / "c").symlink_to("/usr")
    assert (1 << 20) <= disk_use([str(tmp_path)], []) < (1 << 20) + (64 << 10)
