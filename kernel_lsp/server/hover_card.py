"""The markdown card a hover on a kernel name shows: time, speedup, roofline position and bound, the top hints with
their estimated gains, registers and occupancy, and a link to the roofline chart.

Pure functions of plain data (a KernelProfile of contracts.profile_report, ptxas resource dicts from the compile
feature's `ptxas-resources` findings): no LSP, no I/O, so the card is cheap to make on every hover.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kernel_lsp.contracts.profile_report import KernelProfile, Metric, ProfileHint
from kernel_lsp.verify.verdict import readable_ms
from profilers.ncu import SPEED_OF_LIGHT
from profilers.roofline import MEMORY_UNITS, Ceilings, KernelPoint

TOP_HINTS = 3
NO_PROFILE = "no profile yet: use 'Profile this kernel'"
# ncu's "local" speedups are a share of one unit's work, not of the kernel's time: they rank after the others
KERNEL_WIDE = {"global", "estimate"}
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)][.!?])\s*(?=[A-Z])")


@dataclass(frozen=True)
class CardFacts:
    kernel: str
    profile: KernelProfile | None = None
    ceilings: Ceilings | None = None
    point: KernelPoint | None = None
    resources: tuple[dict[str, Any], ...] = ()  # ptxas-resources data["resources"] entries
    verify_summary: str | None = None  # the verify code lens's title: correctness, speedups, time
    chart_uri: str | None = None
    source: str | None = None  # where the profile came from: "ncu", "import-csv FILE", "static"
    no_profile: str = NO_PROFILE  # what to say without a profile ("no profile: needs a GPU ..." where none can run)


def hover_card(facts: CardFacts) -> str:
    """The card, each line once: the verify summary, ptxas's figures and the hints can say the same thing."""
    return unique_lines(_card(facts))


def unique_lines(markdown: str) -> str:
    """The markdown without a line that repeats an earlier one (blank lines, which separate blocks, kept);
    a block left empty is dropped with its separator."""
    seen: set[str] = set()
    blocks = []
    for block in markdown.split("\n\n"):
        kept = []
        for line in block.split("\n"):
            key = line.strip()
            if key and key in seen:
                continue
            seen.add(key)
            kept.append(line)
        if any(line.strip() for line in kept):
            blocks.append("\n".join(kept))
    return "\n\n".join(blocks)


def _card(facts: CardFacts) -> str:
    profile = facts.profile
    blocks = [header(facts.kernel, profile)]
    if facts.verify_summary:
        blocks.append(f"verify: {facts.verify_summary}")
    if profile is None:
        blocks += [line for line in (resources_line(facts.resources),) if line]
        blocks.append(f"_{facts.no_profile}_")
        return "\n\n".join(blocks)
    blocks += [line for line in (roofline_line(profile, facts.ceilings, facts.point),
                                 hints_block(profile.findings),
                                 occupancy_line(profile, facts.resources)) if line]
    if facts.chart_uri:
        blocks.append(f"![roofline of {facts.kernel}]({facts.chart_uri})")
    if facts.source:
        blocks.append(f"_profile: {facts.source}_")
    return "\n\n".join(blocks)


def header(kernel: str, profile: KernelProfile | None) -> str:
    parts = [f"**{kernel}**"]
    if profile is not None and profile.duration_ms is not None:
        parts.append(readable_ms(profile.duration_ms))
    if profile is not None and profile.bound:
        parts.append(f"{profile.bound} bound")
    return " · ".join(parts)


# --- roofline -------------------------------------------------------------------------------------------

def roofline_line(profile: KernelProfile, ceilings: Ceilings | None, point: KernelPoint | None) -> str:
    """Where the kernel sits: throughputs of peak, arithmetic intensity against the ridge, achieved vs ceiling."""
    parts = [part for part in (throughputs(profile), intensity(point, ceilings), achieved(point, ceilings)) if part]
    return "roofline: " + " · ".join(parts) if parts else ""


def throughputs(profile: KernelProfile) -> str:
    sol = profile.metrics.sections.get(SPEED_OF_LIGHT) or {}
    memory, compute = _number(sol.get("Memory Throughput")), _number(sol.get("Compute (SM) Throughput"))
    if memory is None or compute is None:
        return ""
    units = [(unit, _number(sol.get(metric))) for unit, metric in MEMORY_UNITS]
    busiest = max(((u, v) for u, v in units if v is not None), key=lambda uv: uv[1], default=None)
    unit = f" ({busiest[0]} {busiest[1]:.1f}%)" if busiest else ""
    return f"memory {memory:.1f}% of peak{unit}, compute {compute:.1f}%"


