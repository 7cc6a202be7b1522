"""What is in a file: CUDA kernels, Triton and CuTe DSL kernels, load_inline strings, KernelBench parts, and position maps.

Pure standard library (ast, re): the server parses documents without importing torch or triton.
"""

from kernel_lsp.sources.cuda import CudaKernel, Include, find_includes, find_kernels
from kernel_lsp.sources.extensions import InlineExtension, SourceString, assemble_load_inline
from kernel_lsp.sources.python import (
    LARGE_PARSE,
    ClassInfo,
    CuteKernel,
    FuncInfo,
    KernelBenchParts,
    PythonModel,
    SyntaxErrorInfo,
    TritonKernel,
    offload_large_parses,
    parse_python,
    parsed,
    python_model,
)
from kernel_lsp.sources.sourcemap import CharPositions, GeneratedFile, Segment, SourceMap

__all__ = [
    "LARGE_PARSE",
    "CharPositions",
    "ClassInfo",
    "CudaKernel",
    "CuteKernel",
    "FuncInfo",
    "GeneratedFile",
    "Include",
    "InlineExtension",
    "KernelBenchParts",
    "PythonModel",
    "Segment",
    "SourceMap",
    "SourceString",
    "SyntaxErrorInfo",
    "TritonKernel",
    "assemble_load_inline",
    "find_includes",
    "find_kernels",
    "offload_large_parses",
    "parse_python",
    "parsed",
    "python_model",
]
