"""The worker's start (kernel_lsp/worker/startup.py): torch and CUDA made ready once, in a thread; on a machine with
no GPU device node, torch's build read from its version file, unimported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.process.namespaces import nvidia_device_present
from kernel_lsp.worker.startup import built_cuda

PROBE = ("import asyncio, json, sys\n"
         "from kernel_lsp.worker.startup import TorchStartup\n"
         "async def main():\n"
         "    startup = TorchStartup()\n"
         "    startup.start()\n"
         "    await startup.wait()\n"
         "    return {'torch': 'torch' in sys.modules, 'cuda': startup.cuda, 'available': startup.cuda_available,\n"
         "            'problem': startup.problem}\n"
         "print(json.dumps(asyncio.run(main())))\n")


def test_torchs_cuda_build_is_read_from_its_version_file(tmp_path: Path):
    version = tmp_path / "version.py"
    version.write_text("from typing import Optional\n__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    assert built_cuda(version) == "13.0"
    version.write_text("__version__ = '2.13.0+cpu'\ncuda = None\n")
    assert built_cuda(version) is None
    version.write_text("cuda = (\n")  # not Python: no answer rather than a wrong one
    assert built_cuda(version) is None
    assert built_cuda(tmp_path / "missing.py") is None


@pytest.mark.skipif(nvidia_device_present(), reason="this machine has a GPU device node: its worker imports torch")
def test_without_a_gpu_the_worker_never_imports_torch_and_says_its_build():
    seen = json.loads(subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                                     timeout=120).stdout)
    import torch  # here, in the test's process: what the worker did not need

    assert seen == {"torch": False, "cuda": torch.version.cuda, "available": False, "problem": None}, seen
