"""Which files of a workspace folder the server checks in the background, and which it watches for changes.

IgnoreRules follows git's rules: the .gitignore files from the enclosing repository's top down to the file's folder
(a nested .gitignore is relative to its own folder and overrides the ones above it), then .git/info/exclude; a
folder that is ignored hides everything below it (git cannot re-include a file there either). The `excludes`
patterns (gitignore syntax, relative to the workspace root) come on top: what they exclude stays excluded whatever a
.gitignore says.

Standard library and pathspec only: the server imports this module.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pathspec import GitIgnoreSpec

KERNEL_SUFFIXES = (".cu", ".cuh", ".py")  # files the server checks
DEPENDENCY_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".inl", ".cuh", ".cu", ".py")  # files whose change can matter
DEFAULT_EXCLUDES = (".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache",
                    ".pytest_cache", "build", "dist", "*.egg-info")

_HAS_CHECK_FILE = hasattr(GitIgnoreSpec, "check_file")
_SCANNED = frozenset(DEPENDENCY_SUFFIXES) | frozenset(KERNEL_SUFFIXES)
_Layer = tuple[str, GitIgnoreSpec]  # (folder relative to the repository top, "" for the top; its .gitignore)


class IgnoreRules:
    """Whether a path under one workspace folder is ignored. Reads each .gitignore once, when a path below its folder
    is first asked about; after a .gitignore changes, call invalidate() (or make new rules)."""

    def __init__(self, root: Path, excludes: Sequence[str] = DEFAULT_EXCLUDES) -> None:
        self.root = Path(root).resolve()
        self.top = _repository_top(self.root)  # the nearest folder at or above root holding .git; else root
        self._root_rel = self.root.relative_to(self.top).as_posix() if self.top != self.root else ""
        self._excludes = GitIgnoreSpec.from_lines(list(excludes))
        self.invalidate()

    @classmethod
    def for_folder(cls, root: Path, excludes: Sequence[str] = DEFAULT_EXCLUDES) -> IgnoreRules:
        return cls(root, excludes)

    def invalidate(self) -> None:
        """Forget the .gitignore files read so far and the folders decided (after a .gitignore or exclude changed)."""
        self._info: GitIgnoreSpec | None = _read_spec(self.top / ".git" / "info" / "exclude")
        self._chains: dict[str, tuple[_Layer, ...]] = {}
        self._dirs: dict[str, bool] = {}  # folder relative to root -> ignored (itself or an ancestor)

    def ignored(self, path: Path, is_dir: bool | None = None) -> bool:
        """True when git would ignore the path, an `excludes` pattern matches it, a folder above it is ignored, or it
        lies outside the root. The root itself is never ignored."""
        rel = self._relative(Path(path))
        if rel is None:
            return True
        if rel == "":
            return False
        folder, _, _ = rel.rpartition("/")
        if self._dir_ignored(folder):
            return True
        if is_dir is None:
            is_dir = os.path.isdir(path)
        return self._decide(rel, is_dir, self._chain(folder))

    # -- internals shared with scan_folder: paths are posix strings relative to root ("" is the root) --

    def _relative(self, path: Path) -> str | None:
        """The path relative to root as given (`..` folded), else resolved (a link into root, /tmp -> /private/tmp)."""
        if not path.is_absolute():
            return None
        for candidate in (lambda: Path(os.path.normpath(path)), path.resolve):
            try:
                rel = candidate().relative_to(self.root).as_posix()
            except (ValueError, OSError):
                continue
            return "" if rel == "." else rel
        return None

    def _dir_ignored(self, folder: str) -> bool:
        """Whether a folder (relative to root) or one above it is ignored; decisions are cached."""
        if folder == "":
            return False
        known = self._dirs.get(folder)
        if known is None:
            parent, _, _ = folder.rpartition("/")
            known = self._dir_ignored(parent) or self._decide(folder, True, self._chain(parent))
            self._dirs[folder] = known
        return known

    def _chain(self, folder: str) -> tuple[_Layer, ...]:
        """The .gitignore layers that apply to entries of `folder` (relative to root), from the top down."""
        chain = self._chains.get(folder)
        if chain is not None:
            return chain
        if folder == "":
            chain = self._above_root()
        else:
            parent, _, _ = folder.rpartition("/")
            chain = self._chain(parent)
        here = _join(self._root_rel, folder)
        spec = _read_spec(self.top / here / ".gitignore" if here else self.top / ".gitignore")
        if spec is not None:
            chain = (*chain, (here, spec))
        self._chains[folder] = chain
        return chain

    def _above_root(self) -> tuple[_Layer, ...]:
        """The .gitignore files of the folders from the repository top down to root's parent."""
        layers: list[_Layer] = []
        if self._root_rel:
            parts = self._root_rel.split("/")
            for depth in range(len(parts)):
                here = "/".join(parts[:depth])
                spec = _read_spec(self.top / here / ".gitignore" if here else self.top / ".gitignore")
                if spec is not None:
                    layers.append((here, spec))
        return tuple(layers)

    def _decide(self, rel: str, is_dir: bool, chain: tuple[_Layer, ...]) -> bool:
        """The entry itself (its ancestors already not ignored): excludes, then the deepest .gitignore with a
        matching pattern (its last match decides, `!` re-includes), then .git/info/exclude."""
        key = rel + "/" if is_dir else rel  # a trailing slash is what lets dir-only patterns (`build/`) match
        if self._excludes.match_file(key):
            return True
        key = _join(self._root_rel, key)
        for here, spec in reversed(chain):
            included = _check(spec, key[len(here) + 1:] if here else key)
            if included is not None:
                return included
        if self._info is not None:
            return _check(self._info, key) is True
        return False


