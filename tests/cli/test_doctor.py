"""`kernel-lsp doctor` on this machine: every item gets a line, the local worker is started and pinged."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_lsp", "doctor", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


def test_doctor_reports_each_item(tmp_path: Path):
    result = doctor(env={"ANTHROPIC_API_KEY": "sk-test-not-shown"})
    rows = {re.match(r"^\S+\s+(.+?)\s{2,}", line).group(1): line for line in result.stdout.splitlines()}
    assert rows["nvcc"].startswith("ok" if shutil.which("nvcc") else "FAIL")
    assert rows["torch"].startswith("ok")
    assert rows["worker"].startswith("ok") and "ping" in rows["worker"]
    assert rows["ANTHROPIC_API_KEY"].startswith("ok") and "sk-test" not in result.stdout
    assert "ncu" in rows and "GPU" in result.stdout
    assert rows["candidate environment"].startswith("ok") and "ANTHROPIC_API_KEY" in rows["candidate environment"]
    from kernel_lsp.process.confine import SIGNAL_SCOPE_ABI, landlock_abi

    files_held = rows["candidate files"].startswith("ok")
    assert files_held == (landlock_abi() >= 1), rows["candidate files"]  # Landlock, where the kernel has it
    assert rows["candidate network"].startswith("ok"), rows["candidate network"]  # seccomp: on every Linux here
    # a subreaper keeper on every Linux; a candidate kept from killing it from Landlock ABI 6
    assert rows["candidate processes"].startswith("ok") == (landlock_abi() >= SIGNAL_SCOPE_ABI), rows
    assert result.returncode == (0 if shutil.which("nvcc") else 1)


def test_doctor_says_when_the_remote_worker_is_unreachable():
    result = doctor("--worker", "tcp:127.0.0.1:1")
    assert result.returncode == 1
    assert any(line.startswith("FAIL") and "tcp:127.0.0.1:1" in line for line in result.stdout.splitlines())


def test_without_a_gpu_doctor_says_what_still_works(monkeypatch):
    """Triton and PyTorch candidates are verified on the CPU (Triton's interpreter): doctor does not say that
    verification needs a GPU, only what does."""
    import profilers.nvml
    from kernel_lsp.commands.doctor import gpu_checks

    def no_driver():
        raise profilers.nvml.NvmlUnavailable("NVML: no NVIDIA driver")
    monkeypatch.setattr(profilers.nvml, "device_facts", no_driver)
    [check] = gpu_checks()
    assert check.level == "missing" and "verification of Triton and PyTorch candidates" in check.detail, check
    assert "verification and profiling need a GPU" not in check.detail
