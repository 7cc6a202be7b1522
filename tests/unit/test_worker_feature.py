"""WorkerFeature's status notifications: only the worker connection in use speaks for the status bar."""

from __future__ import annotations

import asyncio

from kernel_lsp.config import resolve_settings
from kernel_lsp.server.worker_feature import STATUS_NOTIFICATION, WorkerFeature


async def test_a_replaced_connection_closing_late_does_not_overwrite_the_status():
    sent: list[dict] = []
    feature = WorkerFeature(notify=lambda method, params: sent.append(params) if method == STATUS_NOTIFICATION
                            else None, tell_user=lambda message: None)
    local, _ = resolve_settings({}, {})
    remote, _ = resolve_settings({}, {"worker": "tcp:127.0.0.1:1"})
    old = feature.client(local)
    new = feature.client(remote)
    assert new is not old
    new._set_status(state="failed", message="connection refused")
    old._set_status(state="stopped")  # what the old client's close() reports, after the new one's state
    await asyncio.sleep(0)
    assert [(s["state"], s["address"]) for s in sent] == [("failed", "tcp:127.0.0.1:1")]
    new._set_status(state="stopped")
    assert [s["state"] for s in sent] == ["failed", "stopped"]


def test_the_backend_setting_picks_the_runner_and_a_change_replaces_it():
    from kernel_lsp.worker.client import WorkerClient
    from kernel_lsp.worker.ray_backend import RayBackend

    feature = WorkerFeature(notify=lambda method, params: None, tell_user=lambda message: None)
    on_ray, problems = resolve_settings({}, {"backend": "ray", "rayAddress": "auto", "rayActors": 3})
    assert problems == []
    runner = feature.client(on_ray)
    assert isinstance(runner, RayBackend) and (runner.address, runner.requested) == ("auto", 3)
    assert runner.status.address == "ray:auto" and runner.capacity == 3
    assert feature.client(on_ray) is runner  # the same settings: the same pool
    local, _ = resolve_settings({}, {"worker": "tcp:127.0.0.1:1"})
    bad, problems = resolve_settings({}, {"backend": "slurm"})
    assert bad.worker.backend == "local" and "expected one of local, ray" in problems[0]
    assert isinstance(WorkerFeature(lambda m, p: None, lambda m: None).client(local), WorkerClient)


def test_cpu_jobs_get_cpu_actors_even_on_a_cluster_with_gpus():
    from kernel_lsp.worker.backend import make_runner

    on_ray, _ = resolve_settings({}, {"backend": "ray"})
    assert make_runner(on_ray).use_gpus is None  # GPU actors where the cluster has GPUs
    assert make_runner(on_ray, device="cpu").use_gpus is False  # --device cpu
    on_cpu, _ = resolve_settings({}, {"backend": "ray", "verifyDevice": "cpu"})
    assert make_runner(on_cpu).use_gpus is False