def _check(spec: GitIgnoreSpec, key: str) -> bool | None:
    """The last matching pattern's verdict: True ignored, False re-included (`!`), None when none matches."""
    if _HAS_CHECK_FILE:
        return spec.check_file(key).include
    verdict = None
    for pattern in spec.patterns:  # pathspec without check_file (before 0.12)
        if pattern.include is not None and pattern.match_file(key) is not None:
            verdict = pattern.include
    return verdict


def _join(prefix: str, rel: str) -> str:
    if not prefix:
        return rel
    return f"{prefix}/{rel}" if rel else prefix


def _repository_top(root: Path) -> Path:
    for folder in (root, *root.parents):
        if (folder / ".git").exists():
            return folder
    return root


def _read_spec(path: Path) -> GitIgnoreSpec | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # missing, a folder, unreadable
        return None
    lines = text.splitlines()
    if not any(line.strip() and not line.startswith("#") for line in lines):
        return None
    return GitIgnoreSpec.from_lines(lines)


@dataclass
class ScanResult:
    files: list[Path]  # absolute, resolved, sorted; suffix in DEPENDENCY_SUFFIXES or KERNEL_SUFFIXES, not ignored
    ignored_dirs: int  # folders pruned
    truncated: bool  # stopped at max_files
    seconds: float
    unreadable_dirs: int = 0  # folders that could not be listed (skipped)


def scan_folder(root: Path, rules: IgnoreRules | None = None, max_files: int = 50_000) -> ScanResult:
    """The files under root worth watching: an os.scandir walk in name order that prunes ignored folders without
    entering them and does not follow symlinks to folders. More than max_files files -> the first max_files, truncated.

    rules may be those of a folder above root (a folder created inside a workspace folder is scanned with the
    workspace folder's rules); root itself ignored by them -> nothing. Rules of a folder not above root: ValueError."""
    started = time.perf_counter()
    root = Path(root).resolve()
    if rules is None:
        rules = IgnoreRules.for_folder(root)
    start = rules._relative(root)
    if start is None:
        raise ValueError(f"ignore rules made for {rules.root}, which does not hold {root}")
    if rules._dir_ignored(start):
        return ScanResult(files=[], ignored_dirs=1, truncated=False, seconds=time.perf_counter() - started)
    found: set[str] = set()
    ignored_dirs = unreadable = 0
    truncated = False
    stack: list[tuple[str, str]] = [(str(root), start)]  # (folder, its path relative to the rules' root)
    while stack and not truncated:
        folder, rel = stack.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            unreadable += 1
            continue
        chain = rules._chain(rel)
        below: list[tuple[str, str]] = []
        for entry in entries:
            name = entry.name
            child = f"{rel}/{name}" if rel else name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if rules._decide(child, True, chain):
                        ignored_dirs += 1
                    else:
                        below.append((entry.path, child))
                    continue
                if os.path.splitext(name)[1] not in _SCANNED or not entry.is_file():  # follows a link to a file
                    continue
                is_link = entry.is_symlink()
            except OSError:
                continue
            if rules._decide(child, False, chain):
                continue
            path = os.path.realpath(entry.path) if is_link else entry.path
            if path in found:
                continue
            if len(found) >= max_files:
                truncated = True
                break
            found.add(path)
        stack.extend(reversed(below))  # depth first, in name order
    return ScanResult(files=sorted(Path(path) for path in found), ignored_dirs=ignored_dirs, truncated=truncated,
                      seconds=time.perf_counter() - started, unreadable_dirs=unreadable)


_KERNEL_WORDS = ("load_inline", "cpp_extension", "triton", "ModelNew", "Model", "kernel-lsp")
_KERNEL_TEXT = re.compile(
    r"\bload_inline\b|\bcpp_extension\b"
    r"|^[ \t]*(?:import[ \t]+triton\b|from[ \t]+triton\b)|^[ \t]*@[ \t]*triton\."
    r"|^[ \t]*class[ \t]+ModelNew\b"
    r"|^[ \t]*#[ \t]*kernel-lsp:[ \t]*reference[ \t]*=",
    re.MULTILINE)
_MODEL_CLASS = re.compile(r"^class[ \t]+Model\b", re.MULTILINE)
_GET_INPUTS = re.compile(r"^def[ \t]+get_inputs\b", re.MULTILINE)


def is_kernel_file(path: Path, text: str) -> bool:
    """Whether the server checks this file: .cu and .cuh always; a .py only when its text mentions a kernel
    (load_inline, cpp_extension, a triton import or decorator, class ModelNew, class Model with get_inputs, or a
    `# kernel-lsp: reference=` header). Textual, so it may say yes to a file that only names these."""
    suffix = Path(path).suffix
    if suffix in (".cu", ".cuh"):
        return True
    if suffix != ".py" or not any(word in text for word in _KERNEL_WORDS):
        return False
    if _KERNEL_TEXT.search(text):
        return True
    return _MODEL_CLASS.search(text) is not None and _GET_INPUTS.search(text) is not None
