"""What the profile job measures in a sandboxed child on the GPU, besides ncu: the candidate's extension binaries
(for their SASS), the reference forward's PyTorch kernels and their device time, the candidate's energy per
call, the GPU's roofline ceilings and its state. Each part that cannot be measured becomes a problem."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kernel_lsp.profile.driver import (
    build_model,
    load_problem,
    make_inputs,
    run_forward,
)
from profilers.nvml import ENERGY_MIN_SECONDS

PROC_MAPS = Path("/proc/self/maps")
# libraries that are not the candidate's: the toolkit's, Python packages' and the system's, Triton's launchers
FOREIGN_LIBRARY_MARKERS = ("site-packages", "dist-packages", ".triton")
SYSTEM_PREFIXES = ("/usr/", "/lib", "/opt/", "/etc/")


def measure_candidate(candidate: str, reference: str | None = None, cache_dir: str | None = None,
                      energy_seconds: float = ENERGY_MIN_SECONDS, device: str = "cuda") -> dict[str, Any]:
    """The sandbox entry ("kernel_lsp.profile.measure:measure_candidate"); a failing candidate raises, so the
    sandbox reports it on the candidate's own line."""
    problems: list[str] = []
    before = mapped_libraries()
    candidate_module, inputs_module = load_problem(candidate, reference)
    model = build_model(candidate_module, inputs_module, device)
    inputs = make_inputs(inputs_module, device)
    run_forward(model, inputs, 1)  # extensions built and loaded, lazy initialisation done
    reference_model = build_reference(inputs_module, device, problems)
    candidate_energy = energy(model, inputs, device, energy_seconds, problems)
    return {"extensions": sorted(own_libraries(mapped_libraries() - before)),
            "reference_kernels": reference_kernels(reference_model, inputs, problems),
            "energy": candidate_energy,
            # the reference on the same inputs, read the same way: what the agent's rubric compares against
            "reference_energy": (energy(reference_model, inputs, device, energy_seconds, problems)
                                 if candidate_energy is not None and reference_model is not None else None),
            "ceilings": ceilings(device, cache_dir, problems),
            "gpu_state": gpu_state(device), "problems": problems}


def mapped_libraries() -> set[str]:
    """The shared libraries this process has mapped (Linux): load_inline does not put its module in sys.modules,
    so what the candidate loaded is found by what appeared here."""
    try:
        lines = PROC_MAPS.read_text().splitlines()
    except OSError:
        return set()
    return {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6 and ".so" in line}


def own_libraries(paths: set[str]) -> set[str]:
    """The candidate's own builds among newly mapped libraries (its load_inline or load extensions)."""
    pythons = tuple(f"{prefix}/" for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    return {path for path in paths if path.startswith("/") and not path.startswith(SYSTEM_PREFIXES + pythons)
            and not any(marker in path for marker in FOREIGN_LIBRARY_MARKERS)}


def build_reference(inputs_module: Any, device: str, problems: list[str]) -> Any:
    """The reference's Model (in the reference, or in the candidate's own file) with the verification's weights
    seed; None when there is none or it cannot be built (said in problems)."""
    import torch

    from kernel_lsp.verify.models import WEIGHTS_SEED
    from kernel_lsp.verify.run import init_inputs

    if not hasattr(inputs_module, "Model"):
        return None
    try:
        torch.manual_seed(WEIGHTS_SEED)
        return inputs_module.Model(*init_inputs(inputs_module)).to(device).eval()
    except Exception as exc:  # the reference's failure is reported, not the candidate's
        problems.append(f"no reference measurements: the reference's Model could not be built: "
                        f"{type(exc).__name__}: {exc}")
        return None


def reference_kernels(model: Any, inputs: tuple, problems: list[str]) -> list[dict[str, Any]]:
    """The PyTorch kernels of the reference's forward and their device times."""
    from profilers.torch_kernels import KernelTimesUnavailable, forward_kernels

    if model is None:
        return []
    try:
        return [kernel.to_dict() for kernel in forward_kernels(lambda: model(*inputs))]
    except KernelTimesUnavailable as exc:
        problems.append(f"no reference kernel list: {exc}")
    except Exception as exc:  # the reference's failure is reported, not the candidate's
        problems.append(f"no reference kernel list: the reference's forward failed: {type(exc).__name__}: {exc}")
    return []


def energy(model: Any, inputs: tuple, device: str, seconds: float, problems: list[str]) -> dict[str, Any] | None:
    import torch

    from kernel_lsp.verify.baselines import current_cuda_index, nvml_index_of
    from profilers.nvml import NvmlUnavailable, energy_per_call

    if not device.startswith("cuda"):
        problems.append(f"no energy reading: the candidate ran on {device}, not a GPU")
        return None
    index = nvml_index_of(current_cuda_index())
    if index is None:
        problems.append("no energy reading: CUDA_VISIBLE_DEVICES names GPUs by UUID, so the NVML index is unknown")
        return None
    try:
        with torch.no_grad():
            return energy_per_call(lambda: model(*inputs), torch.cuda.synchronize, index, seconds)
    except NvmlUnavailable as exc:
        problems.append(f"no energy reading: {exc}")
        return None


def ceilings(device: str, cache_dir: str | None, problems: list[str]) -> dict[str, Any] | None:
    from profilers.roofline import measured_ceilings

    if not device.startswith("cuda"):
        problems.append(f"no roofline ceilings: the candidate ran on {device}, not a GPU")
        return None
    try:
        return measured_ceilings(device, Path(cache_dir) if cache_dir else None).to_dict()
    except Exception as exc:  # ncu's theoretical ceilings stand in: the profile itself does not need them
        problems.append(f"roofline ceilings not measured ({type(exc).__name__}: {exc}); ncu's theoretical "
                        "ones are used")
        return None


def gpu_state(device: str) -> dict[str, Any]:
    from kernel_lsp.verify.baselines import gpu_state as nvml_state

    return nvml_state(device)
