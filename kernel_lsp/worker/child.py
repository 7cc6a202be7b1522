"""The sandbox's child: runs one candidate in a fresh process (`python -m kernel_lsp.worker.child`).

The Sandbox starts it ahead of time. It imports the preload modules, says it is ready, waits for one task
frame, applies the limits, calls the entry and writes one result frame, then exits. Frames travel on a
dedicated pipe pair (stdout and stderr belong to the candidate): a 4-byte big-endian length, then a msgpack
map, the same framing as the worker protocol: what the frames hold is contracts/sandbox_reply.py's (`ChildReady`,
`ChildReply`), which the Sandbox decodes. Only the stdlib and msgpack are imported here: torch only when a task
asks for it.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import importlib
import importlib.util
import os
import resource
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from kernel_lsp.contracts.candidate_replies import Frame, RunFailure
from kernel_lsp.contracts.sandbox_reply import ChildReady, ChildReply, TracebackFrame, frame
from kernel_lsp.process.failures import failure_parts
from kernel_lsp.process.frames import encode_frame, read_frame, write_all, write_frame

REPORT_RESERVE_BYTES = 16 * 2**20
CUDA_DRIVER_NODE = "/dev/nvidiactl"
_MACHINERY_DIR = os.path.dirname(os.path.realpath(__file__))



def main(argv: list[str] | None = None) -> None:
    options = _parse_arguments(argv)
    for fd in (options.task_fd, options.result_fd):
        os.set_inheritable(fd, False)  # the candidate's own subprocesses must not hold the frame pipes open
    faulthandler.enable(all_threads=False)  # a crash in native code still names the Python line (Sandbox parses it)
    ready = ChildReady(os.getpid())
    if options.confine:  # user code runs here: confined before any import can start a thread
        from kernel_lsp.process.confine import confine

        ready = ChildReady(ready.ready, confine(options.writable, allow_network=False).to_dict())
    _preload(options.preload)
    _create_cuda_context()
    try:
        write_frame(options.result_fd, frame(ready))
        task = read_frame(options.task_fd)
    except OSError:  # the sandbox's process died while this child was starting
        task = None
    if task is None:  # the sandbox closed, or its process died, without giving this child a task
        _discard_prestarted()
        if options.home:
            shutil.rmtree(options.home, ignore_errors=True)  # a parent that died cannot remove it
        os._exit(0)
    reply = run_task(task)
    _discard_prestarted()
    _flush_output()
    write_all(options.result_fd, reply)
    os._exit(0)  # no interpreter teardown: after a CUDA error torch's exit hooks can hang or crash


def _discard_prestarted() -> None:
    """A candidate's process started while waiting (candidate/prestart.py) that no task took ends with this child."""
    prestart = sys.modules.get("kernel_lsp.candidate.prestart")
    if prestart is not None:
        prestart.discard()


def _parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kernel_lsp.worker.child")
    parser.add_argument("--task-fd", type=int, required=True)
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--preload", action="append", default=[])
    parser.add_argument("--home", help="this child's scratch folder, removed if no task ever comes")
    parser.add_argument("--confine", action="store_true",
                        help="user code runs here: Landlock (writes to --writable only) and seccomp (no IP sockets)")
    parser.add_argument("--writable", action="append", default=[], help="with --confine: a folder it may write")
    return parser.parse_args(argv)


def _create_cuda_context() -> None:
    """With torch preloaded and a GPU present, the context (the slow part of a CUDA start, ~0.5 s) is made
    while waiting, so a candidate does not pay for it; the price is one idle context per waiting child."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return
    try:
        torch.empty(1, device="cuda")
    except Exception as error:  # the task reports CUDA problems itself, in full
        print(f"kernel-lsp sandbox: CUDA context not created while waiting: {error!r}", file=sys.stderr)


def _preload(modules: Iterable[str]) -> None:
    """Imports while waiting; a failure is noted on stderr, and fails again in full if the task needs it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:
            print(f"kernel-lsp sandbox: could not preload {name}: {error!r}", file=sys.stderr)


def run_task(task: dict[str, Any]) -> bytes:
    """The encoded result frame of one task; never raises."""
    reserve = bytearray(REPORT_RESERVE_BYTES)  # given back after a MemoryError so the reply can still be built
    try:
        args = _prepare(task)
    except Exception as error:
        return encode_frame(frame(ChildReply("sandbox-error", f"could not prepare the candidate's run: {error!r}")))
    try:
        value = _call_entry(task["entry"], args)
    except BaseException as error:
        del reserve
        return encode_frame(frame(describe_exception(error, task["task_dir"], task["origins"])))
    return _value_frame(value)


