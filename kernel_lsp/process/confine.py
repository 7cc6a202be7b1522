"""What the OS can do to keep a candidate's process off the user's files and off the network (Linux).

`confine` is called by the candidate's own process before it imports anything of the candidate's (and before
torch starts threads: the file rules bind the calling thread and the threads it starts later):

- **Network**: a seccomp filter on every thread of the process refuses IPv4, IPv6 and raw-packet sockets and
  io_uring: no connection leaves the process, not even to a listener on this machine. Unix sockets stay
  (CUDA's IPC uses them). A network namespace would be stricter, but entering one (with a user namespace)
  broke CUDA IPC between the judge and the candidate on the H200, so it is not used.
- **Files**: Landlock (Linux 5.13) makes every write outside the given folders fail with EACCES: the user's
  workspace, the trusted caches (baseline timings, measured peaks, verdicts) and the rest of the home folder
  stay as they were. Reads are not restricted (the candidate reads its reference, Python and CUDA libraries).
  From ABI 6 the process also cannot signal processes outside its domain (the judge, its keeper).

Each part that is not available is said plainly in the returned `Confinement`, never pretended. Stdlib only:
this runs before torch is imported.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import socket
import struct
import sys
import tempfile
from dataclasses import asdict, dataclass

PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
SECCOMP_DATA_NR, SECCOMP_DATA_ARCH, SECCOMP_DATA_ARG0 = 0, 4, 16  # offsets in struct seccomp_data
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
AF_PACKET = 17
IO_URING_SETUP_NR = 425  # the same on x86_64 and aarch64
# machine -> (AUDIT_ARCH, socket, seccomp) syscall numbers
SECCOMP_NUMBERS = {"x86_64": (0xC000003E, 41, 317), "aarch64": (0xC00000B7, 198, 277)}
# landlock syscalls: the same numbers on x86_64 and aarch64 (the generic table)
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
# file-system rights that change something; execute, read-file, read-dir and device ioctl stay unrestricted
WRITE_RIGHTS_BY_ABI = {
    1: (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12),
    2: 1 << 13,  # refer (linking or renaming across folders)
    3: 1 << 14,  # truncate
}
SCOPE_SIGNAL = 1 << 1
SIGNAL_SCOPE_ABI = 6  # the first Landlock ABI that keeps a process from signalling outside its domain
SUPPORTED_MACHINES = tuple(SECCOMP_NUMBERS)


@dataclass(frozen=True)
class Confinement:
    files: str  # "isolated: ..." or "not isolated: why"
    network: str

    @property
    def isolated(self) -> bool:
        return self.files.startswith("isolated") and self.network.startswith("isolated")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The Landlock ABI version the kernel offers; 0 when it offers none (or this is not Linux)."""
    if sys.platform != "linux" or platform.machine() not in SUPPORTED_MACHINES:
        return 0
    version = _libc().syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                              ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def confine(writable: list[str], allow_network: bool = False) -> Confinement:
    """Confines this process for good: the network for all its threads, files for this thread and whatever it
    starts. What was and was not possible."""
    network = "not isolated: allowed by the setting verifyAllowNetwork" if allow_network else _refuse_network()
    return Confinement(_restrict_writes(writable, landlock_abi()), network)


def _refuse_network() -> str:
    """A seccomp filter on every thread: socket() for IPv4, IPv6 and raw packets fails with EACCES, and so
    does io_uring_setup (io_uring can open sockets without the socket call). Unix sockets stay (CUDA uses them)."""
    machine = platform.machine()
    if sys.platform != "linux" or machine not in SUPPORTED_MACHINES:
        return f"not isolated: no seccomp filter for {sys.platform}/{machine}"
    arch, socket_nr, seccomp_nr = SECCOMP_NUMBERS[machine]
    refuse = SECCOMP_RET_ERRNO | errno.EACCES
    program = [
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        (BPF_JEQ_K, 1, 0, arch),
        (BPF_RET_K, 0, 0, refuse),  # a call through another ABI (i386 on x86_64): refused, not judged
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        (BPF_JEQ_K, 0, 1, IO_URING_SETUP_NR),
        (BPF_RET_K, 0, 0, refuse),
        (BPF_JEQ_K, 1, 0, socket_nr),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0),
        (BPF_JEQ_K, 3, 0, socket.AF_INET),
        (BPF_JEQ_K, 2, 0, socket.AF_INET6),
        (BPF_JEQ_K, 1, 0, AF_PACKET),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        (BPF_RET_K, 0, 0, refuse),
    ]
    code = b"".join(struct.pack("=HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", len(program), ctypes.addressof(buffer)))
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(
            ctypes.c_long(seccomp_nr), ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
            ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC), fprog) != 0:
        return f"not isolated: the seccomp filter was refused ({os.strerror(ctypes.get_errno())})"
    return "isolated: IPv4, IPv6 and raw sockets refused (seccomp)"


