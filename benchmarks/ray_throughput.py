"""The Ray backend against the local worker, on CPU-path candidates (Triton under TRITON_INTERPRET=1).

    .venv/bin/python benchmarks/ray_throughput.py [--repeat N] [--record]

In a temporary folder, 8 KernelBench-style ReLU problems (inputs of 2^16..2^18 elements) with a Triton candidate
each. Then, with warm workers (started and pinged before the clock starts):
  - the 8 "verify" jobs (2 trials, 5 timed calls, eager baseline) through the local worker, one at a time, as
    `bench` sends them to it; then through Ray with 1, 2 and 4 actors, one job per actor at a time, as `bench`
    sends them to Ray: wall time and jobs per minute;
  - the per-job overhead: N no-op jobs, one after another, through the local worker and through one Ray actor
    (median round trip; the difference is what Ray adds per job);
  - `kernel-lsp bench DIR --backend ray --actors 2` as a user runs it (a subprocess: Ray started, actors warmed,
    the jobs, the reports), wall time.
Machine note: the actors share this machine's cores, so throughput stops growing at the core count.
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import report  # noqa: E402
from kernel_lsp.kinds.verify import verify_job  # noqa: E402
from kernel_lsp.worker.client import WorkerClient  # noqa: E402
from kernel_lsp.worker.protocol import Job  # noqa: E402
from tests.problems import relu_problem, triton_relu  # noqa: E402

OPTIONS = {"device": "cpu", "trials": 2, "timedCalls": 5, "warmup": 1, "baselines": ["eager"]}
PROBLEMS = 8
ACTORS = (1, 2, 4)


def make_problems(root: Path) -> tuple[Path, Path, list[Job]]:
    kb, candidates = root / "kb" / "level1", root / "candidates" / "level1"
    kb.mkdir(parents=True)
    candidates.mkdir(parents=True)
    jobs = []
    for number in range(1, PROBLEMS + 1):
        size = 2 ** (16 + number % 3)
        name = f"{number}_Relu{size}.py"
        (kb / name).write_text(relu_problem(f"torch.randn({size})"))
        (candidates / name).write_text(triton_relu(1024))
        jobs.append(verify_job(candidates / name, kb / name, OPTIONS))
    return root / "kb", root / "candidates", jobs


async def timed_batch(runner, jobs: list[Job], parallel: int) -> tuple[float, list[str]]:
    slots = asyncio.Semaphore(parallel)

    async def one(job: Job) -> str:
        async with slots:
            result = await runner.run(job)
            return result.metrics.get("verdict") if result.status == "ok" else result.status

    started = time.perf_counter()
    verdicts = await asyncio.gather(*(one(job) for job in jobs))
    return time.perf_counter() - started, verdicts


async def noop_times(runner, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        result = await runner.run(Job("noop", {}, {}, "noop"))
        assert result.status == "ok", result
        times.append(time.perf_counter() - started)
    return times


def show(rows: list, row: tuple) -> None:
    """Kept, and printed at once: a run cut short still shows what it measured."""
    rows.append(row)
    print(" | ".join(row), file=sys.stderr, flush=True)


def per_minute(seconds: float) -> str:
    return f"{seconds:.1f} s ({PROBLEMS / seconds * 60:.1f} jobs/min)"


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    import ray

    from kernel_lsp.worker.ray_backend import RayBackend

    os.environ["TRITON_INTERPRET"] = "1"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["KERNEL_LSP_CACHE_DIR"] = str(root / "cache")
        kb, candidates, jobs = make_problems(root)

        local = WorkerClient()
        await local.ping()
        await local.run(jobs[0])  # warm: the first verify imports triton in the sandbox child
        local_s, local_verdicts = await timed_batch(local, jobs, 1)
        local_noop = await noop_times(local, repeat)
        await local.close()
        show(rows, (f"local worker: {PROBLEMS} verify jobs, one at a time", per_minute(local_s), "", ""))

        ray.init(num_cpus=max(os.cpu_count() or 1, *ACTORS), include_dashboard=False, log_to_driver=False,
                 object_store_memory=100 * 2**20)
        try:
            base = None
            for actors in ACTORS:
                backend = RayBackend(actors=actors, use_gpus=False)  # CPU jobs: CPU actors, GPU or not
                await backend.ping()
                await asyncio.gather(*(backend.run(job) for job in jobs[:actors]))  # warm every actor
                seconds, verdicts = await timed_batch(backend, jobs, actors)
                assert verdicts == local_verdicts, (verdicts, local_verdicts)
                base = base or seconds
                show(rows, (f"Ray, {actors} actor{'s' if actors > 1 else ''}: the same {PROBLEMS} jobs, "
                             f"{actors} at a time", f"{per_minute(seconds)}; {base / seconds:.2f}× 1 actor",
                             "", "same verdicts"))
                if actors == 1:
                    ray_noop = await noop_times(backend, repeat)
                await backend.close()
        finally:
            ray.shutdown()
        local_ms, ray_ms = statistics.median(local_noop) * 1000, statistics.median(ray_noop) * 1000
        show(rows, (f"no-op job round trip, local worker (n={repeat})", f"{local_ms:.2f} ms", "", ""))
        show(rows, (f"no-op job round trip, one Ray actor (n={repeat})",
                     f"{ray_ms:.2f} ms (+{ray_ms - local_ms:.2f} ms per job)", "", ""))

        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kernel_lsp", "bench", str(candidates), "--kernelbench",
                               str(kb), "--device", "cpu", "--trials", "2", "--calls", "5", "--baselines",
                               "eager", "--backend", "ray", "--actors", "2", "--out", str(root / "out")],
                              capture_output=True, text=True, timeout=1200)
        wall = time.perf_counter() - started
        assert done.returncode == 0, done.stderr[-2000:]
        show(rows, ("`kernel-lsp bench DIR --backend ray --actors 2` (Ray start, warm-up, jobs, reports)",
                     f"{wall:.1f} s", "", ""))
    return rows


if __name__ == "__main__":
    report.main("ray_throughput.py", measure, default_repeat=50,
                machine_extra=lambda: f"ray {__import__('ray').__version__}; actors share the machine's cores")
