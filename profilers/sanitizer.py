"""NVIDIA compute-sanitizer: the command that checks a program with one tool, and its text report parsed.

Every line of the report starts with `========= `. An error is a line at the left margin (after the prefix) and
the indented lines under it, up to a blank line or the next error:

    Invalid __global__ read of size 4 bytes                                       (memcheck)
        at relu_peek(const float *, float *, int)+0x90 in /tmp/.../ext/sanitize_oob/cuda.cu:13
        by thread (255,0,0) in block (4095,0,0)
        Access at 0x7f3a8e400000 is out of bounds
        and is 1 bytes after the nearest allocation at 0x7f3a8e000000 of size 4194304 bytes
        Saved host backtrace up to driver entry point at kernel launch time
            Host Frame: ...
    Error: Race reported between Write access at row_sum(...)+0x80 in .../cuda.cu:12      (racecheck, analysis)
        and Read access at row_sum(...)+0xd0 in .../cuda.cu:14 [8064 hazards]
    Error: Potential RAW hazard detected at __shared__ 0x200 in block (3,0,0) :           (racecheck, hazard)
        Write Thread (160,0,0) at row_sum(...)+0x80 in .../cuda.cu:12
        Read Thread (32,0,0) at row_sum(...)+0xd0 in .../cuda.cu:14
    Uninitialized __global__ memory read of size 4 bytes                                  (initcheck)
    Barrier error detected. Divergent thread(s) in warp                                   (synccheck)

and the run ends with `ERROR SUMMARY: N errors` (memcheck, initcheck, synccheck) or `RACECHECK SUMMARY: ...`. A
site carries `in FILE:LINE` only where the code was built with -lineinfo (or -G). A report without its summary
line was cut short (the program was stopped, or the log was). The recorded forms are in
tests/fixtures/sanitizer/ (compute-sanitizer of CUDA 13.0).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from profilers.ptxas import base_name_of

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
# Bytes memcheck adds after each allocation. Without it, a read one element past a tensor lands in the next
# tensor's allocation when the two are adjacent, and memcheck sees nothing wrong: recorded on the H100 with
# PyTorch's caching allocator off (tests/fixtures/sanitizer/oob.memcheck.log, 0 errors, where the input and the
# output were allocated back to back).
MEMCHECK_PADDING = 4096
# counts and sizes as compute-sanitizer prints them: "of size 4,194,304 bytes" (thousands separated), "72 bytes"
NUMBER = r"\d[\d,]*"
PREFIX = re.compile(r"^=+ ?(?:\[\d+\] ?)?")  # "========= ", with the process id where several are checked
SITE = re.compile(r"^(?P<symbol>.+?)(?:\+(?P<offset>0x[0-9a-fA-F]+))?(?: in (?P<file>.+?):(?P<line>\d+))?\s*$")
THREAD_BLOCK = re.compile(r"by thread \((?P<thread>[\d, ]+)\) in block \((?P<block>[\d, ]+)\)")
ACCESS = re.compile(rf"Invalid (?P<space>__\w+__) (?P<access>read|write|atomic)\w* of size (?P<size>{NUMBER}) bytes?")
UNINITIALIZED = re.compile(rf"Uninitialized (?P<space>__\w+__) memory (?P<access>read|write)\w* of size "
                           rf"(?P<size>{NUMBER})")
RACE = re.compile(r"^(?P<severity>Error|Warning|Info\w*): Race reported between (?P<first>Read|Write) access at "
                  r"(?P<site>.+)$")
RACE_SECOND = re.compile(rf"^and (?P<second>Read|Write) access at (?P<site>.+?)(?: \[(?P<count>{NUMBER}) hazards?\])?$")
HAZARD = re.compile(r"^(?P<severity>Error|Warning|Info\w*): Potential (?P<kind>RAW|WAR|WAW) hazard detected at "
                    r"(?P<space>__\w+__) (?P<address>0x[0-9a-fA-F]+) in block \((?P<block>[\d, ]+)\)")
HAZARD_SITE = re.compile(r"^(?P<access>Read|Write)\w* Thread \((?P<thread>[\d, ]+)\) at (?P<site>.+)$")
RELATION = re.compile(rf"is (?P<bytes>{NUMBER}) bytes? (?P<where>after|before) the nearest allocation at "
                      rf"(?P<base>0x[0-9a-fA-F]+) of size (?P<size>{NUMBER}) bytes?")
SUMMARY = re.compile(rf"^(?:ERROR SUMMARY: (?P<errors>{NUMBER}) errors?|RACECHECK SUMMARY: (?P<race>.*))")
RACE_COUNTS = re.compile(rf"({NUMBER}) hazards? displayed \(({NUMBER}) errors?, ({NUMBER}) warnings?\)")
NOT_PRINTED = re.compile(r"(?i)(print(?:ing)? limit|not (?:been )?(?:printed|displayed))")
BANNER = ("COMPUTE-SANITIZER", "LEAK SUMMARY", "Target application returned an error",
          "Internal Sanitizer Error")


def number(text: str) -> int:
    return int(text.replace(",", ""))


class SanitizerNotFound(Exception):
    """No compute-sanitizer to run; the message says where it was looked for."""


@dataclass(frozen=True)
class Site:
    """Where an access happened: the kernel (as printed), its offset, and the file and line with -lineinfo."""

    symbol: str
    offset: str | None = None
    file: str | None = None
    line: int | None = None

    @property
    def kernel(self) -> str:
        """The base name (no parameters, template arguments or namespace), as ptxas and ncu name kernels."""
        return base_name_of(self.symbol)

    def to_dict(self) -> dict:
        return {"symbol": self.symbol, "kernel": self.kernel, "offset": self.offset, "file": self.file,
                "line": self.line}


@dataclass
class SanitizerError:
    """One error of the report."""

    tool: str
    kind: str  # out-of-bounds, misaligned, invalid-access, race, uninitialized, barrier, api-error, other
    title: str  # the error's first line as printed
    site: Site | None = None
    other: Site | None = None  # a race's second access
    severity: str = "error"  # racecheck's warnings (and infos) are kept apart from its errors
    space: str | None = None  # global, shared, local, generic
    access: str | None = None  # read, write, atomic (a race's or hazard's first access)
    other_access: str | None = None
    size: int | None = None  # bytes of the access
    thread: tuple[int, ...] | None = None
    block: tuple[int, ...] | None = None
    address: str | None = None
    relation: str | None = None  # "4 bytes past the end of a 4194304-byte allocation"
    hazards: int | None = None  # racecheck analysis: how many hazards this race stands for
    details: list[str] = field(default_factory=list)  # the other lines under the error (host frames left out)

    def describe(self) -> str:
        """One sentence: what, where (kernel, thread, block), and the address's relation to its allocation."""
        parts = [self.title.rstrip(".").rstrip(" :")]
        if self.kind == "race" and self.site and self.other:
            parts = [f"race on {self.space or 'shared'} memory: {self.access or 'an'} access at "
                     f"{_where(self.site)} and {self.other_access or 'an'} access at {_where(self.other)}"
                     + (f" ({self.hazards} hazards)" if self.hazards else "")]
        elif self.site:
            parts.append(f"in {self.site.kernel}")
        if self.thread is not None and self.block is not None:
            parts.append(f"thread ({_xyz(self.thread)}) of block ({_xyz(self.block)})")
        elif self.block is not None:
            parts.append(f"block ({_xyz(self.block)})")
        if self.relation:
            parts.append(self.relation)
        elif self.address and self.kind in ("out-of-bounds", "misaligned", "invalid-access"):
            parts.append(f"address {self.address}")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        return {"tool": self.tool, "kind": self.kind, "title": self.title, "severity": self.severity,
                "site": self.site.to_dict() if self.site else None,
                "other": self.other.to_dict() if self.other else None, "space": self.space, "access": self.access,
                "otherAccess": self.other_access, "size": self.size,
                "thread": list(self.thread) if self.thread else None,
                "block": list(self.block) if self.block else None, "address": self.address,
                "relation": self.relation, "hazards": self.hazards, "message": self.describe()}


