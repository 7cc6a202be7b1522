"""Worker costs, measured in one run:

    python benchmarks/worker_latency.py [--repeat N] [--record]

- round trip of an empty job (`noop`) over the local pipe and over TCP (target: median <= 2 ms);
- worker start until ready: from starting the process to the answer of a `device-info` job, which
  waits for torch to be imported and CUDA initialised (where there is a GPU);
- a candidate's sandbox start-up with a warm worker (a pre-started child waits): a trivial
  `run-python` job end to end (target: well under a second).
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from kernel_lsp.worker.client import WorkerClient, WorkerUnavailable  # noqa: E402
from kernel_lsp.worker.protocol import Job  # noqa: E402

NOOP = Job("noop", {}, {}, "")
TRIVIAL = Job("run-python", {"c.py": "def main():\n    return 1\n"}, {"file": "c.py", "function": "main"}, "")


async def median_ms(client: WorkerClient, job: Job, repeat: int, pause_s: float = 0.0) -> float:
    times = []
    for _ in range(repeat):
        await asyncio.sleep(pause_s)  # not timed: lets the next child finish pre-starting
        start = time.perf_counter()
        result = await client.run(job)
        times.append(time.perf_counter() - start)
        assert result.status == "ok", result.error
    return statistics.median(times) * 1000


async def start_until_ready() -> tuple[float, bool]:
    start = time.perf_counter()
    client = WorkerClient()
    info = await client.run(Job("device-info", {}, {}, ""), timeout_s=600)
    elapsed = time.perf_counter() - start
    await client.close()
    return elapsed * 1000, bool(info.metrics.get("cudaAvailable"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def tcp_client() -> tuple[WorkerClient, subprocess.Popen]:
    port, token = free_port(), "bench-token"
    process = subprocess.Popen([sys.executable, "-m", "kernel_lsp", "worker", "--listen", f"tcp:127.0.0.1:{port}"],
                               env={**os.environ, "KERNEL_LSP_TOKEN": token}, stderr=subprocess.DEVNULL)
    for _ in range(300):
        client = WorkerClient(address=f"tcp:127.0.0.1:{port}", token=token)
        try:
            await client.ping()
            return client, process
        except WorkerUnavailable:
            await asyncio.sleep(0.1)
    process.kill()
    raise RuntimeError("the TCP worker did not start")


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    rows = []
    starts = [await start_until_ready() for _ in range(3)]
    cuda = starts[0][1]
    ready = statistics.median(t for t, _ in starts)
    rows.append((f"worker start until ready ({'torch + CUDA' if cuda else 'torch, no GPU'})", f"{ready:.0f} ms",
                 "(recorded)", ""))

    local = WorkerClient()
    await local.run(NOOP)
    pipe = await median_ms(local, NOOP, repeat)
    rows.append(("empty job round trip, pipe", f"{pipe:.2f} ms", "<= 2 ms", "ok" if pipe <= 2 else "MISSED"))
    sandbox = await median_ms(local, TRIVIAL, max(10, repeat // 20), pause_s=8.0)
    rows.append(("sandboxed trivial candidate, warm worker (child pre-started)", f"{sandbox:.0f} ms",
                 "well under 1000 ms", "ok" if sandbox < 500 else "MISSED"))
    back_to_back = await median_ms(local, TRIVIAL, 5)
    rows.append(("sandboxed trivial candidate, back to back (child still starting)", f"{back_to_back:.0f} ms",
                 "(recorded)", ""))
    await local.close()

    remote, process = await tcp_client()
    await remote.run(NOOP)
    tcp = await median_ms(remote, NOOP, repeat)
    rows.append(("empty job round trip, TCP (loopback, token)", f"{tcp:.2f} ms", "<= 2 ms",
                 "ok" if tcp <= 2 else "MISSED"))
    await remote.close()
    process.kill()
    process.wait()
    return rows


if __name__ == "__main__":
    report.main("worker_latency.py", measure, default_repeat=200)
