"""Nsight Compute (`ncu`): the command that profiles a program, its known failures, and its CSV pages parsed.

`ncu --csv --page details` prints one quoted row per metric or rule result, each row repeating the launch's
columns (ID, Kernel Name, Block Size, Grid Size, Device, CC, ...) before "Section Name", "Metric Name",
"Metric Unit", "Metric Value", "Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type",
"Estimated Speedup". Numbers carry thousands separators ("3,199,017,988.25") and units are scaled for reading
("Mbyte", "Gbyte", "us"). A metric row's section is the display name ("GPU Speed Of Light Throughput"); a rule
row's is the section identifier ("SpeedOfLight"). `--page raw --csv` prints a header row, a units row, then one
row per launch with one column per metric.

Source lines: the details page carries none, in CSV or as text (`--print-details all`, checked on the H200
fixture): its Source Counters tables, which ncu's rules point at ("Check the L2 Theoretical Sectors Global
Excessive table for the primary source locations"), print per-kernel totals only, and "Hotspot Locations"
lists stall counts without locations. Per-line figures need ncu's `--page source` export, not parsed here.
"""

from __future__ import annotations

import csv
import math
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from profilers.ptxas import base_name_of

# capture.sh's sections, plus the roofline chart's FLOP counters, which the roofline needs
DEFAULT_SECTIONS = (
    "SpeedOfLight", "SpeedOfLight_RooflineChart", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis_Tables",
    "WarpStateStats", "SchedulerStats", "SourceCounters", "ComputeWorkloadAnalysis",
)
# Two-stage profiling (the agent's profile tool): a first run with the sections that classify a kernel (its bound
# from Speed Of Light, its launch and occupancy), then one with the analyses that fit its bound.
CLASSIFY_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy")
SECTIONS_BY_BOUND = {
    "memory": ("SpeedOfLight_RooflineChart", "MemoryWorkloadAnalysis_Tables", "SourceCounters"),
    "compute": ("SpeedOfLight_RooflineChart", "ComputeWorkloadAnalysis", "SchedulerStats", "WarpStateStats",
                "SourceCounters"),
    "latency": ("WarpStateStats", "SchedulerStats"),
}
SPEED_OF_LIGHT = "GPU Speed Of Light Throughput"
LAUNCH_STATISTICS = "Launch Statistics"
CSV_HEADER_START = '"ID","Process ID"'
PERMISSION_DOCS = "https://developer.nvidia.com/ERR_NVGPUCTRPERM"
NCU_TIMEOUT_S = 600.0


# --- failures -------------------------------------------------------------------------------------------

class NcuError(Exception):
    """ncu could not profile; the message says why and what to do."""


class NcuNotFound(NcuError):
    pass


class NcuPermissionDenied(NcuError):
    pass


class NcuNoKernelsProfiled(NcuError):
    def __init__(self, message: str, available_kernels: list[str]) -> None:
        super().__init__(message)
        self.available_kernels = available_kernels


class NcuFailed(NcuError):
    pass


def find_ncu() -> str:
    """The ncu on PATH, else the CUDA toolkit's; NcuNotFound says how to get one."""
    found = shutil.which("ncu") or shutil.which("/usr/local/cuda/bin/ncu")
    if found is None:
        raise NcuNotFound("ncu (Nsight Compute) is not on PATH: install the CUDA toolkit or Nsight Compute "
                          "and put its bin directory (e.g. /usr/local/cuda/bin) on PATH")
    return found


def check_ncu_output(output: str, returncode: int = 0) -> None:
    """Raise the NcuError that ncu's printed output (stdout and stderr together) shows, if any."""
    if "ERR_NVGPUCTRPERM" in output:
        raise NcuPermissionDenied(permission_message())
    if "No kernels were profiled" in output:
        available = available_kernels(output)
        listed = f" Kernels the program launched: {', '.join(available)}." if available else ""
        raise NcuNoKernelsProfiled("ncu profiled no kernel: no launch matched the kernel filter (ncu matches "
                                   f"the function name it displays, e.g. a PyTorch op's kernel).{listed}",
                                   available)
    errors = [line.removeprefix("==ERROR==").strip() for line in output.splitlines()
              if line.startswith("==ERROR==")]
    if errors or returncode != 0:
        detail = "; ".join(errors) or f"exit status {returncode}"
        raise NcuFailed(f"ncu failed: {detail}")


def permission_message() -> str:
    return ("ncu may not read the GPU's performance counters (ERR_NVGPUCTRPERM): by default the driver lets only "
            "administrators profile. Run ncu as root (or with CAP_SYS_ADMIN), or allow all users by loading the "
            "nvidia module with NVreg_RestrictProfilingToAdminUsers=0 (e.g. 'options nvidia "
            "NVreg_RestrictProfilingToAdminUsers=0' in /etc/modprobe.d/, then reboot); in a container, start it "
            f"with --cap-add=SYS_ADMIN. See {PERMISSION_DOCS}")


_AVAILABLE_HEADER = re.compile(r"available kernels", re.IGNORECASE)
_LIST_MARKER = re.compile(r"^\s*(?:\d+[.)]|[-*])?\s*")


