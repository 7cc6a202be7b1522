"""The Ray backend on a machine with GPUs: one actor per GPU (num_gpus=1, Ray's CUDA_VISIBLE_DEVICES), each worker
on its GPU, and a CUDA load_inline candidate gets the same verdict and codes as through the local worker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kernel_lsp.kinds.verify import verify_job
from kernel_lsp.worker.client import WorkerClient
from tests.gpu import candidates as c
from tests.gpu.test_worker_gpu import gpu_present

ray = pytest.importorskip("ray", reason="the Ray backend's tests need ray: pip install 'kernel-lsp[ray]'")
from kernel_lsp.worker.ray_backend import RayBackend  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU with CUDA torch"),
              pytest.mark.skipif(not (c.KERNELBENCH / c.RELU_PROBLEM).is_file(),
                                 reason=f"needs the KernelBench problems at {c.KERNELBENCH}"),
              pytest.mark.timeout(900)]
OPTIONS = {"device": "cuda", "trials": 3, "timedCalls": 20, "warmup": 3, "baselines": ["eager"]}


def outcome(result) -> tuple:
    return (result.status, result.metrics.get("verdict"), (result.metrics.get("report") or {}).get("device"),
            sorted({f["code"] for f in result.findings}))


async def test_one_actor_per_gpu_gives_the_local_verdicts(tmp_path: Path):
    import torch

    jobs = []
    for name, text in (("honest", c.HONEST_RELU), ("in_place", c.IN_PLACE_RELU)):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        jobs.append(verify_job(path, c.KERNELBENCH / c.RELU_PROBLEM, OPTIONS))
    local = WorkerClient(job_timeout_s=900)
    try:
        expected = [outcome(await local.run(job)) for job in jobs]
    finally:
        await local.close()
    assert [e[1] for e in expected] == ["verified", "rejected"], expected

    ray.init(include_dashboard=False, log_to_driver=False)
    backend = RayBackend(job_timeout_s=900)
    try:
        await backend.ping()
        gpus = torch.cuda.device_count()
        assert int(ray.cluster_resources()["GPU"]) == gpus
        assert backend.capacity == gpus  # one actor per GPU
        assert all(a.info.cuda and a.info.gpu for a in backend.actors), [a.info for a in backend.actors]
        assert sorted(a.info.cuda_visible_devices for a in backend.actors) == [str(i) for i in range(gpus)]
        assert backend.status.gpu.startswith(f"{gpus} Ray GPU (")
        results = await asyncio.gather(*(backend.run(job) for job in jobs))
    finally:
        await backend.close()
        ray.shutdown()
    assert [outcome(r) for r in results] == expected
