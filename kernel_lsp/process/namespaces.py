"""The candidate's sandbox: Linux namespaces set up by bubblewrap (`bwrap`, Debian's `bubblewrap`), not by us.

`sandbox_command(program, plan)` wraps the command line of a process that runs candidate or user code so that it
starts in new user (when not root), PID, mount, network, IPC, UTS and cgroup namespaces:

- **Files**: a read-only view of the system (/usr, /etc, the library folders, /opt, /sys, Python and its
  packages, this kernel_lsp, the CUDA toolkit), the plan's `readable` folders (the task's files) read-only and its
  `writable` folders (the scratch HOME, the candidates' build caches) read-write, each at its own path; nothing
  else of the host: no home folder, no /run, no /var, no other run's folder, no socket path of the host. /tmp and
  /dev/shm are private tmpfs folders, gone with the sandbox.
- **/proc** is the sandbox's own (its PID namespace): no ancestor, no worker, no other run is visible, and
  /proc/sys is read-only. **/dev** holds the basic nodes and the NVIDIA ones (`/dev/nvidia*`) CUDA opens.
- **Network**: a new namespace with only a loopback device, unless the plan allows the network; unix sockets of
  the host are out of reach (no path of one is mounted; abstract ones belong to the host's network namespace).
- **Never root on the host**: run by root, bwrap (which needs root's rights to set the mounts up) hands over to
  `setpriv` inside, which drops to the unprivileged SANDBOX_UID with no capability and no_new_privs; run by any
  other user, a user namespace maps that user, with no capability.
- **Limits**: a pids limit (RLIMIT_NPROC of the sandbox's user, set by `prlimit`) and, from the caller, the memory
  limits; when the
  program ends, the namespace's init ends and the kernel kills everything left in it, and its /tmp and /dev/shm
  go with it.

Landlock and seccomp (process/confine.py) stay on inside as a second layer. `isolation_status()` says whether the
sandbox can start here, and if not, what is missing and how to get it. Stdlib only.
"""

from __future__ import annotations

