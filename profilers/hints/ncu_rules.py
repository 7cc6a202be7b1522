"""Hints from one Nsight Compute launch: ncu's own rule results, and ours for what ncu does not say.

ncu's rules come through as `ncu-<RuleName>` with ncu's text and estimated speedup. Severity by rule type:
OPT (an optimization opportunity) -> information; WRN (ncu warns about the kernel or the measurement) ->
warning; INF and others -> hint. An INF result with no estimated speedup that follows another result of the
same rule (CPIStall's "Check the Warp Stall Sampling table...") only points at a table and is left out.

Our rules (thresholds):
- hint-small-grid: fewer blocks than SMs; the idle share of SMs is the estimated speedup.
- hint-block-size-not-multiple-of-32: the last warp of every block runs partly empty.
- hint-launch-bound: a launch shorter than LAUNCH_BOUND_US (5 µs) costs about what launching it costs.
- hint-memory-bound / hint-compute-bound / hint-latency-bound: profilers.roofline.classify_bound.
- hint-local-memory: the raw page counts local loads or stores (register spills, run-time-indexed arrays).
- hint-clocks-throttled: the SM clock ncu saw is under THROTTLED_BELOW (85%) of the maximum, or NVML's
  clock-event reasons (gpu_state from kernel_lsp.verify.baselines.gpu_state) name a slowdown.
"""

from __future__ import annotations

from typing import Any

from profilers.hints import Hint, HintSeverity
from profilers.ncu import LAUNCH_STATISTICS, SPEED_OF_LIGHT, KernelLaunch, RuleResult
from profilers.roofline import LATENCY_BELOW_PCT, Bound, Ceilings, KernelPoint, classify_bound, kernel_point

