"""Roofline: the ceilings of a GPU, a kernel's point under them, and what bounds the kernel.

Ceilings are measured by the profile job (kernel_lsp.profile.measure.measured_ceilings: DRAM copy bandwidth and the
fp16/bf16 tensor-core matmul rate, the fp32 rate as an fp32 matmul with TF32 off), once per device and torch
version, cached as JSON; this module only holds them (Ceilings). Where nothing was measured (a CSV made on another machine) the theoretical ceilings come from
ncu's own raw page: its DRAM peak, and SMs × fp32 lanes × 2 × the maximum SM clock.

A kernel's point: DRAM bytes are dram__bytes_read.sum + dram__bytes_write.sum (raw page), or else the details
page's DRAM Throughput % of the bandwidth ceiling over the duration. FLOPs are counted only when the
SpeedOfLight_RooflineChart section was collected (smsp__sass_thread_inst_executed_op_{f,d,h}{fma,add,mul}_pred_on,
an FMA counting 2); the shared H200 fixture lacks them, so its points have bytes but no FLOPs.

The bound (thresholds):
- latency: neither ncu's Memory Throughput nor its Compute (SM) Throughput reaches LATENCY_BELOW_PCT (60%) of
  peak; the units mostly wait (ncu's SOLBottleneck rule uses the same 60%). The fixture's tiny_grid: 0.1% / 0.03%.
- memory or compute: otherwise whichever throughput is higher; for memory, the busiest unit (DRAM, L2, L1/TEX).
  The fixture: vec_add memory (DRAM 67%), matmul_naive memory (L1/TEX 98%: DRAM is at 0.3%, so a DRAM-only
  roofline would wrongly call it compute bound), divergent compute (87%).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from profilers.ncu import SPEED_OF_LIGHT, KernelLaunch

LATENCY_BELOW_PCT = 60.0
# fp32 lanes per SM by compute capability (CUDA C Programming Guide, arithmetic instructions table)
FP32_LANES_PER_SM = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128,
                     (10, 0): 128, (10, 3): 128, (12, 0): 128}
MEMORY_UNITS = (("DRAM", "DRAM Throughput"), ("L2", "L2 Cache Throughput"), ("L1/TEX", "L1/TEX Cache Throughput"))
FLOP_COUNTERS = {"fma": 2, "add": 1, "mul": 1}
FLOP_PRECISIONS = ("f", "d", "h")


# --- ceilings -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ceilings:
    gpu: str
    dram_bandwidth_gbs: float  # bytes read + written per second, GB/s
    fp32_tflops: float
    tensor_tflops: float | None  # fp16/bf16 tensor cores; None when unknown
    how: str

    @property
    def ridge_point(self) -> float:
        """The fp32 ridge: FLOP per DRAM byte above which the fp32 rate, not bandwidth, caps a kernel."""
        return self.fp32_tflops * 1e12 / (self.dram_bandwidth_gbs * 1e9)

    def attainable_flops(self, intensity: float, tflops: float | None = None) -> float:
        """The roof at an arithmetic intensity, in FLOP/s: min(peak, intensity × bandwidth)."""
        peak = (tflops or self.fp32_tflops) * 1e12
        return min(peak, intensity * self.dram_bandwidth_gbs * 1e9)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "ridge_point": self.ridge_point}


def theoretical_ceilings(launch: KernelLaunch) -> Ceilings | None:
    """The ceilings ncu's raw page implies (its DRAM peak; SMs × fp32 lanes × 2 × max clock); None without it."""
    bandwidth = ncu_dram_peak_gbs(launch)
    fp32 = ncu_fp32_peak_tflops(launch)
    if bandwidth is None or fp32 is None:
        return None
    name = launch.raw.get("device__attribute_display_name")
    return Ceilings(gpu=name.text if name else f"CC {launch.compute_capability}", dram_bandwidth_gbs=bandwidth, fp32_tflops=fp32, tensor_tflops=None,
                    how="theoretical, from ncu's DRAM peak and SMs × fp32 lanes × 2 × max SM clock")


