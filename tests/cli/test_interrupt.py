"""Ctrl-C as a terminal sends it (SIGINT to the command's whole process group), a subprocess per command: one line
on stderr, exit status 130 (128 + SIGINT), no traceback, and nothing the command started is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def start(*args: str, **popen) -> subprocess.Popen:
    """`kernel-lsp ARGS` as the foreground job of a terminal: the leader of a process group of its own."""
    return subprocess.Popen([sys.executable, "-m", "kernel_lsp", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, **popen)


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, in whatever group or session it put itself."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, pending = set(), [pid]
    while pending:
        for child in parents.get(pending.pop(), []):
            found.add(child)
            pending.append(child)
    return found


def running(pid: int) -> bool:
    """Alive, not merely a zombie waiting to be collected."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ctrl_c(process: subprocess.Popen) -> tuple[str, str]:
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return out.decode(), err.decode()


@pytest.mark.slow
def test_ctrl_c_in_verify_says_so_in_one_line_exits_130_and_leaves_no_worker():
    """Sent once the worker runs the job (its first progress line): the worker, which sits in a session of its
    own, and the sandbox children it started are all gone when the command has exited."""
    process = start("verify", "examples/tour/relu_triton.py")
    seen = []
    for line in process.stderr:
        seen.append(line.decode())
        if line.startswith(b"  verifying "):
            break
    started = descendants(process.pid)
    assert started, seen  # at least the worker
    out, err = ctrl_c(process)
    err = "".join(seen) + err
    assert process.returncode == 130, err
    assert "Traceback" not in err and err.splitlines()[-1] == "kernel-lsp verify: interrupted", err
    assert not out
    assert [pid for pid in started if running(pid)] == []


def test_ctrl_c_in_serve_says_so_in_one_line_and_exits_130():
    """pygls would end quietly with 0: the server ends as every other command does."""
    process = start("serve", stdin=subprocess.PIPE)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"processId": None, "rootUri": None, "capabilities": {}}}).encode()
    process.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    process.stdin.flush()
    assert process.stdout.readline().startswith(b"Content-Length: ")  # it serves
    _, err = ctrl_c(process)
    assert process.returncode == 130, err
    assert "Traceback" not in err and err.splitlines() == ["kernel-lsp serve: interrupted"], err
