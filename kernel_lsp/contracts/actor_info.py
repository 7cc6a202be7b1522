"""What a Ray actor (worker/ray_backend.py `WorkerActor.ready`) tells the backend once its worker is warm, typed:
encoded in the actor's process by contracts.codec, decoded by the backend where Ray hands it over (an actor of
another install is then an actor that did not start, its error naming the keys). Wire names: `cudaVisibleDevices`.
Stdlib only, as the other contracts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActorInfo:
    host: str  # the node's host name
    pid: int  # the actor's process
    gpu: str | None  # its worker's GPU, as NVML names it; None: no GPU seen
    cuda: bool  # its worker's torch sees a CUDA device
    problem: str | None  # what its worker's device-info said is missing (no torch, no GPU)
    cuda_visible_devices: str | None  # the GPU Ray gave it (CUDA_VISIBLE_DEVICES); None: not set
