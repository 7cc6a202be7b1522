"""A candidate written to escape: from import and from forward it tries every read, write, socket, signal and
limit that the candidate's sandbox (kernel_lsp/process/namespaces.py) must refuse, and raises with what it saw
(one JSON line between ATTEMPTS<< and >>), so the test reads each attempt's outcome from the verdict.

The test fills in the planted targets (TARGETS: a secret file, another run's folder, a listener's socket path,
an abstract socket name, a TCP port, the worker's cache, a tag for leftovers) before writing the file.
"""

HOSTILE = r'''
import json
import os
import signal
import socket
import time

import torch
import torch.nn as nn

TARGETS = json.loads(__TARGETS__)
SEEN = {}


def attempt(name, action):
    try:
        result = action()
        SEEN[name] = "done" if result is None else f"done: {result}"
    except Exception as error:  # every refusal is the outcome we want to see
        SEEN[name] = f"refused: {type(error).__name__}: {getattr(error, 'errno', '')}: {str(error)[:60]}"


def read(path):
    with open(path, "rb") as file:
        return file.read(200).decode(errors="replace")


def write(path, data=b"x"):
    with open(path, "wb") as file:
        file.write(data)


def environ_with_key():
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if TARGETS["marker"].encode() in open(f"/proc/{entry}/environ", "rb").read():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def visible():
    shown = []
    for entry in sorted(os.listdir("/proc")):
        if entry.isdigit():
            try:
                shown.append(open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ")[:48].decode())
            except OSError:
                pass
    return shown


def unix_sockets():
    with open("/proc/net/unix") as table:
        return [line.split()[-1] for line in table.readlines()[1:] if len(line.split()) > 7]


def connect(family, address):
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(address)


def renice_all():
    changed = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                os.setpriority(os.PRIO_PROCESS, int(entry), 19)
                os.sched_setaffinity(int(entry), {0})
                changed.append(int(entry))
            except OSError:
                pass
    return changed


def fork_burst():
    children = []
    try:
        for _ in range(2000):
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            children.append(pid)
    except OSError as error:
        raise OSError(error.errno, f"after {len(children)} forks") from None
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return len(children)


def leave_daemon():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", TARGETS["tag"]])
        os._exit(0)
    os.wait()


def memory_burst():
    block = bytearray(TARGETS["memory"])
    return len(block)


def escape(stage):
    attempt(f"{stage} read secret", lambda: read(TARGETS["secret"]))
    attempt(f"{stage} environ with key", environ_with_key)
    attempt(f"{stage} other run", lambda: os.listdir(TARGETS["other_run"]))
    attempt(f"{stage} write cache", lambda: write(TARGETS["cache_file"]))
    attempt(f"{stage} core_pattern", lambda: write("/proc/sys/kernel/core_pattern", b"|/bin/false"))
    attempt(f"{stage} kmsg", lambda: write("/dev/kmsg", b"hostile"))
    attempt(f"{stage} unix path", lambda: connect(socket.AF_UNIX, TARGETS["listener"]))
    attempt(f"{stage} unix abstract", lambda: connect(socket.AF_UNIX, "\0" + TARGETS["abstract"]))
    attempt(f"{stage} tcp", lambda: connect(socket.AF_INET, ("127.0.0.1", TARGETS["port"])))


escape("import")
attempt("shm leftover", lambda: write("/dev/shm/" + TARGETS["tag"], b"\1" * (8 << 20)))
attempt("uid", lambda: [os.getuid(), os.geteuid(), "CapEff:\t0000000000000000" in open("/proc/self/status").read()])


class ModelNew(nn.Module):
    def forward(self, x):
        escape("forward")
        attempt("visible", visible)
        attempt("unix sockets", unix_sockets)
        attempt("renice", renice_all)
        attempt("fork burst", fork_burst)
        attempt("memory burst", memory_burst)
        attempt("daemon", leave_daemon)
        raise RuntimeError("ATTEMPTS<<" + json.dumps(SEEN, separators=(",", ":")) + ">>")
'''
