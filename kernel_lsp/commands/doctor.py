"""`kernel-lsp doctor`: what works and what is missing on this machine, one line per item.

`ok` works; `missing` is optional here and says what it costs; `FAIL` breaks a feature that could
otherwise work (exit status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_lsp.config import Settings

# what the checks use is imported where they run: every command's start builds the parser and imports this module

PROFILING_PARAMS = Path("/proc/driver/nvidia/params")


@dataclass
class Check:
    level: str  # ok | missing | FAIL
    item: str
    detail: str


async def tool_checks(settings: Settings) -> list[Check]:
    from kernel_lsp.compile.toolchain import ToolProblem, cutlass_headers, cutlass_problem, find_host_compiler, \
        find_nvcc
    from kernel_lsp.worker.environment import package_version

    checks = []
    for item, finder, fatal in (("nvcc", find_nvcc, True), ("host C++ compiler", find_host_compiler, False)):
        try:
            tool = await finder(settings)
            checks.append(Check("ok", item, f"{tool.version} ({tool.path})"))
        except ToolProblem as exc:
            checks.append(Check("FAIL" if fatal else "missing", item, str(exc)))
    headers = cutlass_headers(settings.compile.cutlass_include)
    checks.append(Check("ok", "CUTLASS/CuTe headers", f"{headers.include} ({headers.origin})") if headers else
                  Check("missing", "CUTLASS/CuTe headers", f"CuTe and CUTLASS sources cannot be compiled: "
                                                           f"{cutlass_problem(settings.compile.cutlass_include)}"))
    for package, why in (("torch", "load_inline sources cannot be compiled and nothing can run"),
                         ("triton", "Triton kernels cannot run")):
        version = package_version(package)
        checks.append(Check("ok", package, version) if version else
                        Check("missing", package, f"not installed: {why} (pip install 'kernel-lsp[worker]')"))
    return checks


def gpu_checks() -> list[Check]:
    from profilers.nvml import NvmlUnavailable, device_facts

    try:
        facts = device_facts()
    except NvmlUnavailable as exc:
        return [Check("missing", "GPU / NVML", f"{exc}; compile checks, the static profile of CUDA code and the "
                                                "verification of Triton and PyTorch candidates (on the CPU, without "
                                                "timings) still work; CUDA candidates, ncu and compute-sanitizer "
                                                "need a GPU (or a remote worker: --worker tcp:HOST:PORT)")]
    return [Check("ok", "GPU", f"{facts['name']} (sm_{facts['computeCapability'].replace('.', '')}, "
                               f"{facts['memoryFreeMiB']} MiB free of {facts['memoryTotalMiB']})"),
            Check("ok", "driver / NVML", facts["driver"]), shared_fill_check()]


def shared_fill_check(library: Any = None) -> Check:
    """The verifier's shared-memory fill (candidate/shared_fill.py), loaded and run once here."""
    from kernel_lsp.candidate.shared_fill import PoisonUnavailable, self_test

    try:
        return Check("ok", "shared-memory fill", self_test(library))
    except PoisonUnavailable as exc:
        return Check("FAIL", "shared-memory fill", f"{exc}: verification cannot poison shared memory "
                                                   f"(verify-shared-unpoisoned), nor can shared-init run")


def isolation_checks() -> list[Check]:
    """What a candidate's process is kept from: its environment (filtered here), and its files and network, as
    a throw-away child confined the same way finds them (process/confine.py's probe)."""
    from kernel_lsp.findings import held_secret_names
    from kernel_lsp.process.confine import SIGNAL_SCOPE_ABI
    from kernel_lsp.process.isolation import withheld

    names = withheld({**os.environ, **dict.fromkeys(held_secret_names(), "")})  # and those this command holds
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    checks = [Check("ok", "candidate environment",
                    f"allow-list: {len(names)} variable(s) withheld{f' ({shown})' if names else ''}, HOME in a "
                    "scratch folder")]
    checks.append(sandbox_check())
    try:
        probed = subprocess.run([sys.executable, "-m", "kernel_lsp.process.confine", "--probe"], capture_output=True,
                                text=True, timeout=30, check=True)
        seen = json.loads(probed.stdout)
        for folder in seen.get("folders", []):
            shutil.rmtree(folder, ignore_errors=True)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return checks + [Check("missing", "candidate isolation", f"not isolated: the probe failed ({error})")]
    confinement = seen["confinement"]
    for part, tried in (("files", "write outside"), ("network", "connect")):
        status = confinement[part]
        held = status.startswith("isolated") and seen[tried] != "done"
        checks.append(Check("ok" if held else "missing", f"candidate {part}",
                            status if held else f"not isolated: {status} (a probe's {tried}: {seen[tried]})"))
    return checks + [processes_check(confinement["files"].startswith("isolated") and seen["abi"] >= SIGNAL_SCOPE_ABI)]


