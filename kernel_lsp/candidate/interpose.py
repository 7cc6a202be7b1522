"""Hooks that stay in place: what watches the candidate's launches looks the same whether it watches or not.

The recording of the trials (candidate/kernels.py, Triton's interpreter) and the output-from-kernel check
(candidate/ablation.py) each need to run their own code around a launch. Replacing a class's attribute for the
while (and putting the original back) lets a candidate tell watched calls from the others: it saves
`GridExecutor.__call__` or `JITFunction.run` at import and compares. Here each such attribute is replaced once,
for good, by a forwarder installed before the candidate's import (`install_triton`, from the host's load), and
a watcher pushes its wrapper onto the forwarder for the while (`handled`): the attribute is the same object for
every call, checked, timed or ablated.

What stays visible: this module's own state (a candidate that reads it, or its forwarder's closure, can still
tell; on CUDA, torch's profiler is on while the trials record). In-process watching is the candidate's word;
the judge's own checks (outputs, clock) are not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]  # the original (or the next wrapper) -> a replacement


class Hook:
    """One attribute of a class, replaced by a forwarder that calls the innermost pushed wrapper, else the
    original."""

    def __init__(self, owner: type, attribute: str) -> None:
        self.owner, self.attribute = owner, attribute
        self.original = owner.__dict__[attribute]
        self.stack: list[Callable[..., Any]] = []
        hook = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            return (hook.stack[-1] if hook.stack else hook.original)(*args, **kwargs)
        forward.__name__ = getattr(self.original, "__name__", attribute)
        forward.__qualname__ = getattr(self.original, "__qualname__", attribute)
        forward.__doc__ = getattr(self.original, "__doc__", None)
        self.forwarder = forward
        setattr(owner, attribute, forward)


_HOOKS: dict[tuple[int, str], Hook] = {}


def hook(owner: type, attribute: str) -> Hook:
    """The attribute's hook, installed on first use (for good)."""
    key = (id(owner), attribute)
    if key not in _HOOKS:
        _HOOKS[key] = Hook(owner, attribute)
    return _HOOKS[key]


@contextlib.contextmanager
def handled(owner: type, attribute: str, wrapper: Wrapper) -> Iterator[None]:
    """Within the block, calls of owner.attribute go through `wrapper(next)`, `next` being what they went through
    before (the original, or an outer block's wrapper)."""
    target = hook(owner, attribute)
    made = wrapper(target.stack[-1] if target.stack else target.original)
    target.stack.append(made)
    try:
        yield
    finally:
        target.stack.remove(made)


def triton_attributes() -> list[tuple[type, str]]:
    """What the recordings and the ablation hook in Triton: the launchers' `run` (compiled and interpreted) and the
    interpreter's grid executor and program counter. Those this Triton has."""
    found: list[tuple[type, str]] = []
    try:
        from triton.runtime.jit import JITFunction
        found.append((JITFunction, "run"))
    except ImportError:
        pass
    try:
        from triton.runtime.interpreter import GridExecutor, InterpretedFunction, InterpreterBuilder
        found += [(InterpretedFunction, "run"), (GridExecutor, "__call__"), (InterpreterBuilder, "set_grid_idx")]
    except ImportError:
        pass
    return [(owner, name) for owner, name in found if name in owner.__dict__]


def install_triton() -> int:
    """The Triton hooks, installed before the candidate's import (a candidate that does not import Triton
    launches no Triton kernel: nothing is installed where Triton is not importable); how many are in place."""
    for owner, name in triton_attributes():
        hook(owner, name)
    return len(_HOOKS)
