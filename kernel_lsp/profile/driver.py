"""The program ncu profiles: imports a candidate, builds its ModelNew and calls forward on the problem's inputs.

    python -m kernel_lsp.profile.driver --candidate cand.py [--reference ref.py] [--device cuda] [--warmup 1] [--calls 1]
                                        [--writable FOLDER ... [--allow-network]] [--poison-shared FILE]

get_inputs/get_init_inputs come from the reference, else from the candidate itself (a file with Model and
ModelNew). The warm-up calls (extension loading, autotuning, lazy initialisation) run outside the profiled range:
ncu runs with --profile-from-start off, and only the calls between cudaProfilerStart and Stop are profiled.
With --poison-shared, after the warm-up calls it runs the shared-memory poison check (profile/shared_init.py)
instead and writes its answer to FILE as JSON.

The worker starts it confined, as a verification's candidate process is (candidate/handle.py): the
environment's allow-list, HOME in a scratch folder, and, with --writable, writes only under the given folders and
no network socket (process/confine.py), applied at the start of main. ncu's injected library starts its threads
before main; they are NVIDIA's code, but the file rules do not bind them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

INPUTS_SEED = 0


class ProblemError(Exception):
    """The files do not make a runnable problem (no ModelNew, no get_inputs)."""


def load_problem(candidate: str, reference: str | None) -> tuple[ModuleType, ModuleType]:
    """(candidate module, the module giving get_inputs/get_init_inputs)."""
    from kernel_lsp.candidate.models import load_module

    inputs_module = load_module(reference, "kernel_lsp_reference") if reference else None
    candidate_module = load_module(candidate, "kernel_lsp_candidate")
    if not hasattr(candidate_module, "ModelNew"):
        raise ProblemError(f"{Path(candidate).name} defines no ModelNew")
    inputs_module = inputs_module or candidate_module
    if not hasattr(inputs_module, "get_inputs"):
        raise ProblemError(f"{Path(reference or candidate).name} defines no get_inputs(): pass the reference "
                           "(--reference) or define get_inputs in the candidate")
    return candidate_module, inputs_module


def build_model(candidate_module: ModuleType, init: list, device: str) -> Any:
    """ModelNew(*init) (the problem's get_init_inputs()) on the device, in eval mode, with the verifier's
    weights seed."""
    import torch

    from kernel_lsp.candidate.models import WEIGHTS_SEED

    torch.manual_seed(WEIGHTS_SEED)
    return candidate_module.ModelNew(*init).to(device).eval()


def make_inputs(inputs_module: ModuleType, device: str) -> tuple:
    """get_inputs() made on the device (tensors it returns elsewhere are moved there)."""
    from kernel_lsp.candidate.timing import make_input_sets

    return make_input_sets(inputs_module.get_inputs, 1, INPUTS_SEED, device)[0]


def run_forward(model: Any, inputs: tuple, calls: int) -> Any:
    import torch

    output = None
    with torch.no_grad():
        for _ in range(calls):
            output = model(*inputs)
    return output


@contextlib.contextmanager
def profiled_range(device: str) -> Iterator[None]:
    """cudaProfilerStart/Stop around the block: what ncu --profile-from-start off profiles."""
    import torch

    if not device.startswith("cuda"):
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        yield
        torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.writable:  # the worker's run under ncu: confined before anything of the candidate's is imported
        from kernel_lsp.process.confine import confine

        confinement = confine(args.writable, args.allow_network)
        if not confinement.isolated:
            print(f"kernel-lsp profile driver: the candidate runs without full isolation: files "
                  f"{confinement.files}; network {confinement.network}", file=sys.stderr)
    # started with python -P (a module beside the candidate named like ours must not run before the
    # confinement): the candidate's own helper modules are found from here on
    sys.path.insert(0, str(Path(args.candidate).resolve().parent))
    try:
        candidate_module, inputs_module = load_problem(args.candidate, args.reference)
    except ProblemError as exc:
        print(f"kernel-lsp profile driver: {exc}", file=sys.stderr)
        return 2
    from kernel_lsp.verify.reference import init_inputs

    model = build_model(candidate_module, init_inputs(inputs_module), args.device)
    inputs = make_inputs(inputs_module, args.device)
    run_forward(model, inputs, args.warmup)
    if args.poison_shared:
        import json

        from kernel_lsp.contracts.codec import encode
        from kernel_lsp.profile.shared_init import run_check

        index = int(args.device.partition(":")[2] or 0)
        Path(args.poison_shared).write_text(json.dumps(encode(run_check(model, inputs, run_forward, index))))
        return 0
    with profiled_range(args.device):
        run_forward(model, inputs, args.calls)
    return 0


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidate", required=True)
    parser.add_argument("--reference")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--writable", action="append", default=[],
                        help="confine this process first: writes only under these folders (repeatable)")
    parser.add_argument("--allow-network", action="store_true", help="with --writable: sockets stay allowed")
    parser.add_argument("--poison-shared", metavar="FILE",
                        help="run the shared-memory poison check after the warm-up; its answer to FILE (JSON)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
