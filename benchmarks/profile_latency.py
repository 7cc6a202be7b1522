"""Wall time to profile one candidate's kernel with the default ncu sections, through a warm worker (GPU):

    python benchmarks/profile_latency.py [--repeat N] [--record]

For KernelBench level1/19_ReLU and level1/1_Square_matrix_multiplication_ with the honest CUDA load_inline
candidates of tests/gpu/candidates.py (one kernel each), the "profile" job as the editor's "Profile this kernel"
and `kernel-lsp profile` send it: the sandboxed measurements (reference kernels, energy per call, ceilings), ncu
with the default sections on the candidate's kernel, and the extension's SASS.
- first run: the extension may be built and the GPU's ceilings are measured (cached afterwards);
- warm runs (target <= 30 s each): worker warm, extension built, ceilings cached.
--record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from benchmarks.verify_latency import gpu_name, warm_worker  # noqa: E402
from kernel_lsp.kinds.profile import profile_job  # noqa: E402
from kernel_lsp.worker.client import WorkerClient  # noqa: E402
from tests.gpu import candidates  # noqa: E402

TARGET_S = 30.0


async def timed_profile(client: WorkerClient, candidate: Path, problem: str) -> tuple[float, dict]:
    start = time.perf_counter()
    result = await client.run(profile_job(candidate, candidates.KERNELBENCH / problem, {}), timeout_s=900)
    elapsed = time.perf_counter() - start
    profile = result.metrics.get("profile") or {}
    print(f"{problem}: {elapsed:.1f} s wall; {result.metrics.get('summary')}; problems {profile.get('problems')}",
          file=sys.stderr)
    assert result.status == "ok" and profile.get("source") == "ncu" and profile.get("kernels"), (result.error,
                                                                                                 profile)
    return elapsed, profile


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    rows = []
    async with warm_worker() as (_, written, client):
        for name, problem, candidate in written:
            first, _ = await timed_profile(client, candidate, problem)
            warm = []
            for _ in range(max(repeat, 1)):
                elapsed, profile = await timed_profile(client, candidate, problem)
                warm.append(elapsed)
            kernels = ", ".join(f"{k['kernel']} {k['duration_ms']:.3f} ms {k.get('bound')}" for k in profile["kernels"])
            rows += [
                (f"{name}: first profile (build, ceilings measured)", f"{first:.1f} s", "", ""),
                (f"{name}: warm profile, default sections (n={len(warm)})", f"{statistics.median(warm):.1f} s",
                 f"<= {TARGET_S:.0f} s", "met" if max(warm) <= TARGET_S else "NOT met"),
                (f"{name}: kernels profiled", kernels, "", f"{len(profile['kernels'][0]['findings'])} hints"),
            ]
    return rows


if __name__ == "__main__":
    report.main("profile_latency.py", measure, default_repeat=2, machine_extra=gpu_name)
