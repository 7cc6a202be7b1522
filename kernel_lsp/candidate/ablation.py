"""Does the output come from the candidate's own kernels? (integrity-output-not-from-kernel, the candidate's side)

"One of its own kernels ran" is not enough: a decoy candidate launches its kernel on a scratch tensor and returns
what stock PyTorch ops computed (`x.clamp(min=0)`, `torch.maximum`, `F.relu`). This runs `forward` once as it is
and once with every result of the candidate's own code destroyed as soon as it is made:

- each launch of one of the candidate's @triton.jit kernels (by name) and each call of a function of its compiled
  extensions (load_inline / load modules reachable from the candidate's module and its model) runs as usual;
  then every tensor it wrote (its tensor arguments whose bytes changed, and the tensors a function returned) is
  overwritten: NaN for floating point, bits flipped for integers, negated for booleans;
- then once more with a finite value (FINITE) instead of NaN: a result that reaches the output only through
  `0 * k` or a `clamp(min=k * 0)` bound carries NaN through but not a finite value;
- then with +Inf, and with -Inf: a result that bounds the output from one side only (`torch.maximum(x, k)` with k
  under every value, which NaN and a large finite value both change) does not change it from that side;
- if the final output is bitwise the same as the plain run's in either pass, what the candidate's own code
  wrote does not make it.

"Wrote" is seen as bytes that changed. So that a kernel writing the same values a buffer already held is not
missed, the plain run is made on inputs A, then forward runs once on other inputs B (buffers kept across calls
now hold B's results), then the ablated run on A; and every uninitialized tensor allocated during the ablated
run (torch.empty and the like, from Python or from C++) is filled with destroy()'s values first.

A partly custom candidate (a cuDNN convolution, then its own fused epilogue) changes: its epilogue's output is
destroyed. The verdict is the judge's (verify/run.py); what this reports is the candidate's process's word.

What it cannot see: extension functions bound where it cannot reach them (a closure, a default argument, a
C++ op registered with TORCH_LIBRARY and called through torch.ops), and kernels launched by other means
(cupy, ctypes); such a run reports no interception and the judge gives no verdict on it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
import contextlib
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from kernel_lsp.candidate.integrity import changed_since, copied, input_snapshot, tensor_leaves
from kernel_lsp.candidate.models import installed_file
from kernel_lsp.contracts.candidate_replies import AblationReply



FINITE = 1234.5  # the finite pass's value: exact in every float dtype, and far from what a kernel usually writes
PASSES = {"nan": float("nan"), "finite": FINITE, "+inf": float("inf"), "-inf": float("-inf")}


def ablate(model: Callable[..., Any], roots: list[Any], own_kernels: set[str], inputs: tuple,
           others: tuple) -> AblationReply:
    """forward on `inputs` as it is, then per pass (NaN, FINITE, +Inf, -Inf) on `others` and on `inputs` with the results
    of the candidate's own code destroyed: whether the output changed in every pass (`changed_by` says per pass),
    what was intercepted, and the stock operators of the last run."""
    # each run on its own copy (`copied`): a candidate that writes into its inputs changes none of the next run's
    with torch.no_grad():
        plain = input_snapshot(model(*copied(inputs)))
    changed_by: dict[str, bool] = {}
    counts: list[tuple[int, int]] = []  # (launches, destroyed) of each pass
    names: set[str] = set()
    stock = StockOps()
    for name, value in PASSES.items():
        with torch.no_grad():
            model(*copied(others))  # buffers the candidate keeps across calls now hold other values
        ablation, stock = Ablation(own_kernels, roots, value), StockOps(value)
        with torch.no_grad(), ablation:
            ablated = copied(inputs)
            with stock:
                output = model(*ablated)
            changed_by[name] = bool(changed_since(plain, output))
        counts.append((ablation.launches, ablation.destroyed))
        names |= ablation.names
    # per forward, the fewest of the passes' (what one pass only saw is not reliably the candidate's work)
    return AblationReply(all(changed_by.values()), changed_by, min(c[0] for c in counts), min(c[1] for c in counts),
                         sorted(names), stock.names)


def destroy(tensor: torch.Tensor, value: float = float("nan")) -> None:
    """Overwrites a result so that anything computed from it changes: floats with `value`."""
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(value)
    elif tensor.dtype == torch.bool:
        tensor.logical_not_()
    else:
        tensor.bitwise_not_()


class Ablation:
    """While active, the results of the candidate's own kernels and extension functions are destroyed as made.

    `launches`: own launches and calls intercepted; `destroyed`: tensors overwritten; `names`: what was seen.
    """

    def __init__(self, own_kernels: set[str], roots: list[Any], value: float = float("nan")) -> None:
        self.value = value  # what floating-point results are overwritten with
        self.own = {name.rsplit("::", 1)[-1] for name in own_kernels}
        self.roots = roots  # the candidate's module and its model: where extension modules are found
        self.launches = 0
        self.destroyed = 0
        self.names: set[str] = set()
        self._restore: list[Callable[[], None]] = []
        self._handled = contextlib.ExitStack()

    def __enter__(self) -> Ablation:
        from kernel_lsp.candidate.interpose import handled

        for owner in triton_launchers():  # through its hook (candidate/interpose.py): `run` stays the same object
            self._handled.enter_context(handled(owner, "run", self._triton_run))
        for module in extension_modules(self.roots):
            self._wrap_extension(module)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._handled.close()
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()

    def _replace(self, owner: Any, name: str, value: Any) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, value)
        self._restore.append(lambda: setattr(owner, name, original))

    def _triton_run(self, original: Callable) -> Callable:
        ablation = self

        def run(kernel: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
            name = getattr(getattr(kernel, "fn", None), "__name__", "")
            if warmup or name not in ablation.own:
                return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            with ablation._destroying(name, [*args, *kwargs.values()]) as results:
                result = original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
                results.append(result)
            return result
        return run

    def _wrap_extension(self, module: types.ModuleType) -> None:
        for name in dir(module):
            function = getattr(module, name, None)
            if name.startswith("_") or not callable(function) or isinstance(function, type):
                continue
            wrapped = self._extension_call(f"{module.__name__}.{name}", function)
            self._replace(module, name, wrapped)
            for root in self.roots:  # the same function bound elsewhere: `from ext import relu`, self.fn = ext.fn
                for holder in holders_of(root):
                    for key, value in list(vars(holder).items()):
                        if value is function:
                            self._replace(holder, key, wrapped)

    def _extension_call(self, name: str, function: Callable) -> Callable:
        ablation = self

        def call(*args: Any, **kwargs: Any) -> Any:
            with ablation._destroying(name, [*args, *kwargs.values()]) as results:
                result = function(*args, **kwargs)
                results.append(result)
            return result
        return call

    @contextmanager
    def _destroying(self, name: str, arguments: list[Any]) -> Iterator[list[Any]]:
        """Around one launch or call of the candidate's own code; StockOps sees none of what happens here."""
        with _disable_current_modes():
            tensors = list(tensor_leaves(arguments))
            before = input_snapshot(tensors)
            results: list[Any] = []
            yield results
            self.launches += 1
            self.names.add(name)
            written = [tensors[index] for index in changed_since(before, tensors) if index < len(tensors)]
            seen = {id(t) for t in written}
            written += [t for t in tensor_leaves(results) if id(t) not in seen]
            for tensor in written:
                destroy(tensor, self.value)
                self.destroyed += 1