@dataclass
class SanitizerReport:
    tool: str
    errors: list[SanitizerError]
    reported: int | None  # the count in the summary line (may exceed the errors printed); None: no summary line
    warnings: int = 0  # racecheck's warnings in its summary
    complete: bool = True  # False: no summary line, the output was cut short
    not_printed: bool = False  # the print limit was reached: more errors happened than are listed
    notes: list[str] = field(default_factory=list)  # left-margin lines that are not errors (the program's fate)

    @property
    def clean(self) -> bool:
        return self.complete and not self.errors and not self.reported


def parse_report(text: str, tool: str) -> SanitizerReport:
    """A compute-sanitizer log (its --log-file, or the program's output with the prefixed lines in it)."""
    errors: list[SanitizerError] = []
    current: SanitizerError | None = None
    reported: int | None = None
    warnings = 0
    not_printed = False
    notes: list[str] = []
    in_frames = False
    for raw in text.splitlines():
        match = PREFIX.match(raw)
        if match is None:
            continue  # the program's own output
        body = raw[match.end():]
        stripped = body.strip()
        if not stripped:
            current, in_frames = None, False
            continue
        if body == stripped:  # the left margin: an error, a summary, a note
            in_frames = False
            if NOT_PRINTED.search(stripped):  # "ERROR SUMMARY: 924 errors were not printed. Use --print-limit ..."
                not_printed = True
                current = None
                continue
            summary = SUMMARY.match(stripped)
            if summary:
                current = None
                if summary.group("errors") is not None:
                    reported = number(summary.group("errors"))
                else:
                    counts = RACE_COUNTS.search(summary.group("race") or "")
                    reported = number(counts.group(2)) if counts else 0
                    warnings = number(counts.group(3)) if counts else 0
                continue
            if stripped.startswith(BANNER) or _is_note(stripped):
                notes.append(stripped)
                current = None
                continue
            current = _start(stripped, tool)
            errors.append(current)
            continue
        if current is None:
            continue
        if stripped.startswith(("Saved host backtrace", "Host Frame:")) or in_frames and "Frame:" in stripped:
            in_frames = True
            continue
        _detail(current, stripped)
    complete = reported is not None
    return SanitizerReport(tool, errors, reported, warnings, complete, not_printed, notes)


