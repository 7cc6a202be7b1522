"""Per-kernel SASS statistics from `cuobjdump --dump-sass` or `nvdisasm -c -gi`: memory traffic by space and width,
tensor-core instructions, FMAs in shared-memory loops, and the source line of each notable instruction.

What the tools print (CUDA 13), one block per function:

    cuobjdump --dump-sass (any binary: cubin, fatbin, object, executable; no line information):
            code for sm_90
                    Function : _Z7vec_addPKfS0_Pfi
            /*00d0*/                   LDG.E R3, desc[UR4][R2.64] ;        /* 0x0000000402037981 */
                                                                           /* 0x000ee2000c1e1900 */
            /*06c0*/               @P1 BRA 0x240 ;                         /* 0xfffffff800dc1947 */

    nvdisasm -c -gi (cubins only; `//## File` markers when the cubin was built with -lineinfo):
            .target sm_90
    //--------------------- .text._Z7vec_addPKfS0_Pfi --------------------------
    .L_x_30:
            //## File "/src/kernels.cu", line 8
            /*00d0*/                   LDG.E R3, desc[UR4][R2.64] ;
            /*0140*/                   BRA `(.L_x_20);
            //## File "/cuda/include/crt/mma.hpp", line 91 inlined at "/src/wmma.cu", line 26

A marker gives the line of every instruction after it until the next marker; for code inlined from a header
or a helper we keep the outermost call site: the line in the kernel's own body, which the user can change.
Loops are found from backward branches: the instructions from a branch's target up to the branch form one body.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

from profilers.ptxas import base_name_of, demangle

TOOL_TIMEOUT_S = 60.0
_CUDA_ELF_MACHINE = 190  # e_machine of a cubin (EM_CUDA); executables and objects are host ELF files
_PYPI_PACKAGE = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}

_ARCH = re.compile(r"^\s*(?:code for|\.target)\s+(?P<arch>sm_\w+)")
_CUOBJDUMP_FUNCTION = re.compile(r"^\s*Function : (?P<name>\S+)")
_NVDISASM_FUNCTION = re.compile(r"^//-+ \.text\.(?P<name>\S+)")
_LINE_MARKER = re.compile(r'^\s*//## File "[^"]+", line \d+')
_MARKER_LOCATION = re.compile(r'"(?P<file>[^"]+)", line (?P<line>\d+)')
_LABEL = re.compile(r"^(?P<label>\.L\w+):")
_INSTRUCTION = re.compile(
    r"^\s*/\*(?P<address>[0-9a-f]+)\*/\s+(?:(?P<predicate>@!?U?P\w+)\s+)?(?P<opcode>[A-Z][A-Z0-9_.]*)"
    r"\s*(?P<operands>[^;]*);")
_BRANCH_TARGET = re.compile(r"(?:0x(?P<address>[0-9a-f]+)|`\((?P<label>[.\w]+)\))\s*$")

_WIDTH_BITS = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "64": 64, "128": 128, "256": 256}  # no width token: 32
_MEMORY_OPCODES = {  # opcode -> (space, direction)
    "LDG": ("global", "load"), "STG": ("global", "store"),
    "LDGSTS": ("global", "load"),  # cp.async: global -> shared without registers
    "LD": ("generic", "load"), "ST": ("generic", "store"),
    "LDL": ("local", "load"), "STL": ("local", "store"),
    "LDS": ("shared", "load"), "STS": ("shared", "store"),
    "LDSM": ("shared", "load"), "STSM": ("shared", "store"),
}
_BULK_COPY_OPCODES = {"UTMALDG", "UTMASTG", "UBLKCP", "UTMAPF"}  # TMA (sm_90+): whole tiles per instruction
_TENSOR_CORE = re.compile(r"^(?:[HIDBQO]MMA|[HIQBO]GMMA|UTC\w*MMA)$")  # mma.sync, wgmma (sm_90), tcgen05 (sm_100)
_FMA_OPCODES = {"FFMA", "FFMA2", "DFMA", "HFMA2"}
_PADDING_OPCODES = {"NOP"}


class SassToolMissing(Exception):
    """cuobjdump or nvdisasm was not found; the message says how to install it."""


class SassToolFailed(Exception):
    """cuobjdump or nvdisasm ran but failed (not a CUDA binary, unreadable file): its stderr is in the message."""


@dataclass(frozen=True)
class SassInstruction:
    address: int
    opcode: str  # 'LDG'
    modifiers: tuple[str, ...]  # ('E', '128')
    operands: str
    predicate: str | None = None  # '@!P0'
    branch_target: int | None = None  # a BRA's target address
    file: str | None = None  # from the last `//## File` marker (nvdisasm -gi on a -lineinfo cubin)
    line: int | None = None

    @property
    def mnemonic(self) -> str:
        return ".".join((self.opcode, *self.modifiers))


@dataclass
class SassFunction:
    mangled: str
    arch: str | None
    instructions: list[SassInstruction] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryAccess:
    space: str  # 'global', 'generic', 'local', 'shared'
    direction: str  # 'load' or 'store'
    bits: int  # per thread


@dataclass(frozen=True)
class SassSite:
    """A notable instruction and where it came from in the source (file and line None without -lineinfo)."""
    kind: str  # 'global-load', 'local-store', 'tensor-core', 'bulk-copy', 'fma' (space-direction for memory)
    mnemonic: str  # 'LDG.E.128'
    address: int
    bits: int | None = None  # memory accesses: width per thread
    file: str | None = None
    line: int | None = None


@dataclass
class SassStats:
    mangled: str
    name: str  # demangled
    base_name: str  # profilers.ptxas.base_name_of(name)
    arch: str | None
    instruction_count: int  # without the NOP padding at the end
    global_loads: dict[int, int] = field(default_factory=dict)  # width in bits -> count (LDG, LDGSTS)
    global_stores: dict[int, int] = field(default_factory=dict)  # width in bits -> count (STG)
    generic_loads: int = 0  # LD / ST: generic addresses the compiler could not place (may be global)
    generic_stores: int = 0
    local_loads: int = 0  # LDL: spills or arrays placed in local memory
    local_stores: int = 0
    shared_loads: int = 0  # LDS, LDSM
    shared_stores: int = 0  # STS, STSM
    bulk_copies: int = 0  # TMA instructions
    tensor_core: dict[str, int] = field(default_factory=dict)  # opcode -> count: HMMA, HGMMA, ...
    fma_count: int = 0  # FFMA, DFMA, HFMA2 (HFMA2.MMA is a move, not counted)
    loop_count: int = 0
    max_fma_in_shared_loop: int = 0  # most FMAs in one loop body that also reads shared memory
    has_line_info: bool = False
    sites: list[SassSite] = field(default_factory=list)

    @property
    def global_accesses(self) -> int:
        return sum(self.global_loads.values()) + sum(self.global_stores.values())

    @property
    def widest_global_bits(self) -> int:
        return max([*self.global_loads, *self.global_stores], default=0)

    @property
    def tensor_core_count(self) -> int:
        return sum(self.tensor_core.values())

    def lines(self, kind: str, max_bits: int | None = None) -> list[tuple[str, int]]:
        """Distinct (file, line) pairs of the sites of this kind (at most max_bits wide), in source order."""
        found = {(s.file, s.line) for s in self.sites if s.kind == kind and s.file and s.line
                 and (max_bits is None or (s.bits or 0) <= max_bits)}
        return sorted(found)


def parse_sass(text: str) -> list[SassFunction]:
    """Every function in cuobjdump --dump-sass or nvdisasm output, in the order printed, with its instructions."""
    functions: list[SassFunction] = []
    arch: str | None = None
    location: tuple[str | None, int | None] = (None, None)
    labels: dict[str, int] = {}  # nvdisasm's branch labels -> the address of the next instruction
    pending_labels: list[str] = []
    for line in text.splitlines():
        if m := _ARCH.match(line):
            arch = m["arch"]
        elif m := _CUOBJDUMP_FUNCTION.match(line) or _NVDISASM_FUNCTION.match(line):
            functions.append(SassFunction(m["name"], arch))
            location = (None, None)
        elif _LINE_MARKER.match(line):
            location = _outermost_location(line)
        elif m := _LABEL.match(line):
            pending_labels.append(m["label"])
        elif (m := _INSTRUCTION.match(line)) and functions:
            instruction = _instruction(m, location)
            labels.update(dict.fromkeys(pending_labels, instruction.address))
            pending_labels.clear()
            functions[-1].instructions.append(instruction)
    return [_with_label_targets(f, labels) for f in functions]


def _outermost_location(marker: str) -> tuple[str, int]:
    """'File "h.hpp", line 91 inlined at "k.cu", line 26' -> ('k.cu', 26): the line in the kernel's own body."""
    *_, last = _MARKER_LOCATION.finditer(marker)
    return last["file"], int(last["line"])


