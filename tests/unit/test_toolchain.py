"""Finding tools: a broken one is probed once per install, not on every compile."""

from __future__ import annotations

from kernel_lsp.compile.toolchain import ToolProblem, find_nvcc
from kernel_lsp.config import Settings


async def test_a_broken_tool_is_probed_once_per_install(tmp_path):
    calls = tmp_path / "calls"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho x >> {calls}\nexit 3\n")
    nvcc.chmod(0o755)
    settings = Settings.of(nvcc_path=str(nvcc))
    for _ in range(3):
        try:
            await find_nvcc(settings)
        except ToolProblem as exc:
            assert "--version failed (exit status 3" in str(exc)
        else:
            raise AssertionError("a broken nvcc was accepted")
    assert calls.read_text().count("x") == 1
