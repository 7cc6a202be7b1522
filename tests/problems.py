"""Problem and candidate texts the CPU tests share (KernelBench's layout: Model, get_inputs, get_init_inputs), and
the recorded reports they read."""

from __future__ import annotations

import dataclasses
import json

from kernel_lsp.contracts.codec import decode, encode
from kernel_lsp.contracts.verify_report import VerifyReport
from tests.paths import REPORTS


def relu_problem(inputs: str = "torch.randn(4096)") -> str:
    """Model = torch.relu on the one input `inputs` makes."""
    return f"""import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""


def triton_relu(block: int = 64) -> str:
    """ModelNew: ReLU as a Triton kernel, one program per `block` elements."""
    return f"""import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), {block}),)](x, out, x.numel(), BLOCK={block})
        return out
"""


def linear_relu_problem(inputs: str, features: int) -> str:
    """Model = relu(Linear(features, features)(x)): weights that the candidate must share."""
    return f"""
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x))

def get_inputs():
    return [{inputs}]

def get_init_inputs():
    return [{features}]
"""


def caches_by_identity(relu: str) -> str:
    """ModelNew (after a prelude defining the call `relu`) answering from a cache keyed by the input object: a
    stale answer once the caller writes new values into the same tensor."""
    return f"""
class ModelNew(nn.Module):
    cache = {{}}

    def forward(self, x):
        hit = ModelNew.cache.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        out = {relu}(x.contiguous())
        ModelNew.cache[id(x)] = (x, out)
        return out
"""


def one_output_buffer(write: str) -> str:
    """A ModelNew that writes one output buffer again on every call (as CUDA graphs do): `write` fills `self.out`
    from `x`; each answer lasts until the next call."""
    return f'''
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = None

    def forward(self, x):
        x = x.contiguous()
        if self.out is None or self.out.shape != x.shape:
            self.out = torch.empty_like(x)
        {write}
        return self.out
'''


def recorded_report(name: str = "verify_cpu_honest", **changes: object) -> VerifyReport:
    """A VerifyReport the judge returned on the CPU (tests/fixtures/reports), decoded, with `changes` made."""
    report = decode(VerifyReport, json.loads((REPORTS / f"{name}.json").read_text()))
    return dataclasses.replace(report, **changes)


def timed_report(median_ms: float, speedup: dict[str, float | None], passed: int = 5, **changes: object
                 ) -> VerifyReport:
    """The recorded verified report with its candidate timed at `median_ms`, these speedups, `passed` of as many
    trials, no interval or own-kernel share unless `changes` give them."""
    report = recorded_report()
    # recorded on the CPU, where compile is not timed: on a GPU it would have been
    skipped = {} if changes.get("device") == "cuda" else report.timing.skipped
    timing = dataclasses.replace(report.timing, skipped=skipped,
                                 candidate=dataclasses.replace(report.timing.candidate, median_ms=median_ms))
    correctness = dataclasses.replace(report.correctness, trials=passed, passed=passed)
    kernels = dataclasses.replace(report.kernels, work=None)
    fields = {"timing": timing, "speedup": speedup, "correctness": correctness, "kernels": kernels, "interval": {},
              "significant": {}, **changes}
    return dataclasses.replace(report, **fields)


def verified_report_wire(eager: float, median_ms: float) -> dict:
    """A fake worker's verified VerifyReport, on the wire: timed at `median_ms`, `eager`x eager."""
    return encode(timed_report(median_ms, {"eager": eager, "compile": None}))


def assert_not_tampered(stored: dict) -> None:
    """The trusted cache files read before a candidate ran ({path: bytes}) are as they were, except a baseline the
    judge itself timed again (its check rounds no longer agreed with it: verify/run.py measure), which a
    candidate's x50 rewrite of median_ms would show."""
    import json

    for path, before in stored.items():
        after = path.read_bytes()
        if after == before:
            continue
        assert "baselines" in str(path), f"{path} changed"
        old, new = json.loads(before)["timing"], json.loads(after)["timing"]
        assert new["clock"] == "judge-wall" and new["median_ms"] < 10 * old["median_ms"], (path, old, new)