import functools
import glob
import os
import resource
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534  # "nobody": the user root's sandboxes run as
SYSTEM_READABLE = ("/usr", "/etc", "/opt", "/sys", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
PRIVATE = ("/", "/tmp", "/dev", "/dev/shm", "/proc")  # the sandbox's own: a folder of the plan never covers them
PROC_READ_ONLY = ("/proc/sys", "/proc/irq", "/proc/bus", "/proc/fs")
NVIDIA_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
DEFAULT_PIDS = max(1024, 8 * (os.cpu_count() or 1))  # processes and threads: torch starts a thread per core
BWRAP_ENV = "KERNEL_LSP_BWRAP"  # a bwrap binary other than the one on PATH (a GPU machine without the package)
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
TASK_DIR_ENV = "KERNEL_LSP_TASK_DIR"  # the sandbox child's task folder, made with it: a process started ahead reads it
INSTALL_HINT = "apt-get install bubblewrap (or dnf install bubblewrap)"


def nvidia_device_present() -> bool:
    """Whether this machine shows a GPU device node CUDA could use (no driver call: a waiting process asks before
    it imports): NVIDIA's on Linux, /dev/dxg under WSL. Without one, torch.cuda.is_available() is False."""
    return any(os.path.exists(node) for node in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"))


@dataclass(frozen=True)
class SandboxPlan:
    """What one sandboxed process may reach: folders it reads, folders it writes, the network or not, the GPU."""

    writable: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    network: bool = False
    gpu: bool = True
    pids: int = DEFAULT_PIDS
    user: int = SANDBOX_UID  # run by root, the unprivileged uid it runs as


def bwrap_path() -> str | None:
    configured = os.environ.get(BWRAP_ENV)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("bwrap")


def running_as_root() -> bool:
    return os.geteuid() == 0


def system_readable() -> list[str]:
    """The host's folders every sandbox reads: the system's, Python's (prefix, base prefix, every folder on
    sys.path), this kernel_lsp, and the CUDA toolkit where the environment names it."""
    folders = [path for path in SYSTEM_READABLE if os.path.lexists(path)]
    folders += [sys.prefix, sys.base_prefix, sys.exec_prefix, PACKAGE_ROOT]
    # the package folders on sys.path and PYTHONPATH, never sys.path's first entry (the script's or the current
    # folder, which may be the user's home or workspace)
    folders += [entry for entry in sys.path[1:] if entry.endswith(("-packages", ".zip", "lib-dynload"))]
    folders += site.getsitepackages() + [site.getusersitepackages()]
    folders += [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    folders += [value for name in ("purelib", "platlib", "stdlib", "platstdlib")
                if (value := sysconfig.get_paths().get(name))]
    for name in ("CUDA_HOME", "CUDA_PATH", "CUTLASS_PATH"):
        if os.environ.get(name):
            folders.append(os.environ[name])
    if os.path.isdir("/usr/local/cuda"):
        folders.append(os.path.realpath("/usr/local/cuda"))
    return folders


def nvidia_nodes() -> list[str]:
    """The device nodes CUDA opens: /dev/nvidia0..N, the control and UVM nodes, the capability nodes."""
    nodes = [path for path in (*sorted(glob.glob("/dev/nvidia[0-9]*")), *NVIDIA_NODES) if os.path.exists(path)]
    if os.path.isdir("/dev/nvidia-caps"):
        nodes.append("/dev/nvidia-caps")
    return nodes


def _outermost(paths: Iterable[str]) -> list[str]:
    """Each existing folder once, real paths, none inside another of the list (the outer bind covers it)."""
    real = sorted({os.path.realpath(path) for path in paths if path and os.path.exists(path)})
    kept: list[str] = []
    for path in real:
        if not any(path == outer or path.startswith(outer.rstrip("/") + "/") for outer in kept):
            kept.append(path)
    return kept


def sandbox_command(program: list[str], plan: SandboxPlan, *, bwrap: str | None = None) -> list[str]:
    """`program` as a command line that starts it in the plan's sandbox (see the module's docstring)."""
    bwrap = bwrap or bwrap_path()
    if bwrap is None:
        raise FileNotFoundError(f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}")
    root = running_as_root()
    argv = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "kernel-lsp-sandbox"]
    if not plan.network:
        argv.append("--unshare-net")
    if not root:
        argv += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    writable = [path for path in _outermost(plan.writable) if path not in PRIVATE]
    readable = [path for path in _outermost([*system_readable(), *plan.readable])
                if path not in PRIVATE and not any(path == w or path.startswith(w.rstrip("/") + "/") for w in writable)]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777",
             "--tmpfs", "/dev/shm"]
    # the kernel's settings read-only, whatever uid the host gives the sandbox: sysctl writes are checked against
    # the host's root uid alone, so a worker that is root behind a user namespace would otherwise reach them
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    argv += ["--ro-bind", "/dev/null", "/proc/sysrq-trigger"] if os.path.exists("/proc/sysrq-trigger") else []
    for path in SYSTEM_READABLE:  # /bin -> usr/bin and the like on merged-/usr systems
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
    made: set[str] = {"/", "/tmp", "/dev", "/proc"}
    for path in sorted({*readable, *writable}):
        argv += _parents(path, made)
    for path in readable:
        argv += ["--ro-bind", path, path]
    for path in writable:
        argv += ["--bind", path, path]
    if plan.gpu:
        for node in nvidia_nodes():
            argv += ["--dev-bind", node, node]
    argv += ["--remount-ro", "/dev"]  # no file made in /dev (a stray /dev/kmsg); its nodes and /dev/shm still open
    argv.append("--")  # the working folder stays where it is bound (the task's), else bwrap takes HOME
    if root:
        argv += [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={plan.user}", f"--regid={plan.user}",
                 "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    # the pids limit, set as the sandbox's user: RLIMIT_NPROC counts that user's processes and threads (in a user
    # namespace of its own, those of the namespace)
    ceiling = resource.getrlimit(resource.RLIMIT_NPROC)[1]  # a limit can be lowered only
    pids = plan.pids if ceiling == resource.RLIM_INFINITY else min(plan.pids, ceiling)
    argv += [shutil.which("prlimit") or "/usr/bin/prlimit", f"--nproc={pids}", "--"]
    return argv + list(program)


def _parents(path: str, made: set[str]) -> list[str]:
    """The folders above `path` made in the sandbox's root, searchable by everyone (bwrap makes them 0700)."""
    argv: list[str] = []
    parts = Path(path).parts
    for depth in range(2, len(parts)):
        parent = str(Path(*parts[:depth]))
        if parent not in made:
            made.add(parent)
            argv += ["--perms", "0755", "--dir", parent]
    return argv


def prepare_writable(folders: Iterable[str], user: int = SANDBOX_UID) -> None:
    """Run by root: the folders a sandbox writes belong to its user (SANDBOX_UID). No-op otherwise. A folder that
    belongs to it already is not walked again (a build cache holds thousands of files, all made by that user)."""
    if not running_as_root():
        return
    for folder in folders:
        try:
            if os.lstat(folder).st_uid == user:
                continue
        except OSError:
            continue
        _give(folder, user)
        for base, dirs, files in os.walk(folder):
            for entry in (*dirs, *files):
                _give(os.path.join(base, entry), user)


def _give(path: str, user: int) -> None:
    try:
        if os.lstat(path).st_uid != user:
            os.lchown(path, user, user)
    except OSError:
        pass


def make_readable(folders: Iterable[str]) -> None:
    """Run by root: the task's files are readable by the sandbox's user (a folder made by mkdtemp is 0700)."""
    if not running_as_root():
        return
    for folder in folders:
        for base, dirs, files in os.walk(folder):
            for name in (base, *(os.path.join(base, entry) for entry in dirs)):
                _add_mode(name, 0o755)
            for name in files:
                _add_mode(os.path.join(base, name), 0o644)


def _add_mode(path: str, bits: int) -> None:
    try:
        os.chmod(path, os.stat(path).st_mode | bits)
    except OSError:
        pass


@functools.lru_cache(maxsize=1)
def isolation_status() -> str:
    """"isolated: ..." when a sandbox starts here (tried once: `true` in one), else "not isolated: what is
    missing; how to get it"."""
    bwrap = bwrap_path()
    if bwrap is None:
        return f"not isolated: bubblewrap (bwrap) is not installed; {INSTALL_HINT}"
    for tool, why in (("prlimit", "to set the sandbox's pids limit"), ("setpriv", "to drop root inside the sandbox")):
        if shutil.which(tool) is None and (tool == "prlimit" or running_as_root()):
            return f"not isolated: {tool} (util-linux) is missing, needed {why}; apt-get install util-linux"
    try:
        tried = subprocess.run(sandbox_command(["/bin/sh", "-c", "exit 0"], SandboxPlan(gpu=False), bwrap=bwrap),
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as error:
        return f"not isolated: bubblewrap could not start ({error})"
    if tried.returncode != 0:
        detail = (tried.stderr.strip().splitlines() or ["no message"])[-1]
        hint = ("enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 and "
                "user.max_user_namespaces > 0; on Ubuntu 24.04 also kernel.apparmor_restrict_unprivileged_userns=0 "
                "or an AppArmor profile for bwrap), or run the worker in a container that allows them"
                if not running_as_root() else "the container must allow mount and PID namespaces "
                "(e.g. docker run --security-opt seccomp=unconfined --cap-add SYS_ADMIN)")
        return f"not isolated: bubblewrap failed ({detail}); {hint}"
    who = f"as uid {SANDBOX_UID}" if running_as_root() else "in a user namespace"
    return (f"isolated: bubblewrap ({bwrap}): own PID, mount, network, IPC and UTS namespaces, {who}, "
            "no capabilities, private /tmp and /dev/shm")

