"""How close honest memory-bound kernels come to the bytes floor (GPU), the data the floor's margin is set from:

    python benchmarks/floor_margin.py [--repeat N] [--record]

For a copy, ReLU, softmax over rows and a sum over rows (PyTorch's own kernels: tuned, honest, memory-bound), at
sizes from far above the L2 cache down to below it, each timed the way the verifier times a candidate
(kernel_lsp.candidate.timing.time_callable: L2 flushed before each call, input sets rotated): the median over the
bytes floor of verify/floor.py (inputs read and outputs written once at the measured copy bandwidth), and over
an L2-aware floor (outputs up to the L2 size may stay in the cache when the call ends, so only the bytes beyond
it must reach memory). The smallest ratio seen is the most an honest kernel beat the floor by: the margin must
stay below it. `--repeat` runs each case that many times (the smallest median counts).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402

MIB = 1 << 20
SIZES_MIB = (4096, 1024, 256, 64, 32, 8)  # per input; H200's L2 is 50-60 MiB


def cases(torch):  # noqa: ANN001 - torch is imported only where a GPU is present
    return {
        "copy": lambda x: x.clone(),
        "relu": torch.relu,
        "softmax (rows of 4096)": lambda x: torch.softmax(x.view(-1, 4096), dim=1),
        "sum over rows of 4096": lambda x: x.view(-1, 4096).sum(dim=1),
    }


async def measure(repeat: int) -> list[tuple[str, str, str, str]]:
    import torch

    from kernel_lsp.verify.floor import device_peaks, memory_ms, problem_work
    from kernel_lsp.candidate.timing import make_input_sets, time_callable

    if not torch.cuda.is_available():
        return [("no GPU: the floor's margin is set from a GPU's honest kernels", "-", "", "")]
    device = torch.device("cuda", torch.cuda.current_device())
    peaks = device_peaks(device, None)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    rows = [(f"measured copy bandwidth ({peaks.how})", f"{peaks.bandwidth_gbs:.0f} GB/s", "", ""),
            ("L2 cache", f"{l2 / MIB:.0f} MiB", "", "")]
    worst_plain, worst_l2 = float("inf"), float("inf")
    for name, fn in cases(torch).items():
        for size_mib in SIZES_MIB:
            elements = size_mib * MIB // 4
            sets = make_input_sets(lambda: [torch.rand(elements)], 2, 0, str(device))
            work = problem_work(fn, sets[0])
            output_bytes = sum(t.numel() * t.element_size() for t in [fn(*sets[0])])
            median = min(time_callable(fn, sets, device=str(device), calls=50, warmup=5).median_ms
                         for _ in range(max(repeat, 1)))
            plain = memory_ms(work, peaks)
            l2_aware = (work.bytes - min(output_bytes, l2)) / (peaks.bandwidth_gbs * 1e9) * 1e3
            worst_plain, worst_l2 = min(worst_plain, median / plain), min(worst_l2, median / l2_aware)
            rows.append((f"{name}, {size_mib} MiB in", f"{median:.4f} ms",
                         f"floor {plain:.4f} ms / L2-aware {l2_aware:.4f} ms",
                         f"ratio {median / plain:.2f} / {median / l2_aware:.2f}"))
            del sets
            torch.cuda.empty_cache()
    rows.append(("smallest ratio, median over floor (plain / L2-aware)", f"{worst_plain:.2f} / {worst_l2:.2f}",
                 "the margin stays below", ""))
    return rows


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"


if __name__ == "__main__":
    report.main("floor_margin.py", measure, default_repeat=2, machine_extra=gpu_name)