def _is_note(line: str) -> bool:
    """A left-margin line that is no error: the sanitizer's remarks on the run."""
    return line.startswith(("Note:", "Process ", "Target application", "Tool ", "Unable to", "Not enough"))


def _start(line: str, tool: str) -> SanitizerError:
    race = RACE.match(line)
    if race:
        error = SanitizerError(tool, "race", line, severity=_severity(race.group("severity")), space="shared",
                               access=race.group("first").lower())
        error.site = parse_site(race.group("site"))
        return error
    hazard = HAZARD.match(line)
    if hazard:
        return SanitizerError(tool, "race", line, severity=_severity(hazard.group("severity")),
                              space=_space(hazard.group("space")), address=hazard.group("address"),
                              block=_triple(hazard.group("block")), details=[f"{hazard.group('kind')} hazard"])
    access = ACCESS.search(line)
    if access:
        return SanitizerError(tool, "invalid-access", line, space=_space(access.group("space")),
                              access=access.group("access"), size=number(access.group("size")))
    uninitialized = UNINITIALIZED.search(line)
    if uninitialized:
        return SanitizerError(tool, "uninitialized", line, space=_space(uninitialized.group("space")),
                              access=uninitialized.group("access"), size=number(uninitialized.group("size")))
    if line.startswith("Barrier error") or "barrier" in line.lower():
        return SanitizerError(tool, "barrier", line)
    if line.startswith("Misaligned"):
        return SanitizerError(tool, "misaligned", line)
    if line.startswith("Program hit"):
        return SanitizerError(tool, "api-error", line)
    return SanitizerError(tool, "other", line)


