"""What the CuTe DSL check (verify/cute_dsl.py, run in a candidate's process in the sandbox) reports, typed: built
there, encoded once (contracts.codec), decoded once by the job's handler (kinds/cute_dsl.py). The process that
builds it ran the user's file, so its report is that file's word until it decodes. Wire names: `errorType`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kernel_lsp.contracts.verify_report import Isolation

CuteDslStatus = Literal["ok", "no-dsl", "unsupported", "compile-error", "stopped"]


@dataclass(frozen=True)
class CompiledFunction:
    """One compiled host function (`@cute.jit`) whose launch was recorded instead of run."""

    function: str  # as the DSL named it
    kernels: list[str]  # the generated kernels' names
    cubin: bytes | None  # the DSL's own cubin (None: not kept, or over the size the check keeps)


@dataclass(frozen=True)
class FailureFrame:
    """One frame of the failure's traceback: `file` relative to the task folder for the user's files."""

    file: str
    line: int
    function: str
    text: str


@dataclass(frozen=True)
class CuteDslReport:
    status: CuteDslStatus  # ok; no-dsl / unsupported (the DSL here); compile-error (the kernels'); stopped (else)
    message: str | None = None  # why, for every status but ok
    version: str | None = None  # nvidia-cutlass-dsl's
    kernels: list[CompiledFunction] = field(default_factory=list)
    stage: Literal["import", "inputs", "forward"] | None = None  # where a compile-error or a stop happened
    error_type: str | None = None  # `errorType`: the exception's class
    frames: list[FailureFrame] = field(default_factory=list)
    isolation: Isolation | None = None  # how the process that ran the file was confined (added by the sandbox entry)
