"""What a check reuses from the checks before it, so that an edit costs what it changed and no more.

**Unit results.** A compiler run is a function of its command line, its unit's text, the files that text includes
with quotes, and the tools' and torch's headers' versions. Its raw result (exit status and output, not findings: a
unit's findings depend on where its text sits in the document, which an edit elsewhere in the `.py` moves) is kept
under the hash of all of those, in memory and in the on-disk results file when there is one (the one the editor
and `kernel-lsp check` share). An edit inside a `load_inline` CUDA string then reruns nvcc only, not the host
compiler on its unchanged `main.cpp` (17 s of a 18 s check on the 2-core machine), and the other way round.

**A fast first answer.** nvcc spends nearly all of a `load_inline` check parsing torch's headers: measured with
`nvcc -time`, cicc takes 42.7 s of 44.5 s on a KernelBench ReLU whose CUDA source includes `torch/extension.h`,
and 0.2 s on the same source with its torch includes blanked. nvcc has no precompiled headers; cicc's EDG front end
carries `--create_pch`/`--use_pch`, but using a precompiled header (with ASLR off, as its fixed mapping needs)
segfaults even for a two-line header, and the host compiler's PCH does nothing for the device side. So while the
exact compile runs, the unit split from torch (compile/split.py: its torch includes, wrappers and host functions
blanked, lines kept) is compiled too. When a certificate says its result stands for the exact one (an earlier
version where both agreed, and an edit inside kernel bodies only), it is shown as the unit's full result;
otherwise its errors inside kernel bodies are shown, marked preliminary. Either way the exact result replaces it
when it lands. The split can break a kernel that names a torch type: the errors it gives on a version whose exact
compile had no error in its kernels are the document's calibration, and a preliminary error with one of those
messages is never shown. Until a document has a calibration (its first check), no preliminary errors are shown.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kernel_lsp.compile.diagnostics import CompilerMessage
from kernel_lsp.compile.process import ProcessResult
from kernel_lsp.compile.split import Output, skeleton
from kernel_lsp.compile.units import CompileUnit
from kernel_lsp.jobs.cache import cache_key, stamp
from kernel_lsp.paths import read_regular_text, resolved

if TYPE_CHECKING:
    from kernel_lsp.jobs.cache import ResultCache

log = logging.getLogger(__name__)

UNIT_FORMAT = 1  # bump when what a unit result holds changes
_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)
_MAX_DEPENDENCIES = 256
# files whose stamps stand for the version of torch's headers (a reinstall rewrites them)
_TORCH_VERSION_FILES = ("torch/headeronly/version.h", "torch/csrc/api/include/torch/version.h")
PRELIMINARY = "preliminary: nvcc without torch's headers; the full check follows"


def quoted_dependencies(path: Path, text: str, include_dirs: tuple[str, ...]) -> list[Path]:
    """Files reachable through #include "..." from the buffer, searched as the preprocessor would."""
    found: list[Path] = []
    seen: set[Path] = set()
    pending = [(path.parent, text)]
    while pending and len(found) < _MAX_DEPENDENCIES:
        directory, source = pending.pop()
        for name in _QUOTED_INCLUDE.findall(source):
            for base in (directory, *map(Path, include_dirs)):
                candidate = resolved(base / name)
                if candidate.is_file():
                    if candidate not in seen:
                        seen.add(candidate)
                        found.append(candidate)
                        pending.append((candidate.parent, read_regular_text(candidate) or ""))
                    break
    return found


def header_stamps(include_dirs: tuple[str, ...]) -> list[tuple]:
    """Stamps (path, mtime, size) that change when torch's headers are upgraded or reinstalled in place: its
    version headers, and each include folder itself."""
    stamps = [stamp(Path(d)) for d in include_dirs]
    for d in include_dirs:
        stamps += [stamp(Path(d) / name) for name in _TORCH_VERSION_FILES if (Path(d) / name).is_file()]
    return stamps


def kernel_body_errors(unit: CompileUnit, messages: list[CompilerMessage]) -> list[CompilerMessage]:
    """The errors on lines inside the unit's kernel bodies (unit positions; the unit's own file only)."""
    bodies = [(k.body_range.start.line, k.body_range.end.line) for k, _ in unit.kernels if k.body_range]
    return [m for m in messages if m.severity in ("error", "fatal") and m.line is not None
            and m.file is not None and Path(m.file).name == unit.file_name
            and any(first <= m.line - 1 <= last for first, last in bodies)]


@dataclass(frozen=True)
class _Certificate:
    argv: tuple[str, ...]  # the command line, and the versions of the tools and torch's headers
    skeleton: str  # compile/split.py: the certified version with its kernel bodies emptied


@dataclass
class _Calibration:
    messages: frozenset[str]  # what the blanked compile says in kernel bodies where the exact one says nothing


