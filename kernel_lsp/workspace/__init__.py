"""The whole workspace in the background: which files to check (scan.py) and which files depend on which (graph.py).

Standard library and pathspec only: no pygls, torch or watchdog; the server's workspace feature drives these.
"""

from kernel_lsp.workspace.graph import DependencyGraph, Edge
from kernel_lsp.workspace.scan import (
    DEFAULT_EXCLUDES,
    DEPENDENCY_SUFFIXES,
    KERNEL_SUFFIXES,
    IgnoreRules,
    ScanResult,
    is_kernel_file,
    scan_folder,
)

__all__ = [
    "DEFAULT_EXCLUDES",
    "DEPENDENCY_SUFFIXES",
    "KERNEL_SUFFIXES",
    "DependencyGraph",
    "Edge",
    "IgnoreRules",
    "ScanResult",
    "is_kernel_file",
    "scan_folder",
]
