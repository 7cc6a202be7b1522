"""How an exception ended a run in a child process: its status (compile-error, out-of-memory, cuda-error,
disk-limit, python-exception), its message and its frames: a contracts.candidate_replies.RunFailure the parent
can report."""

from __future__ import annotations

import errno
import subprocess
import traceback
from collections.abc import Iterable
from pathlib import Path

from kernel_lsp.contracts.candidate_replies import Frame, RunFailure

OUT_OF_MEMORY_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc")
CUDA_ERROR_MARKERS = ("cuda error", "illegal memory access", "misaligned address", "unspecified launch failure",
                      "device-side assert", "illegal instruction")
BUILD_FAILURE_MARKER = "error building extension"
COMPILER_OUTPUT_TAIL_CHARS = 8000


def failure_parts(error: BaseException) -> RunFailure:
    """How an exception ended a run (status, message, error type, frames oldest first); the exception's frames are
    cleared (they may hold GiBs of the candidate's locals)."""
    frames = _exception_frames(error)
    traceback.clear_frames(error.__traceback__)
    status, cause = classify_exception(error)
    return RunFailure(status, _message(status, cause), _type_name(cause), frames)


def classify_exception(error: BaseException) -> tuple[str, BaseException]:
    """The status, and the exception in the chain (cause or context) that decided it."""
    chain = _exception_chain(error)
    for status, test in (("compile-error", _is_build_failure), ("out-of-memory", _is_out_of_memory),
                         ("cuda-error", _is_cuda_error), ("disk-limit", _is_past_file_size_limit)):
        decisive = next((link for link in chain if test(link)), None)
        if decisive is not None:
            return status, decisive
    return "python-exception", error


def _exception_chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def _is_build_failure(error: BaseException) -> bool:
    if isinstance(error, RuntimeError) and BUILD_FAILURE_MARKER in str(error).lower():
        return True
    if isinstance(error, subprocess.CalledProcessError):
        return any(_is_cpp_extension(summary.filename) for summary in traceback.extract_tb(error.__traceback__))
    return type(error).__name__ == "CompilationError" and type(error).__module__.startswith("triton")


def _is_cpp_extension(file: str) -> bool:
    return Path(file).parts[-3:] == ("torch", "utils", "cpp_extension.py")


def _is_out_of_memory(error: BaseException) -> bool:
    # by class name: torch.OutOfMemoryError (torch.cuda's is the same class) without importing torch
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    return isinstance(error, RuntimeError) and _mentions(str(error), OUT_OF_MEMORY_MARKERS)


def _is_cuda_error(error: BaseException) -> bool:
    if type(error).__name__ in ("AcceleratorError", "CudaError"):
        return True
    return isinstance(error, RuntimeError) and _mentions(str(error), CUDA_ERROR_MARKERS)


def _is_past_file_size_limit(error: BaseException) -> bool:
    # Python ignores SIGXFSZ, so a write past RLIMIT_FSIZE (the run's disk limit) fails with EFBIG instead
    return isinstance(error, OSError) and error.errno == errno.EFBIG


def _mentions(text: str, markers: Iterable[str]) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in markers)


def _message(status: str, error: BaseException) -> str:
    if status == "compile-error":
        return "the extension failed to build:\n" + _compiler_output(error)[-COMPILER_OUTPUT_TAIL_CHARS:]
    if status == "disk-limit":
        return f"a file grew past the run's disk limit (limits.diskBytes): {_type_name(error)}: {error}"
    text = str(error)
    return f"{_type_name(error)}: {text}" if text else _type_name(error)


def _compiler_output(error: BaseException) -> str:
    output = getattr(error, "output", None)
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    return output or str(error)


def _type_name(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _exception_frames(error: BaseException) -> list[Frame]:
    frames = [(s.filename, s.lineno or 0, s.name, (s.line or "").strip())
              for s in traceback.extract_tb(error.__traceback__)]
    if isinstance(error, SyntaxError) and error.filename:
        frames.append((error.filename, error.lineno or 0, "<module>", (error.text or "").strip()))
    return frames
