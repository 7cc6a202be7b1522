"""What the profile job measures on the GPU, besides ncu: the candidate's extension binaries (for their SASS),
the reference forward's PyTorch kernels and their device time, the candidate's energy per call, the GPU's
roofline ceilings and its state. Each part that cannot be measured becomes a problem.

Two processes share the work, as in verification (verify/run.py): the sandbox child (`measure_candidate`)
never imports the candidate; it measures the ceilings (and writes them to the cache), the GPU's state, the
reference's kernels and energy. The candidate is imported, built and run only in its own confined process
(candidate/side.py, op "call", which calls `candidate_side`): its energy, the libraries it loaded and, when the
candidate's file is its own reference, that reference's figures are its word. They are hints for the editor,
never a verdict, and are checked for shape before the worker uses them.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_lsp.contracts.codec import Wire, encode
from kernel_lsp.contracts.profile_report import (
    PROBLEM_CODES,
    EnergyReading,
    ProfileCeilings,
    ProfileMeasurements,
    ProfileProblem,
    ReferenceKernel,
)
from kernel_lsp.contracts.verify_report import Isolation
from kernel_lsp.profile.driver import (
    ProblemError,
    build_model,
    make_inputs,
    run_forward,
)
from kernel_lsp.profile.report import report_ceilings
from profilers.nvml import ENERGY_MIN_SECONDS
from profilers.roofline import Ceilings

if TYPE_CHECKING:
    import torch

PROC_MAPS = Path("/proc/self/maps")
FP32_MATMUL_SIZE = 8192
FP32_REPEATS = 10
# libraries that are not the candidate's: the toolkit's, Python packages' and the system's, Triton's launchers
TRITON_LAUNCHERS = ".triton"  # the launcher libraries Triton builds for its kernels: not the candidate's own


def measure_candidate(candidate: str, reference: str | None = None, cache_dir: str | None = None,
                      energy_seconds: float = ENERGY_MIN_SECONDS, device: str = "cuda",
                      allow_network: bool = False) -> Wire:
    """The sandbox entry ("kernel_lsp.profile.measure:measure_candidate"): its ProfileMeasurements, encoded for the
    worker. A candidate that fails raises CandidateFailed, so the sandbox reports it on the candidate's own line."""
    from kernel_lsp.process.isolation import use_judge_build_caches
    from kernel_lsp.candidate.handle import candidate_process
    from kernel_lsp.candidate.exchange import Exchange
    from kernel_lsp.candidate.models import load_module
    from kernel_lsp.verify.reference import init_inputs

    use_judge_build_caches()  # this process runs the reference; the candidate's process gets the candidates' caches

    problems: list[ProfileProblem] = []
    reference_model = inputs = None
    files = (candidate, *([reference] if reference else []))
    with candidate_process(allow_network, device, files) as process:  # it starts now: its imports overlap the reference's
        measured_ceilings = ceilings(device, cache_dir, problems)  # before any candidate code ran anywhere
        if reference is not None:
            inputs_module = load_module(reference, "kernel_lsp_reference")
            if not hasattr(inputs_module, "get_inputs"):
                raise ProblemError(f"{Path(reference).name} defines no get_inputs()")
            inputs = make_inputs(inputs_module, device)
            reference_model = build_reference(inputs_module, device, problems)
        exchange = Exchange(process.exchange_folder, "judge", process.channel)
        isolation = process.ready()
        said = process.ask("call", entry=f"{__name__}:candidate_side", task_dir=os.getcwd(),
                        arguments={"candidate": str(Path(candidate).resolve()), "device": device,
                                   "energy_seconds": energy_seconds},
                        inputs=exchange.send(list(inputs)) if inputs is not None else None,
                        init=exchange.send(init_inputs(inputs_module)) if reference is not None else None)
        exchange.forget()
    candidate_energy = checked_energy(said.get("energy"))
    problems += said_problems(said.get("problems"))
    if reference is None:  # the candidate's file was its own reference: its figures, measured in its process
        kernels, reference_energy = checked_kernels(said.get("reference_kernels")), checked_energy(
            said.get("reference_energy"))
    else:
        kernels = reference_kernels(reference_model, inputs, problems)
        reference_energy = (energy(reference_model, inputs, device, energy_seconds, problems)
                            if candidate_energy is not None and reference_model is not None else None)
    return encode(ProfileMeasurements(
        extensions=checked_libraries(said.get("extensions")), reference_kernels=kernels, energy=candidate_energy,
        # the reference on the same inputs, read the same way: what the agent's rubric compares against
        reference_energy=reference_energy, ceilings=measured_ceilings, gpu_state=gpu_state(device),
        problems=problems, isolation=Isolation(**isolation)))