def _detail(error: SanitizerError, line: str) -> None:
    if line.startswith("at ") and error.site is None:
        error.site = parse_site(line[3:])
        return
    second = RACE_SECOND.match(line)
    if second and error.kind == "race":
        error.other = parse_site(second.group("site"))
        error.other_access = second.group("second").lower()
        error.hazards = number(second.group("count")) if second.group("count") else None
        return
    hazard_site = HAZARD_SITE.match(line)
    if hazard_site and error.kind == "race":
        site = parse_site(hazard_site.group("site"))
        thread = _triple(hazard_site.group("thread"))
        if error.site is None:
            error.site, error.access, error.thread = site, hazard_site.group("access").lower(), thread
        else:
            error.other, error.other_access = site, hazard_site.group("access").lower()
        return
    where = THREAD_BLOCK.search(line)
    if where:
        error.thread, error.block = _triple(where.group("thread")), _triple(where.group("block"))
        return
    relation = RELATION.search(line)
    if relation:
        error.relation = _relation(relation, error.size)
        error.kind = "out-of-bounds" if error.kind in ("invalid-access", "other") else error.kind
        return
    address = re.search(r"(?:Access (?:at|to)|Address) (0x[0-9a-fA-F]+)", line)
    if address:
        error.address = address.group(1)
        if "out of bounds" in line and error.kind in ("invalid-access", "other"):
            error.kind = "out-of-bounds"
        elif "misaligned" in line and error.kind == "invalid-access":
            error.kind = "misaligned"
    if not line.startswith("Device Frame:") or len(error.details) < 8:
        error.details.append(line)


def _relation(match: re.Match[str], access: int | None) -> str:
    """compute-sanitizer counts "after" from the allocation's last byte: "1 bytes after" is the first byte past
    its end (recorded: an access at base+72 of a 72-byte allocation)."""
    distance, size = number(match.group("bytes")), number(match.group("size"))
    what = f"{access} bytes" if access else "the access"
    if match.group("where") == "before":
        return f"{what} {distance} bytes before the start of a {size}-byte allocation"
    beyond = distance - 1
    where = "just past the end" if beyond <= 0 else f"{beyond} bytes past the end"
    return f"{what} {where} of a {size}-byte allocation"


def parse_site(text: str) -> Site:
    match = SITE.match(text.strip())
    if match is None:  # the pattern matches any text; kept for the type checker
        return Site(text.strip())
    line = match.group("line")
    return Site(match.group("symbol").strip(), match.group("offset"), match.group("file"),
                int(line) if line else None)


def _severity(word: str) -> str:
    return "error" if word == "Error" else "warning" if word == "Warning" else "info"


def _space(word: str) -> str:
    return word.strip("_")


def _triple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.replace(" ", "").split(",") if part)


def _xyz(values: tuple[int, ...]) -> str:
    return ",".join(map(str, values))


def _where(site: Site) -> str:
    return f"{site.kernel} line {site.line}" if site.line else site.kernel


# --- the command ----------------------------------------------------------------------------------------

def find_sanitizer(cuda_home: str | None = None) -> str:
    """compute-sanitizer on PATH, else under CUDA_HOME (or /usr/local/cuda)."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in filter(None, (cuda_home, "/usr/local/cuda")):
        for candidate in (Path(home) / "bin" / "compute-sanitizer",
                          Path(home) / "compute-sanitizer" / "compute-sanitizer"):
            if candidate.is_file():
                return str(candidate)
    raise SanitizerNotFound("compute-sanitizer is not on PATH nor under CUDA_HOME/bin or /usr/local/cuda/bin: "
                            "it comes with the CUDA toolkit (add its bin folder to PATH)")


def sanitizer_command(tool: str, program: Sequence[str], log: Path, sanitizer: str = "compute-sanitizer",
                      print_limit: int = 100) -> list[str]:
    """One tool over `program`, its report in `log` (the program's own output stays on its stdout and stderr).
    memcheck runs without its leak check (the process's exit is not the candidate's) and with MEMCHECK_PADDING
    bytes after each allocation; only the program itself is checked, not the processes it starts."""
    if tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r} (known: {', '.join(TOOLS)})")
    options = ["--leak-check", "no", "--padding", str(MEMCHECK_PADDING)] if tool == "memcheck" else []
    return [sanitizer, "--tool", tool, *options, "--print-limit", str(print_limit),
            "--target-processes", "application-only", "--log-file", str(log), *program]
