"""The parsing process (kernel_lsp/server/parsing.py) with a real child: the model it sends back is the one a parse
here gives, a child that is gone costs nothing but time, and the sources hand it their big parses."""

from __future__ import annotations

import pytest

from kernel_lsp.server.parsing import ParseProcess
from kernel_lsp.sources import LARGE_PARSE, offload_large_parses, parse_python, python_model

pytestmark = pytest.mark.slow

CANDIDATE = '''\
import torch
import triton
import triton.language as tl
from torch.utils.cpp_extension import load_inline

source = """
__global__ void add_one(float* p) { p[threadIdx.x] += 1.0f; }
"""
ext = load_inline(name="e", cpp_sources="", cuda_sources=source, functions=["add_one"])


class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x + 1


def get_inputs():
    return [torch.randn(4)]
'''


def big_text(broken: bool = False) -> str:
    kernels = "".join(f"@triton.jit\ndef k{i}(x_ptr, n):\n    pid = tl.program_id(0)\n\n" for i in range(900))
    text = CANDIDATE + kernels + ("def broken(:\n" if broken else "")
    assert len(text) >= LARGE_PARSE
    return text


@pytest.fixture
def process():
    parser = ParseProcess()
    yield parser
    parser.close()


@pytest.mark.parametrize("broken", [False, True], ids=["parses", "syntax-error"])
def test_the_childs_model_is_the_one_a_parse_here_gives(process: ParseProcess, broken: bool):
    text = big_text(broken)
    there, here = process.parse(text), python_model(text)
    assert there.triton_kernels == here.triton_kernels and len(there.triton_kernels) == 900
    assert there.kernelbench == here.kernelbench and there.kernelbench.model_new is not None
    assert there.syntax_error == here.syntax_error and (there.syntax_error is not None) == broken
    assert there.imported == here.imported == {"torch", "triton"}
    (extension,) = there.extensions
    assert [s.text for s in extension.cuda_sources] == [s.text for s in here.extensions[0].cuda_sources]
    assert list(extension.cuda_sources[0].char_positions) == list(here.extensions[0].cuda_sources[0].char_positions)


def test_a_parse_after_the_child_is_gone_still_gives_the_model(process: ParseProcess):
    first = process.parse(big_text())
    process.close()  # killed, as a crash would
    for _ in range(2):  # the first finds it dead (or parses here), the next starts another
        again = process.parse(big_text())
        assert again.triton_kernels == first.triton_kernels and again.kernelbench == first.kernelbench


def test_the_sources_send_big_texts_to_the_process_and_keep_small_ones_here(process: ParseProcess):
    texts = []

    def parse(text: str):
        texts.append(text)
        return process.parse(text)

    offload_large_parses(parse)
    try:
        big = big_text() + "# offloaded\n"
        assert len(parse_python(big).triton_kernels) == 900
        assert parse_python(big) is parse_python(big)  # kept: parsed once
        parse_python(CANDIDATE + "# small\n")
    finally:
        offload_large_parses(None)
    assert texts == [big]
