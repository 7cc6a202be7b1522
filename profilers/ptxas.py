"""Per-function resource usage from `ptxas -v` (`nvcc -Xptxas -v`): registers, stack, spills, smem, barriers.

What ptxas prints, one block per function and one run per target arch:

    ptxas info    : 0 bytes gmem, 256 bytes cmem[3]                      <- a new ptxas run (module) starts
    ptxas info    : Compiling entry function '_Z6spillsPKfPfii' for 'sm_90'
    ptxas info    : Function properties for _Z6spillsPKfPfii
        1024 bytes stack frame, 1088 bytes spill stores, 1232 bytes spill loads
    ptxas info    : Used 32 registers, used 0 barriers, 1024 bytes cumulative stack size, 376 bytes cmem[0]
    ptxas info    : Compile time = 120.710 ms
    ptxas info    : Function properties for _Z6helperfi                  <- a device function: no 'Compiling'
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads

A device function's block names no arch (it takes its run's) and has a 'Used' line only under -rdc.
Figures ptxas leaves out are 0 (it omits 'smem' and 'cumulative stack' when they are 0), except registers,
constant bytes and compile time, which are None when not printed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

_MODULE = re.compile(r"^ptxas info\s*: \d+ bytes gmem")
_ENTRY = re.compile(r"^ptxas info\s*: Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPERTIES = re.compile(r"^ptxas info\s*: Function properties for (?P<name>\S+)")
_USED = re.compile(r"^ptxas info\s*: Used (?P<registers>\d+) registers")
_COMPILE_TIME = re.compile(r"^ptxas info\s*: Compile time = (?P<ms>[\d.]+) ms")
_STACK_FIELDS = {
    "stack_frame": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}
_USED_FIELDS = {
    "barriers": re.compile(r"used (\d+) barriers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "cumulative_stack": re.compile(r"(\d+) bytes cumulative stack size"),
    "constant_bytes": re.compile(r"(\d+) bytes cmem\[0\]"),
}
DEMANGLE_TIMEOUT_S = 10.0


@dataclass
class KernelResources:
    mangled: str
    name: str  # demangled, e.g. 'spills(float const*, float*, int, int)'
    base_name: str  # unqualified, no template arguments: 'spills'
    arch: str | None  # 'sm_90'
    registers: int | None = None
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    shared_bytes: int = 0  # static shared memory; dynamic shared memory is decided at launch
    barriers: int = 0
    cumulative_stack: int = 0
    constant_bytes: int | None = None  # cmem[0]: kernel parameters and driver constants
    is_entry: bool = True  # a __global__ kernel; False for a device function ptxas kept as a real call
    compile_time_ms: float | None = None


def parse_ptxas_verbose(text: str) -> list[KernelResources]:
    """Every function block in `ptxas -v` output (other lines are skipped), names demangled."""
    records = _ResourceParser().parse(text.replace("\r", "\n").split("\n"))
    names = demangle([r.mangled for r in records])
    for r in records:
        r.name = names.get(r.mangled, r.mangled)
        r.base_name = base_name_of(r.name)
    return records


class _ResourceParser:
    def __init__(self) -> None:
        self.records: list[KernelResources] = []
        self.module: list[KernelResources] = []  # this ptxas run's functions: they share one arch
        self.arch: str | None = None
        self.entry: KernelResources | None = None  # entry whose 'Used' and 'Compile time' lines are still due
        self.properties_of: KernelResources | None = None  # the function the next stack line belongs to

    def parse(self, lines: list[str]) -> list[KernelResources]:
        for line in lines:
            self._feed(line)
        return self.records

    def _feed(self, line: str) -> None:
        if _MODULE.match(line):
            self.module, self.arch, self.entry = [], None, None
        elif m := _ENTRY.match(line):
            self._set_arch(m["arch"])
            self.entry = self._new(m["name"], is_entry=True)
        elif m := _PROPERTIES.match(line):
            same = self.entry is not None and self.entry.mangled == m["name"]
            self.properties_of = self.entry if same else self._new(m["name"], is_entry=False)
        elif "bytes stack frame" in line and self.properties_of is not None:
            _fill(self.properties_of, _STACK_FIELDS, line)
            self.properties_of = None
        elif m := _USED.match(line):
            owner = self._block_owner()
            if owner is not None:
                owner.registers = int(m["registers"])
                _fill(owner, _USED_FIELDS, line)
        elif m := _COMPILE_TIME.match(line):
            owner = self._block_owner()
            if owner is not None:
                owner.compile_time_ms = float(m["ms"])
            self.entry = None

    def _new(self, mangled: str, is_entry: bool) -> KernelResources:
        record = KernelResources(mangled, mangled, mangled, self.arch, is_entry=is_entry)
        self.records.append(record)
        self.module.append(record)
        return record

    def _set_arch(self, arch: str) -> None:
        """Device functions printed before the run's first entry learn their arch here."""
        self.arch = arch
        for record in self.module:
            record.arch = record.arch or arch

    def _block_owner(self) -> KernelResources | None:
        """The open entry; after it closed, the device function printed last (its block under -rdc)."""
        if self.entry is not None:
            return self.entry
        return self.module[-1] if self.module and not self.module[-1].is_entry else None


