"""The worker's start: torch imported and CUDA initialised once, in a thread, while the worker already answers
(jobs that need either wait for it; `JobContext.startup`). Not the verifier's warm-up calls, which are untimed calls
of a contender before its timed rounds (verify/run.py).

On a machine without a GPU device node there is no CUDA to initialise, and the worker itself runs no torch (its
sandbox children import their own): it reads torch's build from its version file instead of importing it (~2.4 s
of CPU and ~300 MB a worker)."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
from pathlib import Path

from kernel_lsp.process.namespaces import nvidia_device_present

TORCH_MISSING = "torch is not installed in the worker's Python: pip install 'kernel-lsp[worker]'"


class TorchStartup:
    """torch imported and CUDA initialised once, in a thread, while the worker already answers."""

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.cuda: str | None = None
        self.cuda_available = False
        self.problem: str | None = None

    def start(self) -> None:
        self.task = asyncio.ensure_future(asyncio.to_thread(self._warm))

    async def wait(self) -> None:
        if self.task is not None:
            await asyncio.shield(self.task)

    def _warm(self) -> None:
        if not nvidia_device_present():
            spec = importlib.util.find_spec("torch")
            if spec is None or not spec.submodule_search_locations:
                self.problem = TORCH_MISSING
            else:
                self.cuda = built_cuda(Path(next(iter(spec.submodule_search_locations))) / "version.py")
            return
        try:
            import torch
        except ImportError:
            self.problem = TORCH_MISSING
            return
        self.cuda = torch.version.cuda
        self.cuda_available = torch.cuda.is_available()
        if self.cuda_available:
            torch.cuda.init()


def built_cuda(version_file: Path) -> str | None:
    """`torch.version.cuda` read from torch's generated version.py (`cuda: Optional[str] = '13.0'`), unimported;
    None for a CPU build or a file that does not say."""
    try:
        tree = ast.parse(version_file.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node.value, ast.Constant):
            return node.value.value if isinstance(node.value.value, str) else None
    return None
