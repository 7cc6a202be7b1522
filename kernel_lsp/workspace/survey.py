"""What the server's workspace feature and `kernel-lsp check` share: one pass over the folders (every file read once
into the dependency graph, the kernel files picked out), which kernel files are checked on their own, where a
workspace's results live on disk, and how one file's findings read in a summary."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kernel_lsp.findings import Finding, Severity
from kernel_lsp.paths import read_regular_text
from kernel_lsp.workspace.graph import DependencyGraph
from kernel_lsp.workspace.scan import DEFAULT_EXCLUDES, KERNEL_SUFFIXES, IgnoreRules, is_kernel_file, scan_folder


@dataclass
class Survey:
    rules: dict[Path, IgnoreRules] = field(default_factory=dict)  # per resolved root
    graph: DependencyGraph = field(default_factory=DependencyGraph)
    digests: dict[Path, str] = field(default_factory=dict)  # every file read: the digest of its text
    kernel_paths: set[Path] = field(default_factory=set)
    truncated: bool = False

    def checked_alone(self, path: Path) -> bool:
        return checked_alone(path, self.graph)


def exclude_patterns(workspace_exclude: Sequence[str]) -> tuple[str, ...]:
    """What is never scanned: the folders always skipped, then the `workspaceExclude` setting's patterns."""
    return (*DEFAULT_EXCLUDES, *workspace_exclude)


def survey(roots: Iterable[Path], excludes: Sequence[str], include_dirs: Sequence[Path] = (),
           reference_of: Callable[[Path, str], Path | None] | None = None,
           rules: Mapping[Path, IgnoreRules] | None = None) -> Survey:
    """Every folder scanned (.gitignore and `excludes` honoured), every file read once into the graph. `rules`:
    ignore rules already read for (resolved) roots, used instead of reading them again. Blocking: the server runs
    it in a thread."""
    found = Survey(graph=DependencyGraph(list(include_dirs), reference_of))
    for root in roots:
        root = root.resolve()
        known = (rules or {}).get(root)
        found.rules[root] = known if known is not None else IgnoreRules.for_folder(root, excludes)
        result = scan_folder(root, found.rules[root])
        found.truncated |= result.truncated
        for path in result.files:
            text = read_regular_text(path)
            if text is None:
                continue
            found.digests[path] = digest(text)
            found.graph.update(path, text)
            if path.suffix in KERNEL_SUFFIXES and is_kernel_file(path, text):
                found.kernel_paths.add(path)
    return found


def checked_alone(path: Path, graph: DependencyGraph) -> bool:
    """Whether a kernel file is checked on its own: a header (.cuh) that another file includes is checked through
    its includers, where its macros and types have the context it is written for."""
    return path.suffix != ".cuh" or not graph.dependents(path)


def results_file(cache_root: Path, folders: Sequence[Path]) -> Path:
    """The on-disk result cache of a workspace: one file per set of folders, so the server opened on a folder and
    `kernel-lsp check` run in it share their results."""
    name = hashlib.sha256("\n".join(str(Path(f).resolve()) for f in folders).encode()).hexdigest()[:20]
    return cache_root / "results" / f"{name}.msgpack"


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def kernel_names(path: Path, text: str | None = None) -> list[str]:
    """The kernels a file defines: __global__ functions, @triton.jit and @cute.kernel functions, and those of inline
    CUDA sources."""
    from kernel_lsp.sources import find_kernels, parse_python

    if text is None:
        text = read_regular_text(path) or ""
    if path.suffix in (".cu", ".cuh"):
        return [k.name for k in find_kernels(text)]
    model = parse_python(text)
    names = [k.name for k in model.triton_kernels]
    names += [k.name for k in model.cute_kernels if k.role == "kernel"]
    for extension in model.extensions:
        for source in extension.cuda_sources:
            names += [k.name for k in find_kernels(source.text)]
    return names


# findings that say this machine could not finish the file's compile (what it lacks, not what the file does wrong)
UNCHECKED_CODES = frozenset({"torch-cpu-build"})


def compile_state(findings: list[Finding]) -> tuple[str, int, int]:
    """("errors" | "not checked" | "warnings" | "compiles", errors, warnings) of one file's compile findings: "not
    checked" where no error was found but the compile stopped at the machine's limit (UNCHECKED_CODES)."""
    errors = sum(1 for f in findings if f.severity == Severity.ERROR)
    warnings = sum(1 for f in findings if f.severity == Severity.WARNING)
    if not errors and any(f.code in UNCHECKED_CODES for f in findings):
        return "not checked", errors, warnings
    return ("errors" if errors else "warnings" if warnings else "compiles"), errors, warnings


def resources(findings: list[Finding], limit: int = 4) -> list[str]:
    """ptxas's resource lines (registers, spills, shared memory) of one file, at most `limit`."""
    return [f.message for f in findings if f.code == "ptxas-resources"][:limit]


def top_hint(findings: list[Finding]) -> str | None:
    """The most important hint: highest severity, then the largest estimated speedup."""
    if not findings:
        return None
    best = min(findings, key=lambda f: (int(f.severity), -float((f.data or {}).get("estimatedSpeedup") or 0)))
    return f"{best.code}: {best.message.splitlines()[0]}"