def said_problems(value: Any) -> list[ProfileProblem]:
    """The problems the candidate's process said (its word: only well-formed ones with a known code)."""
    if not isinstance(value, list):
        return []
    return [ProfileProblem(item["code"], item["message"][:2000]) for item in value
            if isinstance(item, dict) and item.get("code") in PROBLEM_CODES and isinstance(item.get("message"), str)]


def candidate_side(candidate: str, device: str, energy_seconds: float, inputs: tuple | None,
                   init: list | None) -> dict[str, Any]:
    """In the candidate's process: import and build the candidate, run it once (extensions loaded, lazy set-up
    done), read its energy per call and the libraries it loaded. Without inputs from the judge (no reference
    file), the candidate's own file gives its inputs and its reference Model, measured here too."""
    from kernel_lsp.candidate.models import load_module
    from kernel_lsp.verify.reference import init_inputs

    problems: list[ProfileProblem] = []
    before = mapped_libraries()
    module = load_module(candidate, "kernel_lsp_candidate")
    if not hasattr(module, "ModelNew"):
        raise ProblemError(f"{Path(candidate).name} defines no ModelNew")
    own = inputs is None
    if own:
        if not hasattr(module, "get_inputs"):
            raise ProblemError(f"{Path(candidate).name} defines no get_inputs(): pass the reference (--reference) "
                               "or define get_inputs in the candidate")
        inputs, init = make_inputs(module, device), init_inputs(module)
    model = build_model(module, init or [], device)
    run_forward(model, inputs, 1)
    measured = energy(model, inputs, device, energy_seconds, problems)
    # the measuring process checks each entry for shape (measure_candidate): this process runs the candidate's code
    said: dict[str, Any] = {"extensions": sorted(own_libraries(mapped_libraries() - before)),
                            "energy": encode(measured) if measured is not None else None}
    if own:
        reference_model = build_reference(module, device, problems)
        said["reference_kernels"] = [encode(kernel) for kernel in reference_kernels(reference_model, inputs, problems)]
        reference = (energy(reference_model, inputs, device, energy_seconds, problems)
                     if measured is not None and reference_model is not None else None)
        said["reference_energy"] = encode(reference) if reference is not None else None
    said["problems"] = [encode(problem) for problem in problems]
    return said


def checked_energy(value: Any) -> EnergyReading | None:
    """An energy reading from the candidate's process, if it has the shape of one."""
    if not isinstance(value, dict):
        return None
    per_call, calls, seconds = value.get("mj_per_call"), value.get("calls"), value.get("seconds")
    numbers = (per_call, calls, seconds)
    if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) for n in numbers):
        return None
    return EnergyReading(mj_per_call=float(per_call), calls=int(calls), seconds=float(seconds),
                         how=str(value.get("how", ""))[:300])


def checked_kernels(value: Any) -> list[ReferenceKernel]:
    """Kernel times from the candidate's process, those with the shape of one."""
    kept = []
    for item in value if isinstance(value, list) else []:
        if (isinstance(item, dict) and isinstance(item.get("name"), str)
                and isinstance(item.get("device_ms"), (int, float)) and isinstance(item.get("calls"), int)):
            kept.append(ReferenceKernel(item["name"][:2000], float(item["device_ms"]), item["calls"]))
    return kept


def checked_libraries(value: Any) -> list[str]:
    """Libraries the candidate's process says it loaded: shared libraries that exist (cuobjdump reads them)."""
    paths = value if isinstance(value, list) else []
    return sorted({path for path in paths if isinstance(path, str) and path.endswith(".so") and os.path.isfile(path)})


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
    from kernel_lsp.candidate.models import installed_file

    return {path for path in paths if path.startswith("/") and not installed_file(path)
            and TRITON_LAUNCHERS not in path}


def build_reference(inputs_module: Any, device: str, problems: list[ProfileProblem]) -> Any:
    """The reference's Model (in the reference, or in the candidate's own file) with the verification's weights
    seed; None when there is none or it cannot be built (said in problems)."""
    import torch

    from kernel_lsp.candidate.models import WEIGHTS_SEED
    from kernel_lsp.verify.reference import init_inputs

    if not hasattr(inputs_module, "Model"):
        return None
    try:
        torch.manual_seed(WEIGHTS_SEED)
        return inputs_module.Model(*init_inputs(inputs_module)).to(device).eval()
    except Exception as exc:  # the reference's failure is reported, not the candidate's
        problems.append(ProfileProblem("profile-no-reference", f"no reference measurements: the reference's Model "
                                                               f"could not be built: {type(exc).__name__}: {exc}"))
        return None