def _instruction(m: re.Match[str], location: tuple[str | None, int | None]) -> SassInstruction:
    opcode, *modifiers = m["opcode"].split(".")
    operands = m["operands"].strip()
    target = _BRANCH_TARGET.search(operands) if opcode == "BRA" else None
    address = int(target["address"], 16) if target and target["address"] else None
    return SassInstruction(int(m["address"], 16), opcode, tuple(modifiers), operands, m["predicate"],
                           address, *location)


def _with_label_targets(function: SassFunction, labels: dict[str, int]) -> SassFunction:
    """nvdisasm names branch targets by label: resolve them to addresses once every label is known."""
    function.instructions = [_resolve_label(i, labels) for i in function.instructions]
    return function


def _resolve_label(instruction: SassInstruction, labels: dict[str, int]) -> SassInstruction:
    target = _BRANCH_TARGET.search(instruction.operands) if instruction.opcode == "BRA" else None
    if target is None or target["label"] not in labels:
        return instruction
    return replace(instruction, branch_target=labels[target["label"]])


def memory_access(instruction: SassInstruction) -> MemoryAccess | None:
    """Space, direction and per-thread width of a load or store; None for anything else."""
    kind = _MEMORY_OPCODES.get(instruction.opcode)
    if kind is None:
        return None
    return MemoryAccess(kind[0], kind[1], _access_bits(instruction))


