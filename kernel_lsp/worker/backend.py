"""Which backend runs the jobs: the local (or one remote) worker through a WorkerClient, or a pool of Ray actors
(RayBackend). Both offer run(job, progress, timeout_s), ping(), close(), status and capacity, so the server and
the commands use either the same way."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from kernel_lsp.config import Settings
from kernel_lsp.worker.protocol import Job, Result

if TYPE_CHECKING:
    from kernel_lsp.worker.client import WorkerStatus


class JobRunner(Protocol):
    status: WorkerStatus
    capacity: int

    async def run(self, job: Job, progress: Callable[[str, float | None], None] | None = None,
                  timeout_s: float | None = None) -> Result: ...

    async def ping(self) -> float: ...

    async def close(self) -> None: ...


def make_runner(settings: Settings, token: str | None = None, worker: str | None = None, backend: str | None = None,
                ray_address: str | None = None, ray_actors: int | None = None, device: str | None = None,
                on_status: Callable[[WorkerStatus], None] | None = None,
                on_message: Callable[[str], None] | None = None, shared: bool = False) -> JobRunner:
    """The runner the settings name; the other arguments, when given, override them (command-line options).
    device: where the jobs run ("cpu": Ray actors need no GPU even on a cluster that has them). shared: a local
    worker is the user's shared one (worker/rendezvous.py), found or left running, not a child of this process."""
    if (backend or settings.worker.backend) == "ray":
        from kernel_lsp.worker.ray_backend import RayBackend

        return RayBackend(address=settings.worker.ray_address if ray_address is None else ray_address,
                          actors=settings.worker.ray_actors if ray_actors is None else ray_actors,
                          job_timeout_s=settings.worker.job_timeout_s, max_frame=settings.worker.max_frame_mib * 2**20,
                          on_status=on_status, on_message=on_message,
                          use_gpus=False if (device or settings.verify.device) == "cpu" else None)
    from kernel_lsp.worker.client import WorkerClient, worker_environment
    from kernel_lsp.worker.rendezvous import SharedWorker

    address = settings.worker.address if worker is None else worker
    return WorkerClient(address=address, token=token, max_frame=settings.worker.max_frame_mib * 2**20,
                        job_timeout_s=settings.worker.job_timeout_s, on_status=on_status, on_message=on_message,
                        shared=SharedWorker(sys.executable, worker_environment(), settings.worker.max_frame_mib)
                        if shared and not address else None)


def runner_config(settings: Settings) -> tuple:
    """What in the settings makes another runner (the server replaces its runner when this changes)."""
    return (settings.worker.backend, settings.worker.address, settings.worker.token_file, settings.worker.job_timeout_s,
            settings.worker.max_frame_mib, settings.worker.ray_address, settings.worker.ray_actors)