def ncu_dram_peak_gbs(launch: KernelLaunch) -> float | None:
    """Achieved DRAM bytes/s over its percent of peak gives the peak ncu measures against."""
    rate = sum(launch.raw_value(f"dram__bytes_{way}.sum.per_second") or 0.0 for way in ("read", "write"))
    percent = sum(launch.raw_value(f"dram__bytes_{way}.sum.pct_of_peak_sustained_elapsed") or 0.0
                  for way in ("read", "write"))
    return rate / (percent / 100) / 1e9 if rate > 0 and percent > 0 else None


def ncu_fp32_peak_tflops(launch: KernelLaunch) -> float | None:
    sms = launch.raw_value("device__attribute_multiprocessor_count")
    clock_khz = launch.raw_value("device__attribute_max_gpu_frequency_khz")
    major = launch.raw_value("device__attribute_compute_capability_major") or 0
    minor = launch.raw_value("device__attribute_compute_capability_minor") or 0
    lanes = FP32_LANES_PER_SM.get((int(major), int(minor)))
    if not (sms and clock_khz and lanes):
        return None
    return sms * lanes * 2 * clock_khz * 1e3 / 1e12


# --- a kernel's point -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelPoint:
    kernel: str
    duration_s: float
    dram_bytes: float | None
    flops: float | None
    bytes_from: str  # "ncu DRAM counters", "DRAM Throughput % of the bandwidth ceiling", "unknown"
    flops_from: str  # "ncu FLOP counters" or why there are none

    @property
    def byte_rate(self) -> float | None:
        return None if self.dram_bytes is None else self.dram_bytes / self.duration_s

    @property
    def flop_rate(self) -> float | None:
        return None if self.flops is None else self.flops / self.duration_s

    @property
    def arithmetic_intensity(self) -> float | None:
        """FLOP per DRAM byte."""
        if self.flops is None or not self.dram_bytes:
            return None
        return self.flops / self.dram_bytes

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "byte_rate": self.byte_rate, "flop_rate": self.flop_rate,
                "arithmetic_intensity": self.arithmetic_intensity}


def kernel_point(launch: KernelLaunch, ceilings: Ceilings | None = None) -> KernelPoint | None:
    """The launch's bytes and FLOPs over its duration; None when ncu gave no duration."""
    duration = launch.value(SPEED_OF_LIGHT, "Duration") or launch.raw_value("gpu__time_duration.sum")
    if not duration:
        return None
    dram_bytes, bytes_from = point_bytes(launch, duration, ceilings)
    flops = counted_flops(launch)
    flops_from = "ncu FLOP counters" if flops is not None else \
        "not collected: profile with the SpeedOfLight_RooflineChart section"
    return KernelPoint(kernel=launch.base_name, duration_s=duration, dram_bytes=dram_bytes, flops=flops,
                       bytes_from=bytes_from, flops_from=flops_from)


def point_bytes(launch: KernelLaunch, duration: float, ceilings: Ceilings | None) -> tuple[float | None, str]:
    read, written = launch.raw_value("dram__bytes_read.sum"), launch.raw_value("dram__bytes_write.sum")
    if read is not None and written is not None:
        return read + written, "ncu DRAM counters"
    percent = launch.value(SPEED_OF_LIGHT, "DRAM Throughput")
    if percent is not None and ceilings is not None:
        return percent / 100 * ceilings.dram_bandwidth_gbs * 1e9 * duration, \
            "DRAM Throughput % of the bandwidth ceiling"
    return None, "unknown: neither ncu's DRAM counters nor a bandwidth ceiling"


def counted_flops(launch: KernelLaunch) -> float | None:
    """Σ over fp32/fp64/fp16 of 2·fma + add + mul thread instructions; None when ncu collected none of them."""
    total, seen = 0.0, False
    for precision in FLOP_PRECISIONS:
        for operation, weight in FLOP_COUNTERS.items():
            count = flop_counter(launch, f"smsp__sass_thread_inst_executed_op_{precision}{operation}_pred_on")
            if count is not None:
                total, seen = total + weight * count, True
    return total if seen else None