FACTORY_AND_VIEW_OPS = ("empty", "new_empty", "view", "_unsafe_view", "detach", "alias", "lift_fresh", "_to_copy",
                        "as_strided", "t", "transpose", "permute", "expand", "reshape", "squeeze", "unsqueeze")
UNINITIALIZED = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


class StockOps(TorchDispatchMode):
    """Around the ablated forward: names the ATen operators it called (in first-call order, without factories
    and views: what made an output the candidate's own code did not), and fills every uninitialized tensor it
    allocates with destroy()'s values, so that a kernel writing into a fresh buffer always changes its bytes
    (the same values as a freed buffer that a previous call left there would otherwise look unwritten)."""

    def __init__(self, value: float = float("nan")) -> None:
        super().__init__()
        self.value = value
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        result = func(*args, **(kwargs or {}))
        if name in UNINITIALIZED and isinstance(result, torch.Tensor):
            destroy(result, self.value)
        elif name not in self.names and not name.startswith(FACTORY_AND_VIEW_OPS):
            self.names.append(name)
        return result


def triton_launchers() -> list[type]:
    """The classes whose `run` launches a @triton.jit kernel: the compiler's and the interpreter's."""
    if "triton" not in sys.modules:
        return []  # a candidate that never imported Triton launched no Triton kernel
    owners: list[type] = []
    try:
        from triton.runtime.jit import JITFunction
        owners.append(JITFunction)
    except ImportError:
        pass
    try:
        from triton.runtime.interpreter import InterpretedFunction
        owners.append(InterpretedFunction)
    except ImportError:
        pass
    return [owner for owner in owners if "run" in owner.__dict__]


def holders_of(root: Any) -> Iterator[Any]:
    """Objects whose attributes may hold an extension or its functions: the candidate's module, its model and
    the model's submodules."""
    yield root
    if isinstance(root, torch.nn.Module):
        yield from (module for module in root.modules() if module is not root)


def extension_modules(roots: list[Any]) -> list[types.ModuleType]:
    """Compiled extension modules (a .so file outside the installed packages) reachable in one step from the
    roots' attributes."""
    found: dict[int, types.ModuleType] = {}
    for root in roots:
        for holder in holders_of(root):
            for value in list(vars(holder).values()):
                module = value if isinstance(value, types.ModuleType) else getattr(value, "__self__", None)
                if isinstance(module, types.ModuleType) and is_extension(module):
                    found[id(module)] = module
    return list(found.values())


def is_extension(module: types.ModuleType) -> bool:
    """A shared library of the candidate's own: not Python's, an installed package's or the system's."""
    path = getattr(module, "__file__", None) or ""
    return path.endswith(".so") and not installed_file(path)
