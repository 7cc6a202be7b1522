"""What a candidate's process may see of the worker's environment: an allow-list, never a secret.

Candidates are untrusted code (most written by a model). Their children get only the variables CUDA, torch,
Triton and the compilers need, named here; everything else (the Anthropic API key, the worker's token, cloud
credentials, tokens of any tool) stays behind, and so does any allowed name that looks like a credential.
HOME points at a scratch folder of the child's own, so nothing under the user's home is found through it.
The build caches a candidate needs (torch extensions, Triton) are given as folders of their own under the
worker's cache (builds/), apart from the caches the verifier trusts (baselines/, peaks/) and from the
judge's own build caches (judge-builds/): Triton's cache holds the launcher libraries and cubins the reference's
torch.compile loads, so a cache a candidate could write would run its code in the judge. The driver's JIT cache
is the process's own, in its scratch HOME.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from kernel_lsp.config import cache_dir

ALLOWED_NAMES = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH",
    "CC", "CXX", "CUDAHOSTCXX", "MAX_JOBS", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV", "CONDA_PREFIX", "OMP_NUM_THREADS", "CUTLASS_PATH", "KERNEL_LSP_CACHE_DIR",
    "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "HOSTNAME", "KERNEL_LSP_BWRAP",
})
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NVCC_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TRITON_",
                    "MKL_", "KMP_", "OPENBLAS_", "GOMP_", "NCCL_")
# an allowed prefix does not make a credential safe: TORCH_HUB_TOKEN, CUDA_..._SECRET and the like stay behind
CREDENTIAL = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION)", re.IGNORECASE)
# torch.compile's cache too: its default (/tmp/torchinductor_<user>) is one folder for the judge and every candidate
BUILD_CACHES = {"TORCH_EXTENSIONS_DIR": "torch_extensions", "TRITON_CACHE_DIR": "triton",
                "TORCHINDUCTOR_CACHE_DIR": "torchinductor"}
# the driver's JIT cache stays in the process's own HOME, removed after the run: shared, a candidate could plant the
# SASS that another process's PTX (the verifier's shared-memory fill kernel, say) is loaded as
SCRATCH_CACHES = {"CUDA_CACHE_PATH": ".nv/ComputeCache"}
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding this kernel_lsp


def allowed(name: str) -> bool:
    """Whether a variable of this name reaches a candidate's process."""
    if CREDENTIAL.search(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def candidate_environment(environ: Mapping[str, str], home: str, build_cache_root: Path) -> dict[str, str]:
    """The environment of a candidate's child: the allowed variables of `environ`, HOME at `home`, and the build
    caches in folders of their own under build_cache_root, whatever `environ` says: a judge's environment names
    the judge's folders (use_judge_build_caches), and a folder the worker's user set may be one the judge reads."""
    environment = {name: value for name, value in environ.items() if allowed(name)}
    environment["HOME"] = home
    environment.setdefault("TMPDIR", home)
    for name, folder in BUILD_CACHES.items():
        environment[name] = str(build_cache_root / folder)
    for name, folder in SCRATCH_CACHES.items():
        environment[name] = str(Path(home) / folder)
    return environment


def with_package_on_path(environment: dict[str, str]) -> dict[str, str]:
    """`environment` with this kernel_lsp first on PYTHONPATH: a process started with it runs the worker's own
    code (a sandbox child, a candidate's process, the program ncu profiles)."""
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, environment.get("PYTHONPATH")]))
    return environment


def withheld(environ: Mapping[str, str]) -> list[str]:
    """Names of the variables a candidate does not get (for kernel-lsp doctor: names only, never values)."""
    return sorted(name for name in environ if not allowed(name))


def build_cache_root() -> Path:
    """Where candidates' build caches live: builds/ under the worker's cache folder."""
    return cache_dir() / "builds"


def judge_build_root() -> Path:
    """Where the judge's build caches live: judge-builds/ under the worker's cache folder, which no candidate's
    confined process may write."""
    return cache_dir() / "judge-builds"


def use_judge_build_caches() -> None:
    """Points this process's build caches at the judge's folders. A judge (verify/run.py, profile/measure.py) calls
    it before any reference runs: the reference's torch.compile builds its Triton kernels there, and its compile
    workers, started later, inherit it. The candidate's process it starts gets the candidates' folders back
    (candidate_environment)."""
    for name, folder in BUILD_CACHES.items():
        os.environ[name] = str(judge_build_root() / folder)
