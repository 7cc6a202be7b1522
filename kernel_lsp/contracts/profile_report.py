"""What a ProfileReport says beside its kernels: its problems, each a code (what a reader branches on: the server's
note or warning, the agent's "no news") and a message (what a person reads). Stdlib only, as verify_report.

On the wire a problem is `{"code": ..., "message": ...}` in the report's `problems` array (contracts.codec encodes
and decodes it); the kernels themselves are still the dicts docs/ARCHITECTURE.md describes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProfileProblem:
    code: str  # one of PROBLEM_CODES
    message: str  # a sentence for a person: never compared by code that reads it


# code -> what it means (docs/reference/findings.md lists them, generated from it)
PROBLEM_CODES: dict[str, str] = {
    "profile-on-cpu": "asked for on the CPU (device cpu): the static profile (ptxas and SASS) instead of ncu",
    "profile-no-gpu": "no GPU visible to the worker: the static profile instead of ncu, energy and reference times",
    "profile-cuda-file": "a .cu file profiled statically (by the server, or a file without main())",
    "profile-program-static": "a program (its own main()) profiled statically: no worker connected to a GPU yet",
    "profile-static-stands-in": "ncu profiled no kernel: the static profile stands in",
    "profile-no-cuda-source": "the candidate holds no CUDA source to compile: nothing to profile statically",
    "profile-tool-missing": "nvcc or torch's headers were not found: no static profile",
    "profile-build-failed": "nvcc could not build a unit or the program (its errors are on their lines)",
    "profile-bad-header": "a `// kernel-lsp:` header line of a program does not parse",
    "profile-no-sass": "no SASS of a binary (cuobjdump or nvdisasm missing or failed): ptxas figures only",
    "profile-ncu-failed": "ncu did not profile the candidate (its message says why)",
    "profile-candidate-failed": "the candidate did not run in the measuring sandbox",
    "profile-no-reference": "no reference measurements: its Model could not be built or its forward failed",
    "profile-no-energy": "no energy reading (not a GPU, NVML unavailable, a GPU named by UUID)",
    "profile-no-ceilings": "no measured roofline ceilings (ncu's theoretical ones stand in, or an import lacks them)",
    "profile-no-launches": "an imported ncu export holds no kernel launches",
    "profile-not-isolated": "the candidate ran without full isolation",
    "profile-contract": "a problem the worker sent in a form this client does not read (another version)",
}

# why the profile is static where the caller or this machine chose it: a note, not a warning, and no news to the
# agent that asked
NOTE_CODES = frozenset({"profile-on-cpu", "profile-no-gpu", "profile-cuda-file", "profile-program-static"})
