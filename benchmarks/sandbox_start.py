"""What the candidate's sandbox costs at the start of a candidate's process (issue 38; target: at most 150 ms):

    python benchmarks/sandbox_start.py [--repeat N] [--record]

Rows, each the median of N starts measured in this one run, so the ratios compare like with like:
- bubblewrap's own start: `/bin/true` in the sandbox (kernel_lsp/process/namespaces.py's command line, as a
  candidate's process gets it: namespaces, binds, setpriv when root, prlimit) against `/bin/true` alone;
- a candidate's process as the judge starts it (candidate/handle.py: its keeper, its confinement, torch
  imported and, on a GPU, its CUDA context made) until it says it is ready, in the sandbox and without it (the
  sandbox turned off by pointing KERNEL_LSP_BWRAP at a missing file, as on a machine without bubblewrap).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from kernel_lsp.process import namespaces  # noqa: E402
from kernel_lsp.candidate.handle import CandidateProcess  # noqa: E402


def timed_run(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def candidate_ready(sandboxed: bool) -> tuple[float, str]:
    """Seconds from starting a candidate's process to its ready reply, and how it ran."""
    saved = os.environ.get(namespaces.BWRAP_ENV)
    if not sandboxed:
        os.environ[namespaces.BWRAP_ENV] = "/nonexistent/bwrap"
    namespaces.isolation_status.cache_clear()
    scratch = Path(tempfile.mkdtemp(prefix="kernel-lsp-bench-"))
    try:
        start = time.perf_counter()
        process = CandidateProcess(scratch, allow_network=False, readable=(str(scratch),))
        process.ready()
        elapsed = time.perf_counter() - start
        process.close()
        return elapsed, process.namespaces
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if saved is None:
            os.environ.pop(namespaces.BWRAP_ENV, None)
        else:
            os.environ[namespaces.BWRAP_ENV] = saved
        namespaces.isolation_status.cache_clear()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    status = namespaces.isolation_status()
    if not status.startswith("isolated"):
        raise SystemExit(f"sandbox_start.py: the sandbox cannot start here: {status}")
    plan = namespaces.SandboxPlan(gpu=os.path.exists("/dev/nvidiactl"))
    boxed = [timed_run(namespaces.sandbox_command(["/bin/true"], plan)) for _ in range(repeat)]
    plain = [timed_run(["/bin/true"]) for _ in range(repeat)]
    rows = [(f"/bin/true in the sandbox (n={repeat})", ms(statistics.median(boxed)), "",
             f"plain /bin/true: {ms(statistics.median(plain))}")]
    ready_boxed, ready_plain = [], []
    for _ in range(repeat):
        ready_boxed.append(candidate_ready(True)[0])
        ready_plain.append(candidate_ready(False)[0])
    added = statistics.median(ready_boxed) - statistics.median(ready_plain)
    rows.append((f"candidate's process ready, sandboxed (n={repeat})", ms(statistics.median(ready_boxed)), "", ""))
    rows.append((f"candidate's process ready, no sandbox (n={repeat})", ms(statistics.median(ready_plain)), "", ""))
    rows.append(("sandbox start cost per candidate process", ms(added), "<= 150 ms",
                 "met" if added <= 0.150 else "not met"))
    return rows


if __name__ == "__main__":
    report.main("sandbox_start.py", measure, default_repeat=5)
