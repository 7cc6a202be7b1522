"""The GPU kernels a forward call launches, with the device time of each, from torch's profiler (kineto/CUPTI).

Used for the reference side of a profile: which PyTorch kernels a candidate replaces and what they cost. Kernels
are grouped by the name the profiler reports; device time and launch count are per forward call (the profiled
calls divided evenly), so a forward that runs the same kernel three times shows calls=3. Needs torch with CUDA;
`forward_kernels` raises KernelTimesUnavailable with the reason otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

PROFILED_CALLS = 3


class KernelTimesUnavailable(Exception):
    """torch's profiler cannot see GPU kernels here; the message says why."""


@dataclass(frozen=True)
class KernelTime:
    name: str  # as the profiler reports it: 'void at::native::vectorized_elementwise_kernel<...>(...)'
    device_ms: float  # summed over the kernel's launches in one forward call
    calls: int  # launches per forward call

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kernel_times(events: Iterable[tuple[str, float]], forward_calls: int) -> list[KernelTime]:
    """(name, duration in ms) per launch over `forward_calls` calls -> per-call totals, the costliest first."""
    totals: dict[str, list[float]] = {}
    for name, duration_ms in events:
        totals.setdefault(name, []).append(duration_ms)
    calls = max(forward_calls, 1)
    times = [KernelTime(name, sum(durations) / calls, max(round(len(durations) / calls), 1))
             for name, durations in totals.items()]
    return sorted(times, key=lambda t: t.device_ms, reverse=True)


def forward_kernels(forward: Callable[[], Any], calls: int = PROFILED_CALLS) -> list[KernelTime]:
    """Runs `forward` once unprofiled (lazy initialisation, autotuning), then `calls` times under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile, supported_activities

    if not torch.cuda.is_available():
        raise KernelTimesUnavailable("CUDA is not available to this process")
    if ProfilerActivity.CUDA not in supported_activities():
        raise KernelTimesUnavailable("torch's profiler cannot see CUDA kernels here (built without kineto/CUPTI)")
    with torch.no_grad():
        forward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as recorded:
            for _ in range(calls):
                forward()
            torch.cuda.synchronize()
    return kernel_times(_kernel_events(recorded), calls)


def _kernel_events(recorded: Any) -> list[tuple[str, float]]:
    results = getattr(getattr(recorded, "profiler", None), "kineto_results", None)
    if results is None:
        raise KernelTimesUnavailable("this torch's profiler does not expose its kineto events")
    return [(event.name(), event.duration_ns() / 1e6) for event in results.events() if _is_kernel(event)]


def _is_kernel(event: Any) -> bool:
    """A kernel on the GPU: not a CPU op, runtime call, memcpy or memset."""
    from torch.autograd import DeviceType

    if event.device_type() != DeviceType.CUDA:
        return False
    activity = getattr(event, "activity_type", lambda: "kernel")()
    return activity not in ("gpu_memcpy", "gpu_memset") and not event.name().startswith(("Memcpy", "Memset"))