def reference_kernels(model: Any, inputs: tuple, problems: list[ProfileProblem]) -> list[ReferenceKernel]:
    """The PyTorch kernels of the reference's forward and their device times."""
    from profilers.torch_kernels import KernelTimesUnavailable, forward_kernels

    if model is None:
        return []
    try:
        return [ReferenceKernel(k.name, k.device_ms, k.calls) for k in forward_kernels(lambda: model(*inputs))]
    except KernelTimesUnavailable as exc:
        problems.append(ProfileProblem("profile-no-reference", f"no reference kernel list: {exc}"))
    except Exception as exc:  # the reference's failure is reported, not the candidate's
        problems.append(ProfileProblem("profile-no-reference", f"no reference kernel list: the reference's forward "
                                                               f"failed: {type(exc).__name__}: {exc}"))
    return []


def energy(model: Any, inputs: tuple, device: str, seconds: float,
           problems: list[ProfileProblem]) -> EnergyReading | None:
    import torch

    from kernel_lsp.verify.baselines import current_cuda_index, nvml_index_of
    from profilers.nvml import NvmlUnavailable, energy_per_call

    if not device.startswith("cuda"):
        problems.append(ProfileProblem("profile-no-energy", f"no energy reading: the candidate ran on {device}, "
                                                            "not a GPU"))
        return None
    index = nvml_index_of(current_cuda_index())
    if index is None:
        problems.append(ProfileProblem("profile-no-energy", "no energy reading: CUDA_VISIBLE_DEVICES names GPUs by "
                                                            "UUID, so the NVML index is unknown"))
        return None
    try:
        with torch.no_grad():
            read = energy_per_call(lambda: model(*inputs), torch.cuda.synchronize, index, seconds)
    except NvmlUnavailable as exc:
        problems.append(ProfileProblem("profile-no-energy", f"no energy reading: {exc}"))
        return None
    return EnergyReading(mj_per_call=read["mj_per_call"], calls=read["calls"], seconds=read["seconds"],
                         average_power_w=read["average_power_w"], how=read["how"])


def ceilings(device: str, cache_dir: str | None, problems: list[ProfileProblem]) -> ProfileCeilings | None:
    if not device.startswith("cuda"):
        problems.append(ProfileProblem("profile-no-ceilings", f"no roofline ceilings: the candidate ran on {device}, "
                                                              "not a GPU"))
        return None
    try:
        return report_ceilings(measured_ceilings(device, Path(cache_dir) if cache_dir else None))
    except Exception as exc:  # ncu's theoretical ceilings stand in: the profile itself does not need them
        problems.append(ProfileProblem("profile-no-ceilings", f"roofline ceilings not measured "
                                                              f"({type(exc).__name__}: {exc}); ncu's theoretical "
                                                              "ones are used"))
        return None


def measured_ceilings(device: str = "cuda", cache_dir: Path | None = None) -> Ceilings:
    """Bandwidth and tensor rate from verify/floor.py's cached peaks, plus a cached fp32 matmul rate (needs torch)."""
    from kernel_lsp.verify import floor
    from kernel_lsp.candidate.timing import resolve_device

    target = resolve_device(device)
    peaks = floor.device_peaks(target, cache_dir)
    fp32 = cached_fp32_tflops(target, cache_dir)
    return Ceilings(gpu=floor.device_name(target), dram_bandwidth_gbs=peaks.bandwidth_gbs, fp32_tflops=fp32,
                    tensor_tflops=peaks.peak_tflops,
                    how=f"{peaks.how}; fp32 from a {FP32_MATMUL_SIZE}² fp32 matmul, TF32 off")


def cached_fp32_tflops(device: torch.device, cache_dir: Path | None) -> float:
    """The fp32 matmul rate, measured once per (device, torch) beside floor.py's peaks."""
    from kernel_lsp.verify import floor
    from kernel_lsp.verify.baselines import read_json_object, write_json_atomically

    if cache_dir is None:
        return measure_fp32_tflops(device)
    name = floor.device_name(device)
    path = floor.peaks_path(cache_dir, name).with_suffix(".fp32.json")
    stored = read_json_object(path) or {}
    if stored.get("device") == name and floor.is_positive_number(stored.get("fp32_tflops")):
        return float(stored["fp32_tflops"])
    tflops = measure_fp32_tflops(device)
    try:
        write_json_atomically(path, {"device": name, "fp32_tflops": tflops})
    except OSError:
        pass  # an unwritable cache only costs measuring again next time
    return tflops


def measure_fp32_tflops(device: torch.device) -> float:
    """cuBLAS SGEMM with TF32 off runs on the fp32 FMA units: the best fp32 rate a library reaches."""
    import torch

    from kernel_lsp.verify import floor

    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        size = FP32_MATMUL_SIZE if device.type == "cuda" else floor.CPU_PLAN.matmul_size
        return floor.matmul_tflops(device, size, torch.float32, FP32_REPEATS)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


def gpu_state(device: str) -> dict[str, object]:
    from kernel_lsp.verify.baselines import gpu_state as nvml_state

    return nvml_state(device)