LAUNCH_BOUND_US = 5.0
THROTTLED_BELOW = 0.85
WARP_SIZE = 32
SEVERITY_BY_RULE_TYPE: dict[str, HintSeverity] = {"OPT": "information", "WRN": "warning"}
SLOWDOWN_REASONS = {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown"}
BOUND_ADVICE = {
    "memory": "Move fewer bytes: coalesce accesses, reuse data from shared memory or registers, fuse kernels.",
    "compute": "Make the arithmetic cheaper: tensor cores, lower precision, fewer instructions per element.",
    "latency": "Expose more parallelism: more blocks or warps in flight, more independent work per thread.",
}


def ncu_hints(launch: KernelLaunch, ceilings: Ceilings | None = None,
              gpu_state: dict[str, Any] | None = None) -> list[Hint]:
    """Every hint for one launch: ncu's rule results first, then ours."""
    own = [small_grid(launch), block_size_not_multiple_of_32(launch), launch_bound(launch),
           bound_summary(launch, ceilings), local_memory(launch), clocks_throttled(launch, gpu_state)]
    return rule_hints(launch) + [hint for hint in own if hint is not None]


# --- ncu's rule results ---------------------------------------------------------------------------------

def rule_hints(launch: KernelLaunch) -> list[Hint]:
    hints, seen = [], set()
    for rule in launch.rules:
        if rule.description and not is_pointer_only(rule, seen):
            hints.append(rule_hint(launch, rule))
        seen.add(rule.name)
    return hints


def is_pointer_only(rule: RuleResult, rules_seen: set[str]) -> bool:
    """A footnote to a result already given: INF, no speedup, same rule name."""
    return rule.type == "INF" and rule.speedup is None and rule.name in rules_seen


def rule_hint(launch: KernelLaunch, rule: RuleResult) -> Hint:
    return Hint(code=f"ncu-{rule.name}", kernel=launch.base_name,
                severity=SEVERITY_BY_RULE_TYPE.get(rule.type, "hint"), message=rule.description,
                estimated_speedup=rule.speedup, speedup_type=rule.speedup_type,
                metrics={"rule_type": rule.type, "section": rule.section})


# --- our rules ------------------------------------------------------------------------------------------

def sm_count(launch: KernelLaunch) -> int | None:
    count = launch.value(LAUNCH_STATISTICS, "# SMs") or launch.raw_value("launch__sm_count") \
        or launch.raw_value("device__attribute_multiprocessor_count")
    return int(count) if count else None


def small_grid(launch: KernelLaunch) -> Hint | None:
    sms = sm_count(launch)
    if sms is None or launch.blocks >= sms:
        return None
    idle = 1 - launch.blocks / sms
    return Hint(code="hint-small-grid", kernel=launch.base_name, severity="information",
                message=f"{launch.blocks} blocks on {sms} SMs: {sms - launch.blocks} SMs get no work. Launch at "
                        f"least {sms} blocks (smaller blocks, or a grid-stride loop over a grid sized to the SMs).",
                estimated_speedup=round(100 * idle, 2), speedup_type="estimate",
                metrics={"blocks": launch.blocks, "sms": sms})


def block_size_not_multiple_of_32(launch: KernelLaunch) -> Hint | None:
    threads = launch.threads_per_block
    if threads % WARP_SIZE == 0:
        return None
    lanes = -(-threads // WARP_SIZE) * WARP_SIZE
    wasted = (lanes - threads) / lanes
    return Hint(code="hint-block-size-not-multiple-of-32", kernel=launch.base_name, severity="information",
                message=f"{threads} threads per block fill {lanes // WARP_SIZE} warps with {lanes - threads} "
                        f"lanes idle in each block. Use a multiple of {WARP_SIZE} threads.",
                estimated_speedup=round(100 * wasted, 2), speedup_type="estimate",
                metrics={"threads_per_block": threads, "block_size": list(launch.block_size)})


def launch_bound(launch: KernelLaunch) -> Hint | None:
    duration = launch.value(SPEED_OF_LIGHT, "Duration")
    if duration is None or duration * 1e6 >= LAUNCH_BOUND_US:
        return None
    return Hint(code="hint-launch-bound", kernel=launch.base_name, severity="information",
                message=f"The kernel runs {duration * 1e6:.2f} µs, about what launching it costs. Fuse it with "
                        "its neighbours, batch more work per launch, or capture the sequence in a CUDA graph.",
                speedup_type="estimate", metrics={"duration_us": duration * 1e6})


def bound_summary(launch: KernelLaunch, ceilings: Ceilings | None) -> Hint | None:
    bound = classify_bound(launch)
    if bound is None:
        return None
    metrics: dict[str, Any] = bound.to_dict()
    point = kernel_point(launch, ceilings)
    if point is not None:
        metrics["roofline"] = point.to_dict()
    return Hint(code=f"hint-{bound.kind}-bound", kernel=launch.base_name, severity="information",
                message=f"{bound_reading(bound)}{bandwidth_reading(point, ceilings, bound)} "
                        f"{BOUND_ADVICE[bound.kind]}",
                metrics=metrics)


def bound_reading(bound: Bound) -> str:
    figures = f"memory {bound.memory_pct:.1f}% of peak ({bound.memory_unit} {bound.memory_unit_pct:.1f}%), " \
              f"compute {bound.compute_pct:.1f}%"
    if bound.kind == "latency":
        return f"Latency bound: {figures}; neither reaches {LATENCY_BELOW_PCT:.0f}%, so the units mostly wait."
    return f"{bound.kind.capitalize()} bound: {figures}."


def bandwidth_reading(point: KernelPoint | None, ceilings: Ceilings | None, bound: Bound) -> str:
    """For a memory-bound kernel with a ceiling: the DRAM bandwidth it reached against the ceiling."""
    if bound.kind != "memory" or ceilings is None or point is None or point.byte_rate is None:
        return ""
    return f" DRAM moves {point.byte_rate / 1e9:.0f} GB/s of {ceilings.dram_bandwidth_gbs:.0f} GB/s measured."


def local_memory(launch: KernelLaunch) -> Hint | None:
    loads = launch.raw_value("smsp__sass_inst_executed_op_local_ld.sum") or 0
    stores = launch.raw_value("smsp__sass_inst_executed_op_local_st.sum") or 0
    if loads + stores == 0:
        return None
    return Hint(code="hint-local-memory", kernel=launch.base_name, severity="information",
                message=f"{int(loads):,} local loads and {int(stores):,} local stores (warp instructions): "
                        "registers spilled or an array indexed at run time lives in local memory. Index arrays "
                        "with compile-time constants (unrolled loops), or lower register pressure.",
                speedup_type="estimate", metrics={"local_loads": loads, "local_stores": stores})


def clocks_throttled(launch: KernelLaunch, gpu_state: dict[str, Any] | None) -> Hint | None:
    reasons = sorted(SLOWDOWN_REASONS.intersection((gpu_state or {}).get("clockEventReasons") or []))
    seen_hz = launch.value(SPEED_OF_LIGHT, "SM Frequency")
    max_hz = max_sm_clock_hz(launch, gpu_state)
    slow = seen_hz is not None and max_hz is not None and seen_hz < THROTTLED_BELOW * max_hz
    if not (slow or reasons):
        return None
    clock = f"SM clock {seen_hz / 1e9:.2f} GHz of {max_hz / 1e9:.2f} GHz" if slow else "clocks slowed"
    because = f" ({', '.join(reasons)})" if reasons else ""
    return Hint(code="hint-clocks-throttled", kernel=launch.base_name, severity="warning",
                message=f"{clock}{because} while profiling: timings and throughputs read low. Check cooling, "
                        "power limits and other work on the GPU, then measure again.",
                metrics={"sm_hz": seen_hz, "max_sm_hz": max_hz, "reasons": reasons})


def max_sm_clock_hz(launch: KernelLaunch, gpu_state: dict[str, Any] | None) -> float | None:
    mhz = (gpu_state or {}).get("maxSmClockMHz")
    if isinstance(mhz, (int, float)) and mhz > 0:
        return float(mhz) * 1e6
    khz = launch.raw_value("device__attribute_max_gpu_frequency_khz")
    return khz * 1e3 if khz else None


# --- the --import-csv report ----------------------------------------------------------------------------

def kernel_report(launch: KernelLaunch, ceilings: Ceilings | None = None,
                  gpu_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """One kernel as `kernel-lsp profile --format json` prints it: name, bound, metrics, findings."""
    bound = classify_bound(launch)
    return {
        "kernel": launch.base_name,
        "name": launch.kernel_name,
        "id": launch.id,
        "bound": bound.kind if bound else None,
        "metrics": launch.metrics_by_section(),
        "findings": [{"code": hint.code, "severity": hint.severity, "message": hint.message,
                      "estimated_speedup": hint.estimated_speedup, "speedup_type": hint.speedup_type}
                     for hint in ncu_hints(launch, ceilings, gpu_state)],
    }


