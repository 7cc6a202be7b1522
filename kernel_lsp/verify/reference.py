"""The reference in the judge's process: the device, the problem's module and model, its inputs drawn by seed in each
distribution (own, normal, scaled), its outputs, and which distributions it accepts (finite outputs)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kernel_lsp.candidate.handle import decoded_reply
from kernel_lsp.candidate.integrity import tensor_leaves
from kernel_lsp.candidate.models import WEIGHTS_SEED, load_module
from kernel_lsp.candidate.timing import make_input_sets, resolve_device
from kernel_lsp.contracts.candidate_replies import LoadReply
from kernel_lsp.contracts.verify_report import DeviceFacts
from kernel_lsp.verify.judge import PHASES, Judge, ReferenceFailed

DISTRIBUTIONS = ("own", "normal", "scaled")
SCALE = 16.0  # "scaled" inputs: the problem's own values times this, so magnitudes outside [0, 1) are covered


def choose_device(device: str) -> torch.device | str:
    """The target device, or why it cannot be used."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        return ("device 'cuda' was asked for but torch sees no GPU here "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); use device 'cpu' for Triton "
                "kernels under TRITON_INTERPRET=1")
    if device not in ("cpu",) and not device.startswith("cuda"):
        return f"unknown device {device!r}: expected auto, cuda or cpu"
    return resolve_device(device)


def init_inputs(module: Any) -> list:
    return list(module.get_init_inputs()) if hasattr(module, "get_init_inputs") else []


def load_in(party: Judge, path: str, reference_module: Any, ref_model: torch.nn.Module,
            model_class: str = "ModelNew") -> LoadReply:
    """`model_class` of the file at `path` built in `party`'s process (the candidate's ModelNew; in the baselines'
    process, the reference's Model) as the judge built the reference: the same init inputs, the judge's weights;
    what that process says of its load (its word)."""
    state = ref_model.state_dict()
    reply = party.process.ask("load", candidate=str(Path(path).resolve()), device=str(party.target),
                              task_dir=os.getcwd(), model_class=model_class,
                              init=party.exchange.send(init_inputs(reference_module)), weight_names=list(state),
                              weights=party.exchange.send(list(state.values())))
    party.exchange.forget()
    return decoded_reply(LoadReply, "load", reply)


def build_reference(path: str, target: torch.device) -> tuple[Any, torch.nn.Module]:
    try:
        module = load_module(path, "kernel_lsp_reference")
        if not hasattr(module, "get_inputs"):
            raise ReferenceFailed(f"the reference {Path(path).name} defines no get_inputs()")
        torch.manual_seed(WEIGHTS_SEED)
        model = module.Model(*init_inputs(module))
        return module, model.to(target).eval()
    except ReferenceFailed:
        raise
    except Exception as exc:  # the reference is the user's too, but a broken one makes every verdict moot
        raise ReferenceFailed(f"the reference {Path(path).name} failed to load: {type(exc).__name__}: {exc}") from exc


@PHASES("reference runs")
def run_reference(model: torch.nn.Module, inputs: tuple) -> Any:
    try:
        with torch.no_grad():
            return model(*inputs)
    except Exception as exc:
        raise ReferenceFailed(f"the reference's forward failed: {type(exc).__name__}: {exc}") from exc


@PHASES("drawing inputs")
def draw_inputs(get_inputs: Callable[[], list], seed: int, target: torch.device, distribution: str) -> tuple:
    """One input set made on the target device; floating tensors redrawn or scaled for the other distributions."""
    inputs = make_input_sets(get_inputs, 1, seed, str(target))[0]
    return tuple(reshaped_distribution(value, distribution, seed) for value in inputs)


def reshaped_distribution(value: Any, distribution: str, seed: int) -> Any:
    if distribution == "own" or not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value  # integer inputs are indices or sizes: their range is part of the problem
    if distribution == "scaled":
        return value * SCALE
    generator = torch.Generator(device=value.device).manual_seed(seed)
    return torch.randn(value.shape, dtype=value.dtype, device=value.device, generator=generator)


def finite(output: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensor_leaves(output) if t.is_floating_point())


def accepted_distributions(get_inputs: Callable[[], list], model: torch.nn.Module, target: torch.device,
                           seed: int) -> tuple[list[str], float]:
    """The problem's own distribution, plus each other one on which the reference runs and stays finite; and the
    slowest of those calls in seconds, its output checked (so a GPU's work has finished), the first one's lazy
    set-up included: what the candidate's hang limits are made of."""
    inputs = draw_inputs(get_inputs, seed, target, "own")
    started = time.perf_counter()
    if not finite(run_reference(model, inputs)):
        raise ReferenceFailed("the reference's output holds NaN or Inf on the problem's own inputs")
    slowest = time.perf_counter() - started
    accepted = ["own"]
    for distribution in DISTRIBUTIONS[1:]:
        inputs = draw_inputs(get_inputs, seed, target, distribution)
        started = time.perf_counter()
        try:
            output = run_reference(model, inputs)
        except ReferenceFailed:
            continue  # e.g. a log of a negative value raising: the problem's domain excludes this distribution
        if finite(output):
            accepted.append(distribution)
        slowest = max(slowest, time.perf_counter() - started)
    return accepted, slowest


def device_facts(target: torch.device) -> DeviceFacts | None:
    """What the agent's prompt says of the GPU (the judge's view of it): name, architecture, SMs, memory, the
    shared memory a block may opt into, registers and L2; None off CUDA."""
    if target.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(target)
    optional = {key: value for key, attribute in (("shared_per_block_optin", "shared_memory_per_block_optin"),
                                                  ("registers_per_sm", "regs_per_multiprocessor"),
                                                  ("l2_bytes", "L2_cache_size"))
                if isinstance(value := getattr(props, attribute, None), int)}
    return DeviceFacts(props.name, f"sm_{props.major}{props.minor}", props.multi_processor_count, props.total_memory,
                       **optional)


def device_name(target: torch.device) -> str:
    return torch.cuda.get_device_name(target) if target.type == "cuda" else "cpu"


def input_signature(inputs: tuple) -> list:
    return [[list(v.shape), str(v.dtype)] if isinstance(v, torch.Tensor) else repr(v) for v in inputs]