def available_kernels(output: str) -> list[str]:
    """The kernel names ncu lists under an 'Available Kernels' line: one a line, up to a blank or '==' line."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if _AVAILABLE_HEADER.search(line)), None)
    if start is None:
        return []
    names = []
    for line in lines[start + 1:]:
        if not line.strip() or line.startswith("=="):
            break
        names.append(_LIST_MARKER.sub("", line, count=1).strip())
    return names


# --- the command ----------------------------------------------------------------------------------------

def kernel_filter(kernels: Sequence[str]) -> list[str]:
    """`-k regex:^(a|b)$`: ncu matches the function name it displays, so whole names only."""
    if not kernels:
        return []
    alternatives = "|".join(re.escape(name) for name in kernels)
    return ["-k", f"regex:^({alternatives})$"]


def sections_for_bounds(bounds: Iterable[str]) -> tuple[str, ...]:
    """The second stage's sections for kernels of these bounds: the classifying sections and each bound's analyses,
    in DEFAULT_SECTIONS' order; an unknown bound (or none) gets every default section."""
    wanted = set(CLASSIFY_SECTIONS)
    for bound in bounds:
        if bound not in SECTIONS_BY_BOUND:
            return DEFAULT_SECTIONS
        wanted.update(SECTIONS_BY_BOUND[bound])
    return tuple(section for section in DEFAULT_SECTIONS if section in wanted)


def ncu_command(program: Sequence[str], kernels: Sequence[str] = (), sections: Sequence[str] = DEFAULT_SECTIONS,
                *, ncu: str = "ncu", report: Path | None = None, launch_count: int | None = None) -> list[str]:
    """argv that profiles program: the details page as CSV on stdout, or a report file to --import later."""
    command = [ncu, "--clock-control", "none"]  # the clocks the user's timing sees, not ncu's locked base clock
    for section in sections:
        command += ["--section", section]
    command += kernel_filter(kernels)
    if launch_count is not None:
        command += ["--launch-count", str(launch_count)]
    if report is not None:
        command += ["--export", str(report), "--force-overwrite"]
    else:
        command += ["--csv", "--page", "details"]
    return command + list(program)


def import_command(report: Path, page: str = "details", *, ncu: str = "ncu") -> list[str]:
    """argv that prints a saved report's page ("details" or "raw") as CSV."""
    return [ncu, "--import", str(report), "--csv", "--page", page]


def run_ncu(argv: Sequence[str], timeout_s: float = NCU_TIMEOUT_S, cwd: Path | None = None) -> str:
    """Run an ncu argv; its stdout, or the NcuError its output shows."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    except FileNotFoundError as exc:
        raise NcuNotFound(f"cannot run {argv[0]}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise NcuFailed(f"ncu ran past {timeout_s:.0f} s and was stopped") from exc
    check_ncu_output(done.stdout + "\n" + done.stderr, done.returncode)
    return done.stdout


# --- values ---------------------------------------------------------------------------------------------

_UNIT_SCALE = {
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "Pbyte": 1e15,
    "ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "s": 1.0, "second": 1.0,
    "hz": 1.0, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9,
}
_NUMBER = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?$")


def parse_number(text: str) -> float | None:
    """'3,199,017,988.25' -> 3199017988.25; '' or 'n/a' or 'PolicySpread' -> None."""
    stripped = text.strip()
    if not _NUMBER.match(stripped):
        return None
    return float(stripped.replace(",", ""))


def unit_scale(unit: str) -> float:
    """Factor to base units (byte, second, hz): 'Mbyte' -> 1e6, 'Tbyte/s' -> 1e12, 'byte/usecond' -> 1e6."""
    numerator, _, denominator = unit.partition("/")
    scale = _UNIT_SCALE.get(numerator, 1.0)
    if denominator in _UNIT_SCALE and denominator not in ("byte", "hz"):
        scale /= _UNIT_SCALE[denominator]
    return scale


@dataclass(frozen=True)
class Metric:
    text: str  # as printed
    unit: str

    @property
    def number(self) -> float | None:
        """The value in the printed unit, or None when it is not a number."""
        return parse_number(self.text)

    @property
    def base(self) -> float | None:
        """The value in base units (bytes, seconds, hertz; other units unchanged)."""
        number = self.number
        return None if number is None else number * unit_scale(self.unit)

    def to_dict(self) -> dict[str, object]:
        number = self.number
        return {"value": self.text if number is None else number, "unit": self.unit}


@dataclass(frozen=True)
class RuleResult:
    section: str  # the section identifier, e.g. "SourceCounters"
    name: str  # e.g. "UncoalescedGlobalAccess"
    type: str  # "OPT" (optimization), "WRN" (warning), "INF" (information), "ERR"
    description: str
    speedup_type: str | None  # "global" (of the kernel's time), "local" (of the part the rule looks at)
    speedup: float | None  # percent

    def to_dict(self) -> dict[str, object]:
        return {"section": self.section, "name": self.name, "type": self.type, "description": self.description,
                "speedup_type": self.speedup_type, "speedup": self.speedup}


Dim3 = tuple[int, int, int]


@dataclass(frozen=True)
class KernelLaunch:
    id: int
    kernel_name: str  # as ncu displays it: 'vec_add(const float *, const float *, float *, int)'
    base_name: str  # 'vec_add'
    block_size: Dim3
    grid_size: Dim3
    device: int
    compute_capability: str  # "9.0"
    metrics: dict[tuple[str, str], Metric] = field(default_factory=dict)  # (section display name, metric name)
    rules: tuple[RuleResult, ...] = ()
    raw: dict[str, Metric] = field(default_factory=dict)  # --page raw, when it was read too

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block_size)

    @property
    def blocks(self) -> int:
        return math.prod(self.grid_size)

    def metric(self, section: str, name: str) -> Metric | None:
        return self.metrics.get((section, name))

    def value(self, section: str, name: str) -> float | None:
        """A details-page metric in base units, or None when absent or not a number."""
        found = self.metrics.get((section, name))
        return None if found is None else found.base

    def raw_value(self, name: str) -> float | None:
        """A raw-page metric in base units, or None when absent or not a number."""
        found = self.raw.get(name)
        return None if found is None else found.base

    def metrics_by_section(self) -> dict[str, dict[str, dict[str, object]]]:
        nested: dict[str, dict[str, dict[str, object]]] = {}
        for (section, name), metric in self.metrics.items():
            nested.setdefault(section, {})[name] = metric.to_dict()
        return nested


# --- the details page -----------------------------------------------------------------------------------

def csv_rows(text: str) -> list[list[str]]:
    """The CSV part of ncu's output: from the header row on, leaving out ncu's '==PROF==' lines and the
    program's own output, which share stdout with it when ncu prints CSV directly."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(CSV_HEADER_START)), None)
    if start is None:
        return []
    quoted = [line for line in lines[start:] if line.startswith('"')]
    return list(csv.reader(quoted))