def _restrict_writes(writable: list[str], abi: int) -> str:
    if abi < 1:
        return "not isolated: Landlock is not available in this kernel (Linux 5.13 or later, enabled at boot)"
    write_rights = 0
    for version, rights in WRITE_RIGHTS_BY_ABI.items():
        if abi >= version:
            write_rights |= rights
    # no signal to a process outside the domain: the judge and the keepers stay up
    scoped = SCOPE_SIGNAL if abi >= SIGNAL_SCOPE_ABI else 0
    attr = struct.pack("=QQQ", write_rights, 0, scoped)[: 24 if abi >= SIGNAL_SCOPE_ABI else 16 if abi >= 4 else 8]
    libc = _libc()
    ruleset = libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.c_char_p(attr),
                           ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"not isolated: Landlock refused the rules ({os.strerror(ctypes.get_errno())})"
    try:
        granted = [folder for folder in dict.fromkeys(writable) if _allow_beneath(libc, ruleset, folder, write_rights)]
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(
                ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"not isolated: Landlock could not be applied ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    return f"isolated: writes only under {len(granted)} folder(s) (Landlock ABI {abi})"


def _allow_beneath(libc: ctypes.CDLL, ruleset: int, folder: str, rights: int) -> bool:
    try:
        fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False  # a folder that does not exist cannot be written anyway
    try:
        rule = struct.pack("=Qi", rights, fd)
        return libc.syscall(ctypes.c_long(SYS_LANDLOCK_ADD_RULE), ctypes.c_int(ruleset),
                            ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.c_char_p(rule), ctypes.c_uint32(0)) == 0
    finally:
        os.close(fd)


def probe() -> dict[str, object]:
    """Confines this process (call it in a throw-away child) and tries what a candidate would: a write outside
    the scratch folder, a write inside it, a TCP connection to a listener opened before the confinement."""
    scratch = tempfile.mkdtemp(prefix="kernel-lsp-probe-")
    outside = tempfile.mkdtemp(prefix="kernel-lsp-probe-outside-")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    confinement = confine([scratch])
    seen: dict[str, object] = {"confinement": confinement.to_dict(), "abi": landlock_abi(),
                               "folders": [scratch, outside]}
    seen["write outside"] = _try(lambda: open(os.path.join(outside, "x"), "w").close())
    seen["write inside"] = _try(lambda: open(os.path.join(scratch, "x"), "w").close())
    seen["connect"] = _try(lambda: socket.create_connection(("127.0.0.1", port), timeout=2).close())
    return seen


def _try(action) -> str:
    try:
        action()
    except OSError as error:
        return errno.errorcode.get(error.errno or 0, str(error))
    return "done"


def exec_confined(argv: list[str]) -> int:
    """`python -m kernel_lsp.process.confine [--writable DIR ...] [--allow-network] -- PROGRAM ARGS...`: this
    process confined, then replaced by PROGRAM (Landlock's rules and the seccomp filter stay across execve). How a
    standalone program of the user's is run by the worker, under ncu and compute-sanitizer too."""
    if "--" not in argv:
        print("usage: python -m kernel_lsp.process.confine [--writable DIR ...] [--allow-network] -- PROGRAM ...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    options, program = argv[:split], argv[split + 1:]
    writable = [value.split("=", 1)[1] for value in options if value.startswith("--writable=")]
    confinement = confine(writable, "--allow-network" in options)
    if not confinement.isolated:
        print(f"kernel-lsp: the program runs without full isolation: files {confinement.files}; network "
              f"{confinement.network}", file=sys.stderr)
    sys.stdout.flush()
    os.execv(program[0], program)
    return 127  # execv does not return


if __name__ == "__main__" and sys.argv[1:] == ["--probe"]:
    print(json.dumps(probe()))
elif __name__ == "__main__":
    sys.exit(exec_confined(sys.argv[1:]))
