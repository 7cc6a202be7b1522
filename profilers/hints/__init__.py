"""Hints: rules from named profiler metrics to short, actionable findings, each with a stable code.

Every rule module turns typed metrics (profilers.sass, profilers.ncu, profilers.roofline, profilers.nvml) into
`Hint`s; the server and the CLI place them on source lines (server side: kernel_lsp.findings.Finding).
Nsight Compute's own rule results keep their name: `ncu-<RuleName>`. Our own rules are `hint-<what>`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

HintSeverity = Literal["warning", "information", "hint"]


@dataclass(frozen=True)
class Hint:
    code: str  # stable: "hint-spills", "ncu-UncoalescedGlobalAccess", ...
    kernel: str  # the kernel's base name (profilers.ptxas.base_name_of), e.g. "vec_add"
    severity: HintSeverity
    message: str  # one or two short sentences with the numbers, ending in what to try
    estimated_speedup: float | None = None  # percent of the kernel's time that fixing it could save, when known
    speedup_type: str | None = None  # ncu's "local" / "global", or "estimate" for our own rules
    file: str | None = None  # source file and 1-based line, when a source-level marker or -lineinfo gives one
    line: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # the values the rule looked at, for hovers and JSON

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