def _access_bits(instruction: SassInstruction) -> int:
    if instruction.opcode in ("LDSM", "STSM"):  # LDSM.16.M88.4: four 8x8 matrices, 32 bits per thread each
        count = instruction.modifiers[-1] if instruction.modifiers else "1"
        return 32 * int(count) if count.isdigit() else 32
    widths = [_WIDTH_BITS[m] for m in instruction.modifiers if m in _WIDTH_BITS]
    return widths[-1] if widths else 32


def is_tensor_core(instruction: SassInstruction) -> bool:
    return bool(_TENSOR_CORE.match(instruction.opcode))


def is_fma(instruction: SassInstruction) -> bool:
    return instruction.opcode in _FMA_OPCODES and "MMA" not in instruction.modifiers


def loop_bodies(function: SassFunction) -> list[list[SassInstruction]]:
    """One body per backward branch: the instructions from its target up to the branch itself."""
    bodies = []
    for branch in function.instructions:
        # a branch to itself is the trap after EXIT that ends every function, not a loop
        if branch.branch_target is not None and branch.branch_target < branch.address:
            bodies.append([i for i in function.instructions if branch.branch_target <= i.address <= branch.address])
    return bodies


def sass_stats(function: SassFunction, name: str | None = None) -> SassStats:
    """Counts and notable sites of one function; `name` is its demangled name (the mangled one by default)."""
    name = name or function.mangled
    code = [i for i in function.instructions if i.opcode not in _PADDING_OPCODES]
    stats = SassStats(function.mangled, name, base_name_of(name), function.arch, len(code))
    for instruction in code:
        _count(stats, instruction)
    bodies = loop_bodies(function)
    stats.loop_count = len(bodies)
    stats.max_fma_in_shared_loop = max((_fma_in_shared_loop(body) for body in bodies), default=0)
    stats.has_line_info = any(i.line is not None for i in code)
    return stats


def _count(stats: SassStats, instruction: SassInstruction) -> None:
    access = memory_access(instruction)
    if access is not None:
        _count_access(stats, access)
        _add_site(stats, instruction, f"{access.space}-{access.direction}", access.bits)
    elif is_tensor_core(instruction):
        stats.tensor_core[instruction.opcode] = stats.tensor_core.get(instruction.opcode, 0) + 1
        _add_site(stats, instruction, "tensor-core", None)
    elif instruction.opcode in _BULK_COPY_OPCODES:
        stats.bulk_copies += 1
        _add_site(stats, instruction, "bulk-copy", None)
    elif is_fma(instruction):
        stats.fma_count += 1
        _add_site(stats, instruction, "fma", None)


def _count_access(stats: SassStats, access: MemoryAccess) -> None:
    if access.space == "global":
        widths = stats.global_loads if access.direction == "load" else stats.global_stores
        widths[access.bits] = widths.get(access.bits, 0) + 1
    else:
        counter = f"{access.space}_{access.direction}s"  # e.g. 'local_loads'
        setattr(stats, counter, getattr(stats, counter) + 1)


def _add_site(stats: SassStats, instruction: SassInstruction, kind: str, bits: int | None) -> None:
    stats.sites.append(SassSite(kind, instruction.mnemonic, instruction.address, bits, instruction.file,
                                instruction.line))