def flop_counter(launch: KernelLaunch, metric: str) -> float | None:
    """A thread-instruction count: as a sum, or as the roofline chart's rate per elapsed cycle × cycles."""
    count = launch.raw_value(f"{metric}.sum")
    if count is not None:
        return count
    per_cycle = launch.raw_value(f"{metric}.sum.per_cycle_elapsed")
    cycles = launch.raw_value("smsp__cycles_elapsed.avg")
    return per_cycle * cycles if per_cycle is not None and cycles is not None else None


# --- the bound ------------------------------------------------------------------------------------------

BoundKind = Literal["memory", "compute", "latency"]


@dataclass(frozen=True)
class Bound:
    kind: BoundKind
    memory_pct: float  # ncu's Memory Throughput: the busiest memory unit, percent of its peak
    compute_pct: float  # ncu's Compute (SM) Throughput
    memory_unit: str  # the busiest of DRAM, L2, L1/TEX
    memory_unit_pct: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def classify_bound(launch: KernelLaunch) -> Bound | None:
    """Memory, compute or latency bound from the Speed Of Light percentages; None without that section."""
    memory = launch.value(SPEED_OF_LIGHT, "Memory Throughput")
    compute = launch.value(SPEED_OF_LIGHT, "Compute (SM) Throughput")
    if memory is None or compute is None:
        return None
    unit, unit_pct = busiest_memory_unit(launch)
    if max(memory, compute) < LATENCY_BELOW_PCT:
        kind: BoundKind = "latency"
    else:
        kind = "memory" if memory >= compute else "compute"
    return Bound(kind=kind, memory_pct=memory, compute_pct=compute, memory_unit=unit, memory_unit_pct=unit_pct)


def busiest_memory_unit(launch: KernelLaunch) -> tuple[str, float]:
    readings = [(unit, launch.value(SPEED_OF_LIGHT, metric)) for unit, metric in MEMORY_UNITS]
    known = [(unit, value) for unit, value in readings if value is not None]
    return max(known, key=lambda reading: reading[1]) if known else ("memory", 0.0)


# --- the chart ------------------------------------------------------------------------------------------

CHART_WIDTH, CHART_HEIGHT = 560, 360
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 28, 44


@dataclass(frozen=True)
class LogAxis:
    low_exponent: int
    high_exponent: int
    pixel_low: float
    pixel_high: float

    def __call__(self, value: float) -> float:
        fraction = (math.log10(value) - self.low_exponent) / (self.high_exponent - self.low_exponent)
        return self.pixel_low + fraction * (self.pixel_high - self.pixel_low)


def decade_span(values: Sequence[float]) -> tuple[int, int]:
    positive = [v for v in values if v > 0]
    low, high = math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)))
    return low, max(high, low + 1)


def roofline_svg(ceilings: Ceilings, points: Sequence[KernelPoint]) -> str:
    """A self-contained log-log roofline chart: bandwidth and compute roofs, one labelled dot per kernel."""
    plotted = [p for p in points if p.arithmetic_intensity is not None and p.flop_rate]
    peak = max(ceilings.fp32_tflops, ceilings.tensor_tflops or 0) * 1e12
    x_low, x_high = decade_span([ceilings.ridge_point / 100, ceilings.ridge_point * 10]
                                + [p.arithmetic_intensity for p in plotted])  # type: ignore[misc]
    y_low, y_high = decade_span([peak / 1e4, peak] + [p.flop_rate for p in plotted])  # type: ignore[misc]
    x = LogAxis(x_low, x_high, MARGIN_LEFT, CHART_WIDTH - MARGIN_RIGHT)
    y = LogAxis(y_low, y_high, CHART_HEIGHT - MARGIN_BOTTOM, MARGIN_TOP)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" height="{CHART_HEIGHT}" '
             f'viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" font-family="sans-serif" font-size="11">',
             f'<text x="{MARGIN_LEFT}" y="16" font-size="13">Roofline: {html.escape(ceilings.gpu)}</text>']
    parts += axis_elements(x, y)
    parts += roof_elements(ceilings, x, y)
    parts += [point_element(p, x, y) for p in plotted]
    missing = [p.kernel for p in points if p not in plotted]
    if missing:
        parts.append(f'<text x="{MARGIN_LEFT + 6}" y="{MARGIN_TOP + 14}" fill="#666">no FLOP counters for: '
                     f'{html.escape(", ".join(missing))}</text>')
    return "\n".join(parts + ["</svg>"])