def _fill(record: KernelResources, fields: dict[str, re.Pattern[str]], line: str) -> None:
    for name, pattern in fields.items():
        m = pattern.search(line)
        if m:
            setattr(record, name, int(m.group(1)))


def demangle(names: list[str]) -> dict[str, str]:
    """Demangled form of each name, by one c++filt (or cu++filt) run; without either, `fallback_demangle`."""
    unique = list(dict.fromkeys(n for n in names if n))
    if not unique:
        return {}
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    demangled = _run_demangler(tool, unique) if tool else None
    if demangled is None:
        demangled = [fallback_demangle(n) for n in unique]
    return dict(zip(unique, demangled))


def _run_demangler(tool: str, names: list[str]) -> list[str] | None:
    """One line in per name, one line out per name; None when the tool fails or answers out of step."""
    try:
        done = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True,
                              timeout=DEMANGLE_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.splitlines()
    return out if done.returncode == 0 and len(out) == len(names) else None


_BUILTIN = {"v": "void", "b": "bool", "c": "char", "a": "signed char", "h": "unsigned char", "s": "short",
            "t": "unsigned short", "i": "int", "j": "unsigned int", "l": "long", "m": "unsigned long",
            "x": "long long", "y": "unsigned long long", "f": "float", "d": "double", "e": "long double",
            "n": "__int128", "o": "unsigned __int128", "w": "wchar_t", "Dh": "__half", "z": "..."}
_PLAIN = re.compile(r"^_Z(?P<length>\d+)")


def fallback_demangle(mangled: str) -> str:
    """A pure-Python demangler for the plain case `_Z<len><name><params>`, printed the way c++filt prints it.

    Parameters may be builtin types under pointers (P), references (R) and const (K), with substitutions
    (S_, S0_, ...). It does not handle nested names (_ZN...E: namespaces, classes), templates or anything
    else: for a plain name with other parameters it returns the bare name, and any other symbol unchanged.
    """
    m = _PLAIN.match(mangled)
    if not m:
        return mangled
    start, length = m.end(), int(m["length"])
    name, params = mangled[start:start + length], mangled[start + length:]
    if len(name) < length:
        return mangled
    types = _parse_parameters(params)
    if types is None:
        return name
    return f"{name}({', '.join(t for t in types if t != 'void')})"


def _parse_parameters(params: str) -> list[str] | None:
    substitutions: list[str] = []
    types: list[str] = []
    position = 0
    while position < len(params):
        parsed = _parse_type(params, position, substitutions)
        if parsed is None:
            return None
        text, position = parsed
        types.append(text)
    return types


def _parse_type(s: str, i: int, substitutions: list[str]) -> tuple[str, int] | None:
    for code, text in _BUILTIN.items():
        if s.startswith(code, i):
            return text, i + len(code)
    qualifier = {"P": "*", "R": "&", "K": " const"}.get(s[i:i + 1])
    if qualifier is not None:
        inner = _parse_type(s, i + 1, substitutions)
        if inner is None:
            return None
        text = inner[0] + qualifier
        substitutions.append(text)
        return text, inner[1]
    sub = re.compile(r"S([0-9A-Z]*)_").match(s, i)
    if sub:
        index = int(sub.group(1), 36) + 1 if sub.group(1) else 0
        return (substitutions[index], sub.end()) if index < len(substitutions) else None
    return None


def base_name_of(demangled: str) -> str:
    """The function's own name: no return type, scope, template arguments or parameters.

    'void ns::foo<int, 32>(int*)' -> 'foo'; 'spills(float const*, float*, int, int)' -> 'spills'.
    """
    text = re.sub(r"\s*\[clone [^\]]*\]", "", demangled).strip()
    text = re.sub(r"(?:\s+(?:const|volatile|&&|&|noexcept))+$", "", text)
    text = _strip_bracketed_tail(text, "(", ")")
    text = _strip_bracketed_tail(text, "<", ">")
    scope = _last_top_level(text, "::")
    text = text[scope + 2:] if scope >= 0 else text
    space = _last_top_level(text, " ")
    text = text[space + 1:] if space >= 0 else text
    return text or demangled


def _strip_bracketed_tail(text: str, opening: str, closing: str) -> str:
    """'foo<int, 3>' -> 'foo': cut the balanced bracket group that ends the text."""
    if not text.endswith(closing):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += (text[i] == closing) - (text[i] == opening)
        if depth == 0:
            return text[:i].rstrip()
    return text


def _last_top_level(text: str, separator: str) -> int:
    """Index of the last `separator` outside (), <> and [] (template arguments, '(anonymous namespace)')."""
    depth = 0
    found = -1
    for i, ch in enumerate(text):
        depth += (ch in "(<[") - (ch in ")>]")
        if depth == 0 and text.startswith(separator, i):
            found = i
    return found