def describe_exception(error: BaseException, task_dir: str, origins: dict[str, str]) -> ChildReply:
    """The reply for a run the entry ended with an exception: status, message and the user's frames. An
    exception with a `sandbox_failure` (a failure in the candidate's own process, as failure_parts described
    it there) is reported as that failure."""
    reported = getattr(error, "sandbox_failure", None)
    failure = reported if isinstance(reported, RunFailure) else failure_parts(error)
    return ChildReply(failure.status, failure.message, error_type=failure.error_type,
                      traceback=user_frames(failure.frames, task_dir, origins))


def _prepare(task: dict[str, Any]) -> dict[str, Any]:
    """Writes the files, imports the task's preload modules, applies the limits; the entry's arguments."""
    args = dict(task["args"])
    uses_cuda = bool(args.pop("uses_cuda", False))
    _write_files(task["task_dir"], task["files"])
    for name in task["preload"]:
        importlib.import_module(name)
    _apply_limits(task["host_memory_bytes"], task["gpu_memory_fraction"], uses_cuda, task["disk_bytes"])
    os.chdir(task["task_dir"])
    sys.path.insert(0, task["task_dir"])
    return args


def _write_files(task_dir: str, files: dict[str, str]) -> None:
    root = Path(task_dir)
    for name, text in files.items():
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"file name {name!r} leaves the task directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _call_entry(entry: str, args: dict[str, Any]) -> Any:
    module_name, _, function_name = entry.partition(":")
    return getattr(importlib.import_module(module_name), function_name)(**args)


def _value_frame(value: Any) -> bytes:
    try:
        return encode_frame(frame(ChildReply("ok", "", value=value)))
    except (TypeError, ValueError, OverflowError) as error:
        return encode_frame(frame(ChildReply("sandbox-error",
                                             f"the entry returned a value msgpack cannot carry: {error}")))


def _flush_output() -> None:
    """Python's buffers, then C stdio's (printf in extensions and CUDA device printf write there)."""
    for stream in {sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__}:
        try:
            stream.flush()
        except Exception:  # the candidate may have closed or replaced the stream with anything
            pass
    ctypes.CDLL(None).fflush(None)


# ---- limits ------------------------------------------------------------------------------------------------


def _apply_limits(host_memory_bytes: int | None, gpu_memory_fraction: float | None, uses_cuda: bool,
                  disk_bytes: int | None) -> None:
    torch = _torch_with_cuda(uses_cuda)
    if torch is not None and gpu_memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(gpu_memory_fraction)  # the current device: the worker's GPU
    if host_memory_bytes is not None:
        _limit_host_memory(host_memory_bytes, uses_cuda or torch is not None or os.path.exists(CUDA_DRIVER_NODE))
    if disk_bytes is not None:
        _lower_limit(resource.RLIMIT_FSIZE, disk_bytes)  # one file; the keeper watches the sum


def _torch_with_cuda(uses_cuda: bool) -> ModuleType | None:
    """torch, when it is imported already (or the task uses CUDA) and sees a GPU; otherwise None."""
    if "torch" not in sys.modules and not (uses_cuda and importlib.util.find_spec("torch") is not None):
        return None  # importing torch only to ask would cost seconds for tasks that never touch it
    torch = importlib.import_module("torch")
    return torch if torch.cuda.is_available() else None


def _limit_host_memory(limit: int, cuda_possible: bool) -> None:
    # CUDA reserves far more virtual address space than memory, so RLIMIT_AS would make it fail to initialise;
    # RLIMIT_DATA (Linux >= 4.7) counts private writable mappings only: the heap and anonymous maps, real use.
    _lower_limit(resource.RLIMIT_DATA if cuda_possible else resource.RLIMIT_AS, limit)


def _lower_limit(which: int, limit: int) -> None:
    _, hard = resource.getrlimit(which)
    cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(which, (cap, cap))


# ---- frames in the user's files ----------------------------------------------------------------------------


def user_frames(frames: Iterable[Frame], task_dir: str, origins: dict[str, str]) -> list[TracebackFrame]:
    """Frames (oldest first) as the user should see them: task files under their real paths, ours dropped."""
    by_name = {os.path.normpath(name): path for name, path in origins.items()}
    return [TracebackFrame(user_path(file, task_dir, by_name), line, function, text)
            for file, line, function, text in frames if not _is_machinery(file)]


def user_path(file: str, task_dir: str, origins: dict[str, str]) -> str:
    """A file in the task directory -> the user's real path (else its task-relative name); others unchanged."""
    path = Path(file)
    if not path.is_relative_to(task_dir):
        return file
    relative = str(path.relative_to(task_dir))
    return origins.get(relative, relative)


def _is_machinery(file: str) -> bool:
    if file.startswith("<frozen importlib"):
        return True
    return os.path.dirname(os.path.realpath(file)) == _MACHINERY_DIR


if __name__ == "__main__":
    main()
