"""A candidate's process started ahead of time: imported by a waiting sandbox child (the worker's preload list),
so that the candidate's process has imported torch and made its CUDA context before the task arrives; on a machine
with a GPU, the baselines' process too (candidate/handle.py BaselineProcess: without one, its start is left to the
verifications that time a candidate, not paid by every child).

It is started with the network refused (the default); a task that allows the network, or a process that died
while waiting, gets a fresh one (candidate/handle.py asks `take`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from kernel_lsp.candidate.handle import BaselineProcess, CandidateProcess
from kernel_lsp.process.namespaces import nvidia_device_present

# Triton reads TRITON_INTERPRET when it is imported (the candidate's process imports it with torch._dynamo while
# it waits): a machine without an NVIDIA device can only run Triton in the interpreter, so its processes start
# with it; elsewhere a CPU task gets a fresh process
NO_GPU = not nvidia_device_present()
if NO_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

_waiting: dict[bool, CandidateProcess] = {  # baselines' or not -> the process started while waiting
    kind.baselines: kind(Path(tempfile.mkdtemp(prefix=kind.scratch_prefix)), allow_network=False)
    for kind in (CandidateProcess, *(() if NO_GPU else (BaselineProcess,)))}


def take(allow_network: bool, interpret: bool, readable: tuple[str, ...] = (),
         baselines: bool = False) -> CandidateProcess | None:
    """The process started while waiting (the candidate's, or with `baselines` the baselines'), if it suits the
    task (network, Triton's interpreter, the task's files within what its sandbox reads) and still lives, under the
    task's file size and memory limits; at most once."""
    waiting = _waiting.pop(baselines, None)
    if waiting is None:
        return None
    suits = not allow_network and waiting.interpret == interpret and waiting.reads(readable)
    if not suits or waiting.process.poll() is not None or not waiting.inherit_limits():
        _end(waiting)
        return None
    return waiting


def discard() -> None:
    """Ends the processes at once if no task took them (the sandbox child calls this before it exits), so that
    they write nothing more into the child's scratch folder while that is being removed."""
    while _waiting:
        _end(_waiting.popitem()[1])


def _end(waiting: CandidateProcess) -> None:
    """Kills a process no task takes, and removes its scratch folder."""
    waiting.kill()
    waiting.close()
    shutil.rmtree(waiting.scratch, ignore_errors=True)