def intensity(point: KernelPoint | None, ceilings: Ceilings | None) -> str:
    ridge = f" (ridge {ceilings.ridge_point:.3g})" if ceilings else ""
    if point is None:
        return ""
    if point.arithmetic_intensity is None:
        return f"arithmetic intensity unknown ({point.flops_from})"
    return f"arithmetic intensity {point.arithmetic_intensity:.3g} FLOP/B{ridge}"


def achieved(point: KernelPoint | None, ceilings: Ceilings | None) -> str:
    """FLOP/s against the roof at the kernel's intensity when FLOPs were counted, else DRAM bytes/s against the
    bandwidth ceiling."""
    if point is None or ceilings is None:
        return ""
    if point.flop_rate is not None and point.arithmetic_intensity is not None:
        roof = ceilings.attainable_flops(point.arithmetic_intensity)
        share = percent(point.flop_rate, roof)
        return f"{point.flop_rate / 1e12:.3g} of {roof / 1e12:.3g} TFLOP/s attainable ({share})"
    if point.byte_rate is not None:
        ceiling = ceilings.dram_bandwidth_gbs * 1e9
        return (f"DRAM {point.byte_rate / 1e9:.0f} of {ceilings.dram_bandwidth_gbs:.0f} GB/s "
                f"({percent(point.byte_rate, ceiling)})")
    return ""


def percent(value: float, of: float) -> str:
    return f"{100 * value / of:.1f}%" if of else "n/a"


# --- hints ----------------------------------------------------------------------------------------------

def top_hints(findings: list[ProfileHint], count: int = TOP_HINTS) -> list[ProfileHint]:
    """The findings with the largest estimated gains, one per code; kernel-wide gains before ncu's local ones."""
    def rank(f: ProfileHint) -> tuple[bool, bool, float]:
        speedup = f.estimated_speedup
        return speedup is not None, f.speedup_type in KERNEL_WIDE, speedup or 0.0

    best: dict[str, ProfileHint] = {}
    for finding in sorted(findings, key=rank, reverse=True):
        best.setdefault(finding.code, finding)
    return list(best.values())[:count]


def hints_block(findings: list[ProfileHint]) -> str:
    chosen = top_hints(findings)
    if not chosen:
        return "no hints"
    lines = [f"{i}. `{f.code}` {gain(f)}: {short_message(f.message)}" for i, f in enumerate(chosen, 1)]
    rest = len({f.code for f in findings}) - len(chosen)
    more = f"\n\n{rest} more as diagnostics" if rest > 0 else ""
    return "top hints:\n\n" + "\n".join(lines) + more


def gain(finding: ProfileHint) -> str:
    speedup = finding.estimated_speedup
    if speedup is None:
        return "(gain not estimated)"
    kind = finding.speedup_type
    scope = " of one unit's time" if kind == "local" else ""
    return f"(est. gain {speedup:.3g}%{scope})"


def short_message(message: str) -> str:
    """The first sentence, whole (one cut short reads as another claim); the rest is in the diagnostic."""
    return _SENTENCE_END.split(message.strip(), maxsplit=1)[0]


# --- registers and occupancy ----------------------------------------------------------------------------

def occupancy_line(profile: KernelProfile, resources: tuple[dict[str, Any], ...]) -> str:
    parts = []
    if profile.registers is not None:
        parts.append(f"{profile.registers} registers/thread")
    if profile.occupancy_pct is not None:
        parts.append(f"achieved occupancy {profile.occupancy_pct:.1f}%")
    line = " · ".join(parts)
    ptxas = resources_line(resources)
    return "\n\n".join(p for p in (line, ptxas) if p)


def resources_line(resources: tuple[dict[str, Any], ...]) -> str:
    """ptxas's figures per architecture, as the compile feature read them."""
    entries = (f"ptxas {r['arch']}: {r['registers']} registers, {r['sharedBytes']} B smem, "
               f"{r['spillStores']}/{r['spillLoads']} B spills, {r['stackFrame']} B stack" for r in resources)
    return "; ".join(dict.fromkeys(entries))  # one kernel compiled twice for an arch (two findings) reads once


def _number(metric: Metric | None) -> float | None:
    """An ncu metric's value when it is a number (ncu prints some as text)."""
    value = metric.value if metric is not None else None
    return float(value) if isinstance(value, (int, float)) else None
