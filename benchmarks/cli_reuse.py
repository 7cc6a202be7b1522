"""`kernel-lsp verify` wall time against the job's own time, with and without a worker already running (issue 42,
item 7), on the CPU:

    python benchmarks/cli_reuse.py [--repeat N] [--record]

`kernel-lsp verify --format json examples/tour/relu_triton.py` (OPTIONS: a short job, as a warm candidate's on a GPU
is) runs as a subprocess, its wall time against the job's own: the judge's run, `duration_s` of the JSON's report.
The candidate is warm (a first, untimed call fills its Triton cache); each call is one of:
- private: --fresh-worker, a worker started for the call and stopped with it (every call before the shared worker);
- cold: the shared worker, none running: the call starts it (killed after, for the next cold call);
- warm: the shared worker the previous call left running (target: wall <= 1.5x the job's time).
The shared worker's folder and the cache are the run's own (XDG_RUNTIME_DIR, KERNEL_LSP_CACHE_DIR).
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from tests.processes import marked  # noqa: E402

CANDIDATE = ROOT / "examples" / "tour" / "relu_triton.py"
OPTIONS = ["--trials", "2", "--calls", "10", "--baselines", "eager"]
TARGET_RATIO = 1.5


def timed_verify(env: dict[str, str], *extra: str) -> tuple[float, float]:
    """(wall s, the job's own s) of one `kernel-lsp verify` subprocess."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kernel_lsp", "verify", "--format", "json", str(CANDIDATE), *OPTIONS,
                           *extra], env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    answer = json.loads(done.stdout)
    assert answer["verdict"] == "verified", (answer["summary"], done.stderr[-2000:])
    job = answer["report"]["duration_s"]
    print(f"  {wall:.2f} s wall, the job {job:.2f} s ({wall / job:.2f}x){' ' + ' '.join(extra) if extra else ''}",
          file=sys.stderr)
    return wall, job


def stop_shared(runtime: Path) -> None:
    """Kills the shared workers started under `runtime` and waits until they are gone."""
    for pid in marked(str(runtime)):
        os.kill(pid, signal.SIGKILL)
    while marked(str(runtime)):
        time.sleep(0.05)


def row(name: str, runs: list[tuple[float, float]], target: str) -> tuple[str, str, str, str]:
    wall = statistics.median(w for w, _ in runs)
    job = statistics.median(j for _, j in runs)
    ratio = statistics.median(w / j for w, j in runs)
    verdict = ("met" if ratio <= TARGET_RATIO else "NOT met") if target else ""
    return (f"{name}: wall / the job's time ({len(runs)} calls)", f"{ratio:.2f}x ({wall:.1f} s / {job:.1f} s)",
            target, verdict)


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    runtime = Path(tempfile.mkdtemp(prefix="klrt-"))  # short: a unix socket's path holds at most 107 bytes
    cache = Path(tempfile.mkdtemp(prefix="kernel-lsp-cli-reuse-"))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "KERNEL_LSP_CACHE_DIR": str(cache),
           "KERNEL_LSP_REUSE_WORKER": "1"}
    try:
        print("warming the candidate (its Triton cache)", file=sys.stderr)
        timed_verify(env, "--fresh-worker")
        private, cold, warm = [], [], []
        for _ in range(repeat):
            private.append(timed_verify(env, "--fresh-worker"))
            stop_shared(runtime)
            cold.append(timed_verify(env))
            warm.append(timed_verify(env))
        return [row("private worker (--fresh-worker)", private, ""), row("shared worker, cold", cold, ""),
                row("shared worker, warm", warm, f"<= {TARGET_RATIO}x")]
    finally:
        stop_shared(runtime)
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    report.main("cli_reuse.py", measure, default_repeat=3,
                machine_extra=lambda: f"CPU only, {os.getloadavg()[0]:.1f} load average at the end")