def _fma_in_shared_loop(body: list[SassInstruction]) -> int:
    reads_shared = any((a := memory_access(i)) and a.space == "shared" and a.direction == "load" for i in body)
    return sum(is_fma(i) for i in body) if reads_shared else 0


def parse_sass_stats(text: str) -> list[SassStats]:
    """Statistics for every function in the tool output, names demangled in one batch."""
    functions = parse_sass(text)
    names = demangle([f.mangled for f in functions])
    return [sass_stats(f, names.get(f.mangled)) for f in functions]


def find_sass_tool(tool: str) -> str:
    """Path of cuobjdump or nvdisasm: PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin, then PyPI's wheel."""
    for candidate in _tool_candidates(tool):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise SassToolMissing(
        f"{tool} not found (searched PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin and the "
        f"'{_PYPI_PACKAGE[tool]}' package): install the CUDA toolkit or `pip install {_PYPI_PACKAGE[tool]}`.")


def _tool_candidates(tool: str) -> list[str | None]:
    homes = (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")
    return [shutil.which(tool), *(str(Path(h) / "bin" / tool) for h in homes if h), *_pypi_tool_paths(tool)]


def _pypi_tool_paths(tool: str) -> list[str]:
    """The wheels put the binary in nvidia/<cuda_cuobjdump|cu13|...>/bin/ inside site-packages."""
    spec = importlib.util.find_spec("nvidia")  # a namespace package: finding it imports nothing
    folders = spec.submodule_search_locations if spec and spec.submodule_search_locations else []
    return sorted(str(p) for folder in folders for p in Path(folder).glob(f"*/bin/{tool}"))


def is_cubin(path: str | Path) -> bool:
    """A device ELF (what nvcc -cubin writes), as opposed to a host binary or a fatbin."""
    with open(path, "rb") as f:
        header = f.read(20)
    return header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == _CUDA_ELF_MACHINE


def sass_for_cubin(path: str | Path) -> str:
    """SASS text of a binary: `nvdisasm -c -gi` for a cubin (with source lines under -lineinfo), otherwise
    `cuobjdump --dump-sass` (fatbins, objects, executables: cuobjdump prints no line information)."""
    if is_cubin(path):
        return _run_tool([find_sass_tool("nvdisasm"), "-c", "-gi", str(path)])
    return _run_tool([find_sass_tool("cuobjdump"), "--dump-sass", str(path)])


def sass_stats_for_cubin(path: str | Path) -> list[SassStats]:
    return parse_sass_stats(sass_for_cubin(path))


@dataclass(frozen=True)
class ResourceUsage:
    """One function of `cuobjdump --dump-resource-usage`: what a binary says of itself, no ptxas run needed."""

    name: str  # as in the binary (mangled for C++, the generated name for the CuTe DSL)
    registers: int
    stack: int
    shared: int
    local: int  # bytes of local memory per thread: spills and local arrays
    constant: int | None  # cmem[0]


_USAGE_FUNCTION = re.compile(r"^\s*Function (?P<name>[^\s:]+):\s*$")
_USAGE_FIELD = re.compile(r"\b(REG|STACK|SHARED|LOCAL|CONSTANT\[0\]):(\d+)")


def parse_resource_usage(text: str) -> list[ResourceUsage]:
    """`Function NAME:` then `REG:12 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:552 ...` on the next line."""
    found: list[ResourceUsage] = []
    name = None
    for line in text.splitlines():
        header = _USAGE_FUNCTION.match(line)
        if header is not None:
            name = header.group("name")
            continue
        fields = dict(_USAGE_FIELD.findall(line))
        if name is not None and "REG" in fields:
            found.append(ResourceUsage(name, int(fields["REG"]), int(fields.get("STACK", 0)),
                                       int(fields.get("SHARED", 0)), int(fields.get("LOCAL", 0)),
                                       int(fields["CONSTANT[0]"]) if "CONSTANT[0]" in fields else None))
            name = None
    return found


def resource_usage_for_cubin(path: str | Path) -> list[ResourceUsage]:
    return parse_resource_usage(_run_tool([find_sass_tool("cuobjdump"), "--dump-resource-usage", str(path)]))


def _run_tool(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SassToolFailed(f"{Path(argv[0]).name} took longer than {TOOL_TIMEOUT_S:.0f} s on {argv[-1]}") from exc
    if done.returncode != 0:
        raise SassToolFailed(f"{Path(argv[0]).name} failed on {argv[-1]} (exit {done.returncode}): "
                             f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout
