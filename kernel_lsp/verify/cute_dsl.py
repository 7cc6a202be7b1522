"""The CuTe DSL compile check, in the sandbox child: compiles a file's @cute.jit/@cute.kernel functions without a
GPU and reports what the compiler said, on the user's line.

The CuTe DSL (`nvidia-cutlass-dsl`) compiles through MLIR to PTX and a cubin on a machine without a GPU, given the
target in CUTE_DSL_ARCH; only loading the cubin needs the driver. So the check runs the file as a run would, with
its compiled functions' launch replaced by a record of what was compiled: it imports the candidate (module-level
`cute.compile` calls compile there), then, for a KernelBench candidate, builds ModelNew with get_init_inputs() and
calls forward on get_inputs() (the candidate's own, else its reference's), on the CPU. Every @cute.jit call made on
the way compiles and returns without launching; outputs are left unwritten, which does not matter: nothing is
compared. What comes back: the compiled kernels (their names as the DSL generated them, and the cubin its ptxas made),
the first compile error with its traceback in the user's files, or why the kernels could not be reached (forward
moved the tensors to CUDA, say).
"""

from __future__ import annotations

import os
import traceback
from typing import Any, Literal

from kernel_lsp.candidate.models import load_module
from kernel_lsp.contracts.codec import Wire, encode
from kernel_lsp.contracts.cute_dsl_report import CompiledFunction, CuteDslReport, FailureFrame

MAX_KERNELS = 32  # compiled functions whose cubin is returned
MAX_CUBIN_BYTES = 16 * 2**20
MAX_MESSAGE_CHARS = 4000
_DSL_PACKAGES = ("cutlass", "nvidia_cutlass_dsl")  # error types and frames of the DSL
_DSL_ERROR_MODULES = _DSL_PACKAGES + ("cuda",)  # cuda-bindings, which the DSL calls


class _Recorder:
    """What the patched launch saw: one entry per compiled host function, in call order, each once."""

    def __init__(self) -> None:
        self.compiled: list[Any] = []

    def record(self, function: Any) -> None:
        if not any(function is seen for seen in self.compiled):
            self.compiled.append(function)


def check_confined(candidate: str, reference: str | None = None, arch: str = "sm_90a") -> Wire:
    """The sandbox entry: the check run in a process of its own, confined as a candidate's process is
    (candidate/handle.py: allow-listed environment, writes only to its scratch folder and the candidates'
    build caches, no network). Importing the file runs its code, which a model may have written: in the sandbox
    child it could rewrite the worker's trusted caches (baseline timings, the judge's builds). The report's
    `isolation` says how that process was confined. What the process answered is its word, passed on encoded:
    the job's handler decodes it (contracts.cute_dsl_report)."""
    from kernel_lsp.candidate.handle import candidate_process

    with candidate_process(allow_network=False, device="cpu") as process:
        isolation = process.ready()
        report = process.ask("call", entry=f"{__name__}:check_in_candidate_process", task_dir=os.getcwd(),
                          arguments={"candidate": candidate, "reference": reference, "arch": arch})
    return {**report, "isolation": isolation}


def check_in_candidate_process(candidate: str, reference: str | None, arch: str, inputs: Any = None,
                               init: Any = None) -> Wire:
    """check_candidate, as the candidate's process calls it (its op "call" passes no inputs here), encoded."""
    return encode(check_candidate(candidate, reference, arch))


def check_candidate(candidate: str, reference: str | None = None, arch: str = "sm_90a") -> CuteDslReport:
    """The check's report (see the module's docstring); `candidate` and `reference` are relative to the task
    folder (the cwd)."""
    import tempfile

    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    os.environ["CUTE_DSL_KEEP"] = "cubin"
    # in the process's scratch folder: a confined process may not write the task folder
    os.environ["CUTE_DSL_DUMP_DIR"] = os.path.join(tempfile.gettempdir(), "cute-dsl-dump")
    os.makedirs(os.environ["CUTE_DSL_DUMP_DIR"], exist_ok=True)  # the DSL writes there only if it exists
    try:
        from cutlass.base_dsl import jit_executor
    except Exception as exc:  # not installed, or a broken install: the user is told, not the traceback
        return CuteDslReport("no-dsl", f"the CuTe DSL cannot be imported here: {type(exc).__name__}: {exc} "
                             "(pip install 'nvidia-cutlass-dsl[cu13]' where the worker runs)")
    recorder = _Recorder()
    compiled_class = getattr(jit_executor, "JitCompiledFunction", None)
    if compiled_class is None or not hasattr(compiled_class, "run_compiled_program"):
        return CuteDslReport("unsupported", f"this version of the CuTe DSL ({_dsl_version()}) has no "
                             "JitCompiledFunction.run_compiled_program: kernel-lsp cannot check it without a GPU")

    def record_instead_of_launching(self: Any, exe_args: Any) -> int:
        recorder.record(self)
        return 0

    compiled_class.run_compiled_program = record_instead_of_launching
    stage: Literal["import", "inputs", "forward"] = "import"
    try:
        module = load_module(candidate, "kernel_lsp_cute_candidate")
        model_class = getattr(module, "ModelNew", None)
        if model_class is not None:
            inputs_module = module if hasattr(module, "get_inputs") or reference is None else \
                load_module(reference, "kernel_lsp_cute_reference")
            stage = "inputs"
            init = list(inputs_module.get_init_inputs()) if hasattr(inputs_module, "get_init_inputs") else []
            inputs = list(inputs_module.get_inputs()) if hasattr(inputs_module, "get_inputs") else None
            if inputs is not None:
                stage = "forward"
                model = model_class(*init)
                _no_grad(model)(*inputs)
    except (Exception, SystemExit) as exc:  # the candidate's own failure is the report
        return _failure(exc, stage, recorder)
    return CuteDslReport("ok", version=_dsl_version(), kernels=_kernels(recorder))


def _no_grad(model: Any) -> Any:
    import torch

    return torch.no_grad()(model)


def _failure(exc: BaseException, stage: Literal["import", "inputs", "forward"], recorder: _Recorder) -> CuteDslReport:
    """A compile error is one raised by or inside the DSL; anything else stopped the run before (or after) the
    kernels: reported, but not as the kernels' error."""
    frames = [FailureFrame(os.path.relpath(f.filename) if f.filename.startswith(os.getcwd() + os.sep) else f.filename,
                           f.lineno or 0, f.name, (f.line or "").strip())
              for f in traceback.extract_tb(exc.__traceback__)]
    return CuteDslReport("compile-error" if _is_dsl_error(exc, frames) else "stopped", _message(exc), _dsl_version(),
                         _kernels(recorder), stage, type(exc).__name__, frames)


def _is_dsl_error(exc: BaseException, frames: list[FailureFrame]) -> bool:
    """Raised by the DSL, or while it traced the user's function (any frame of its packages on the way: an
    AttributeError in a @cute.kernel body is the kernel's compile error)."""
    if (type(exc).__module__ or "").split(".")[0] in _DSL_ERROR_MODULES:
        return True
    return any(f"{os.sep}{package}{os.sep}" in frame.file for frame in frames for package in _DSL_PACKAGES)


def _message(exc: BaseException) -> str:
    """The error's own text, without the DSL's terminal colours and its GPU report."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    text = text.split("📊")[0].strip()  # the DSL appends the machine's GPU facts: not the user's error
    return text[:MAX_MESSAGE_CHARS] or type(exc).__name__


def _kernels(recorder: _Recorder) -> list[CompiledFunction]:
    """Each compiled host function's kernels (as the DSL named them) and its cubin."""
    found = []
    for function in recorder.compiled[:MAX_KERNELS]:
        names = list(getattr(function, "kernel_info", None) or {})
        artifacts = getattr(function, "artifacts", None)
        cubin = getattr(artifacts, "CUBIN", None) if artifacts is not None else None
        found.append(CompiledFunction(str(getattr(function, "function_name", "") or ""), [str(n) for n in names],
                                      bytes(cubin) if isinstance(cubin, (bytes, bytearray)) and
                                      len(cubin) <= MAX_CUBIN_BYTES else None))
    return found


def _dsl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-cutlass-dsl")
    except PackageNotFoundError:
        return "unknown"