def parse_dim3(text: str) -> Dim3:
    """'(256, 1, 1)' -> (256, 1, 1)."""
    parts = [int(parse_number(part) or 0) for part in text.strip("() ").split(",")] + [1, 1, 1]
    return parts[0], parts[1], parts[2]


def parse_details_csv(text: str) -> list[KernelLaunch]:
    """`ncu --csv --page details` -> one KernelLaunch per profiled launch, in ID order."""
    rows = csv_rows(text)
    if not rows:
        return []
    header = rows[0]
    records_by_id: dict[int, list[dict[str, str]]] = {}
    for row in rows[1:]:
        record = dict(zip(header, row))
        records_by_id.setdefault(int(record["ID"]), []).append(record)
    return [launch_from_records(records) for _, records in sorted(records_by_id.items())]


def launch_from_records(records: list[dict[str, str]]) -> KernelLaunch:
    """One launch from its rows: the launch columns repeat on every row, so the first one gives them."""
    first = records[0]
    name = first["Kernel Name"]
    metrics = {(record["Section Name"], record["Metric Name"]): Metric(record.get("Metric Value", ""),
                                                                       record.get("Metric Unit", ""))
               for record in records if record.get("Metric Name")}
    rules = tuple(rule_from_record(record) for record in records if record.get("Rule Name"))
    return KernelLaunch(id=int(first["ID"]), kernel_name=name, base_name=base_name_of(name),
                        block_size=parse_dim3(first.get("Block Size", "")),
                        grid_size=parse_dim3(first.get("Grid Size", "")),
                        device=int(parse_number(first.get("Device", "")) or 0),
                        compute_capability=first.get("CC", ""), metrics=metrics, rules=rules)


def rule_from_record(record: dict[str, str]) -> RuleResult:
    return RuleResult(section=record["Section Name"], name=record["Rule Name"], type=record.get("Rule Type", ""),
                      description=" ".join(record.get("Rule Description", "").split()),
                      speedup_type=record.get("Estimated Speedup Type") or None,
                      speedup=parse_number(record.get("Estimated Speedup", "")))


# --- the raw page ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RawLaunch:
    id: int
    kernel_name: str
    metrics: dict[str, Metric]


def parse_raw_csv(text: str) -> list[RawLaunch]:
    """`ncu --csv --page raw`: a header row, a units row, then one row per launch."""
    rows = csv_rows(text)
    if len(rows) < 2:
        return []
    header, units = rows[0], rows[1]
    launches = []
    for row in rows[2:]:
        metrics = {name: Metric(value, unit) for name, unit, value in zip(header, units, row)}
        launches.append(RawLaunch(id=int(row[0]), kernel_name=metrics["Kernel Name"].text, metrics=metrics))
    return launches


def with_raw(launches: Iterable[KernelLaunch], raw: Iterable[RawLaunch]) -> list[KernelLaunch]:
    """Each launch with its raw-page metrics (matched by ID) attached."""
    by_id = {entry.id: entry.metrics for entry in raw}
    return [replace(launch, raw=by_id.get(launch.id, launch.raw)) for launch in launches]