def axis_elements(x: LogAxis, y: LogAxis) -> list[str]:
    left, right, top, bottom = x.pixel_low, x.pixel_high, y.pixel_high, y.pixel_low
    elements = [f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" '
                f'stroke="#888"/>']
    for exponent in range(x.low_exponent, x.high_exponent + 1):
        px = x(10.0**exponent)
        elements.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{bottom}" stroke="#eee"/>')
        elements.append(f'<text x="{px:.1f}" y="{bottom + 14}" text-anchor="middle">1e{exponent}</text>')
    for exponent in range(y.low_exponent, y.high_exponent + 1):
        py = y(10.0**exponent)
        elements.append(f'<line x1="{left}" y1="{py:.1f}" x2="{right}" y2="{py:.1f}" stroke="#eee"/>')
        elements.append(f'<text x="{left - 4}" y="{py + 4:.1f}" text-anchor="end">1e{exponent}</text>')
    elements.append(f'<text x="{(left + right) / 2}" y="{bottom + 32}" text-anchor="middle">'
                    'arithmetic intensity (FLOP/byte of DRAM)</text>')
    elements.append(f'<text x="14" y="{(top + bottom) / 2}" text-anchor="middle" '
                    f'transform="rotate(-90 14 {(top + bottom) / 2})">FLOP/s</text>')
    return elements


def roof_elements(ceilings: Ceilings, x: LogAxis, y: LogAxis) -> list[str]:
    x_low, x_high = 10.0**x.low_exponent, 10.0**x.high_exponent
    roofs = [(ceilings.fp32_tflops, "fp32", "#c33", "")]
    if ceilings.tensor_tflops:
        roofs.append((ceilings.tensor_tflops, "fp16/bf16 tensor", "#36c", ' stroke-dasharray="5 3"'))
    elements = []
    for tflops, label, colour, dash in roofs:
        ridge = tflops * 1e12 / (ceilings.dram_bandwidth_gbs * 1e9)
        start = max(x_low, 10.0**y.low_exponent / (ceilings.dram_bandwidth_gbs * 1e9))
        corners = [(start, ceilings.attainable_flops(start, tflops)), (ridge, tflops * 1e12),
                   (x_high, tflops * 1e12)]
        path = " ".join(f"{x(cx):.1f},{y(cy):.1f}" for cx, cy in corners)
        elements.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        elements.append(f'<text x="{x(x_high) - 4:.1f}" y="{y(tflops * 1e12) - 4:.1f}" text-anchor="end" '
                        f'fill="{colour}">{label} {tflops:.3g} TFLOP/s</text>')
    elements.append(f'<text x="{x(ceilings.ridge_point) + 4:.1f}" y="{y.pixel_low - 4}" fill="#c33">'
                    f'DRAM {ceilings.dram_bandwidth_gbs:.4g} GB/s, ridge {ceilings.ridge_point:.3g}</text>')
    return elements


def point_element(point: KernelPoint, x: LogAxis, y: LogAxis) -> str:
    px, py = x(point.arithmetic_intensity), y(point.flop_rate)  # type: ignore[arg-type]
    name = html.escape(point.kernel)
    return (f'<g><title>{name}: {point.arithmetic_intensity:.3g} FLOP/B, {point.flop_rate:.3g} FLOP/s</title>'
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="#222"/>'
            f'<text x="{px + 6:.1f}" y="{py - 6:.1f}">{name}</text></g>')