def sandbox_check() -> Check:
    """Whether the candidate's sandbox (process/namespaces.py) starts here: bubblewrap run once; if not, what is
    missing and the one command or setting that gives it."""
    from kernel_lsp.process.namespaces import isolation_status

    status = isolation_status()
    return Check("ok" if status.startswith("isolated") else "missing", "candidate sandbox", status)


def processes_check(signal_scoped: bool) -> Check:
    """Whether what a candidate starts ends with it: a keeper over a program that leaves a process behind in a
    session of its own must name it and kill it (process/keeper.py's probe)."""
    from kernel_lsp.process.keeper import probe, processes_isolation

    seen = probe()
    status = processes_isolation(seen["start"], signal_scoped)
    if seen["end"] is None or not seen["end"].left_count or seen["running"]:
        return Check("missing", "candidate processes",
                     f"not isolated: a probe's detached process was {'left running' if seen['running'] else 'not seen'}"
                     f" ({status})")
    return Check("ok" if status.startswith("isolated") else "missing", "candidate processes", status)


def profiler_checks() -> list[Check]:
    checks = []
    ncu = shutil.which("ncu")
    if ncu is None:
        checks.append(Check("missing", "ncu", "Nsight Compute is not on PATH: no profiler hints"))
    else:
        checks.append(Check("ok", "ncu", ncu))
        checks.append(counter_permission())
    sanitizer = shutil.which("compute-sanitizer")
    checks.append(Check("ok", "compute-sanitizer", sanitizer) if sanitizer else
                  Check("missing", "compute-sanitizer", "not on PATH: no memory-error checks of candidates"))
    return checks


def counter_permission() -> Check:
    """GPU performance counters are admin-only unless the driver says otherwise (ERR_NVGPUCTRPERM)."""
    try:
        params = PROFILING_PARAMS.read_text()
    except OSError:
        return Check("missing", "GPU counter permission", f"cannot read {PROFILING_PARAMS} (no NVIDIA driver here)")
    restricted = "RmProfilingAdminOnly: 1" in params
    if restricted and os.geteuid() != 0:
        return Check("missing", "GPU counter permission",
                     "restricted to admin users (ncu fails with ERR_NVGPUCTRPERM): set "
                     "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' in /etc/modprobe.d and reboot, "
                     "or run the worker as root")
    return Check("ok", "GPU counter permission", "restricted, running as root" if restricted else "open")


def api_key_check() -> Check:
    from kernel_lsp.agent.credentials import API_KEY_ENV, api_key

    if api_key():
        return Check("ok", API_KEY_ENV, "present")
    return Check("missing", API_KEY_ENV, "not set: 'Optimize this kernel' cannot call the model")


async def worker_check(address: str, token: str | None) -> list[Check]:
    from kernel_lsp.contracts.codec import ContractError, decode
    from kernel_lsp.contracts.job_metrics import DeviceInfoMetrics
    from kernel_lsp.worker.client import WorkerClient, WorkerUnavailable
    from kernel_lsp.worker.protocol import Job

    client = WorkerClient(address=address, token=token)
    where = address or "local (started for this check)"
    try:
        round_trip = await client.ping()
        result = await client.run(Job("device-info", {}, {}, ""), timeout_s=300)
    except WorkerUnavailable as exc:
        return [Check("FAIL", "worker", str(exc))]
    finally:
        await client.close()
    try:
        info = decode(DeviceInfoMetrics, result.metrics) if result.status == "ok" else None
    except ContractError as exc:  # a worker of another version
        return [Check("FAIL", "worker", f"{where}: its device-info does not match this version's contract: {exc}")]
    versions = info.versions if info else {}
    detail = (f"{where}: ping {round_trip * 1000:.1f} ms, torch {versions.get('torch')}, "
              f"CUDA {versions.get('cuda')}, GPU {'yes' if info and info.cuda_available else 'no'}")
    checks = [Check("ok", "worker", detail)]
    if result.error:
        checks.append(Check("missing", "worker GPU", result.error))
    return checks


def add_parser(sub: Any) -> None:
    doctor = sub.add_parser("doctor", help="what works and what is missing on this machine")
    doctor.add_argument("--worker", default="", metavar="ADDRESS",
                        help="check a running worker (unix:PATH or tcp:HOST:PORT) instead of starting a local one")
    doctor.add_argument("--token-file", help="token for --worker (else $KERNEL_LSP_TOKEN)")
    doctor.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return run_doctor(args.worker, args.token_file)


def run_doctor(worker_address: str, token_file: str | None) -> int:
    from kernel_lsp.worker.daemon import read_token

    async def gather() -> list[Check]:
        checks = await tool_checks(Settings())
        checks += gpu_checks() + profiler_checks() + isolation_checks() + [api_key_check()]
        checks += await worker_check(worker_address, read_token(token_file))
        return checks

    checks = asyncio.run(gather())
    width = max(len(c.item) for c in checks)
    for c in checks:
        print(f"{c.level:<8} {c.item:<{width}}  {c.detail}")
    return 1 if any(c.level == "FAIL" for c in checks) else 0