class Reuse:
    """The unit results and fast-check calibrations of one CompileService (one server, or one CLI run)."""

    def __init__(self, cache: "ResultCache | None" = None, max_entries: int = 256) -> None:
        self._cache = cache  # its on-disk file, once the workspace has attached one, holds unit results too
        self._results: OrderedDict[str, ProcessResult] = OrderedDict()
        self._max = max_entries
        self._calibrations: dict[tuple[str, str], _Calibration] = {}
        self._certificates: dict[tuple[str, str], _Certificate] = {}
        self._torch_tokens: dict[str, frozenset[str]] = {}
        self._learning: dict[str, threading.Thread] = {}
        self.hits = 0
        self.composed = 0  # split results shown as a unit's full result
        self.disagreements = 0  # of those, how many the exact compile then contradicted

    # --- unit results ---------------------------------------------------------------------------------------

    @staticmethod
    def unit_key(argv: list[str], unit: CompileUnit, document: Path, tools: list[str]) -> str:
        """Everything the run's result depends on (reads the quoted includes' stamps: call it off the loop)."""
        dependencies = quoted_dependencies(document, unit.text, unit.include_dirs)
        return cache_key("unit", UNIT_FORMAT, argv, unit.file_name, unit.text, [stamp(p) for p in dependencies],
                         tools)

    def get(self, key: str) -> ProcessResult | None:
        result = self._results.get(key)
        disk = self._cache.disk if self._cache is not None else None
        if result is None and disk is not None:
            result = _from_disk(disk.get(key))
        if result is not None:
            self.hits += 1
            self._remember(key, result)
        return result

    def put(self, key: str, result: ProcessResult) -> None:
        """Kept unless the run itself went wrong (timed out, killed): the next check tries again."""
        if result.timed_out or result.returncode is None or result.returncode < 0:
            return
        self._remember(key, result)
        disk = self._cache.disk if self._cache is not None else None
        if disk is not None:
            disk.put(key, {"unit": UNIT_FORMAT, "argv": list(result.argv), "returncode": result.returncode,
                                "stdout": result.stdout, "stderr": result.stderr, "duration_s": result.duration_s})

    def _remember(self, key: str, result: ProcessResult) -> None:
        self._results[key] = result
        self._results.move_to_end(key)
        while len(self._results) > self._max:
            self._results.popitem(last=False)

    # --- fast-check calibration -----------------------------------------------------------------------------

    def calibrate(self, uri: str, unit: CompileUnit, exact: list[CompilerMessage],
                  fast: list[CompilerMessage]) -> None:
        """After both compiles of one version: when the exact one has no error in the kernels, what the blanked
        one says there is noise of the blanking, never shown as a preliminary error."""
        if not kernel_body_errors(unit, exact):
            self._calibrations[(uri, unit.file_name)] = _Calibration(
                frozenset(m.message for m in kernel_body_errors(unit, fast)))

    def preliminary(self, uri: str, unit: CompileUnit, fast: list[CompilerMessage]) -> list[CompilerMessage]:
        """The blanked compile's kernel errors worth showing before the exact result: none before calibration."""
        calibration = self._calibrations.get((uri, unit.file_name))
        if calibration is None:
            return []
        return [m for m in kernel_body_errors(unit, fast) if m.message not in calibration.messages]

    # --- split certificates (compile/split.py) ----------------------------------------------------------------

    def certify(self, uri: str, unit: CompileUnit, argv: list[str], exact: Output, split: Output) -> bool:
        """After both compiles of one version: equal outputs of a version that compiled (so that ptxas's figures
        were compared too) earn the document's unit a certificate, different ones lose it. Returns whether they
        were equal."""
        key = (uri, unit.file_name)
        if exact != split:
            self._certificates.pop(key, None)
            return False
        if exact.returncode == 0:
            self._certificates[key] = _Certificate(tuple(argv), skeleton(unit))
        return True

    def composable(self, uri: str, unit: CompileUnit, argv: list[str]) -> bool:
        """Whether the split compile of this version stands for its exact one: a certificate from a version with
        the same skeleton and command line."""
        certificate = self._certificates.get((uri, unit.file_name))
        return certificate is not None and certificate.argv == tuple(argv) and certificate.skeleton == skeleton(unit)

    def torch_tokens(self, key: str) -> frozenset[str] | None:
        return self._torch_tokens.get(key)

    def learn_torch_tokens(self, key: str, learn: Callable[[], frozenset[str] | None]) -> None:
        """Lists torch's names for `key` once, in a daemon thread of its own (`learn` blocks: it runs a process).
        Not an asyncio subprocess: the check that asks does not wait, so the listing may still be starting when a
        CLI run ends, and asyncio.run hangs on a subprocess cancelled while it starts (CPython 3.11)."""
        if key in self._torch_tokens or key in self._learning:
            return

        def run() -> None:
            try:
                tokens = learn()
                if tokens is not None:
                    self._torch_tokens[key] = tokens
            except Exception:  # noqa: BLE001 - without the names, split errors stay preliminary
                log.exception("listing torch's names failed")
            finally:
                self._learning.pop(key, None)

        thread = self._learning[key] = threading.Thread(target=run, name="kernel-lsp torch names", daemon=True)
        thread.start()

    async def settled(self) -> None:
        """Returns once the names being listed in the background are listed (tests, benchmarks)."""
        while self._learning:
            await asyncio.sleep(0.05)

    def forget(self, uri: str) -> None:
        for table in (self._calibrations, self._certificates):
            for key in [k for k in table if k[0] == uri]:
                del table[key]


def _from_disk(value: dict | None) -> ProcessResult | None:
    """A stored unit result, or None for anything else under that key (a record of another format)."""
    if not isinstance(value, dict) or value.get("unit") != UNIT_FORMAT:
        return None
    try:
        return ProcessResult(tuple(value["argv"]), int(value["returncode"]), str(value["stdout"]),
                             str(value["stderr"]), False, float(value["duration_s"]))
    except (KeyError, TypeError, ValueError):
        return None


def scratch_file(directory: Path, name: str, text: str) -> None:
    """Writes a unit where its compiler reads it (an editor buffer may hold lone surrogates: U+FFFD there)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text, encoding="utf-8", errors="replace")
