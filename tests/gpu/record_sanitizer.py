"""Records compute-sanitizer's output on the GPU machine (issue 22): each tool over the candidates of
tests/gpu/sanitizer_candidates.py run by the profile driver, a standalone program, and (--bench, after the rest,
until the deadline) the time of each tool on the KernelBench ReLU and matmul candidates.

    python3 tests/gpu/record_sanitizer.py --out "$OUT/sanitizer" [--bench] [--deadline-s 540]

Writes <name>.<tool>[.<variant>].log (compute-sanitizer's --log-file), .out (the program's stdout and stderr) and
runs.json (argv, exit code, wall time of each run); prints a table last.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.gpu.sanitizer_candidates import CANDIDATES, STANDALONE, STANDALONE_ARGS  # noqa: E402

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
# as the job runs them (profilers/sanitizer.py sanitizer_command): memcheck without its leak check, with padding
BASE = {"memcheck": ["--leak-check", "no", "--padding", "4096"], "racecheck": [], "initcheck": [], "synccheck": []}
START = time.monotonic()


def sanitizer() -> str:
    found = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    return found


def run(argv: list[str], out: Path, env: dict[str, str], timeout: float, cwd: Path | None = None) -> dict:
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                              cwd=cwd)
        code, text = done.returncode, done.stdout
    except subprocess.TimeoutExpired as exc:
        code, text = "timeout", exc.stdout or b""
    out.write_bytes(text)
    return {"argv": argv, "rc": code, "wall_s": round(time.monotonic() - t0, 2)}


def environment(work: Path, caching: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    # the worker's own -lineinfo build cache (kernel_lsp/profile/sanitize.py), so the GPU tests after this reuse them
    cache = Path(env.get("KERNEL_LSP_CACHE_DIR") or Path.home() / ".cache" / "kernel-lsp") / "sanitize-extensions"
    env.update(PYTHONPATH=f"{ROOT}:{env.get('PYTHONPATH', '')}", TORCH_EXTENSIONS_DIR=str(cache),
               NVCC_APPEND_FLAGS="-lineinfo", MAX_JOBS="4")
    if not caching:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


def driver(candidate: Path, reference: Path | None = None, warmup: int = 0, calls: int = 1) -> list[str]:
    argv = [sys.executable, "-P", "-m", "kernel_lsp.profile.driver", "--candidate", str(candidate),
            "--warmup", str(warmup), "--calls", str(calls)]
    return argv + (["--reference", str(reference)] if reference else [])


def sanitized(tool: str, log: Path, program: list[str], extra: list[str] = ()) -> list[str]:
    pairs = [BASE[tool][at:at + 2] for at in range(0, len(BASE[tool]), 2)]
    base = [part for pair in pairs if pair[0] not in extra for part in pair]  # an option in extra replaces BASE's
    return [sanitizer(), "--tool", tool, *base, *extra, "--target-processes", "application-only",
            "--log-file", str(log), *program]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--deadline-s", type=float, default=450)
    parser.add_argument("--tool-timeout-s", type=float, default=120)
    parser.add_argument("--only", default="", help="comma-separated candidates (and standalone); all by default")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    wanted = (lambda name: not only or name in only)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/kernel-lsp-sanitize")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    runs: dict[str, dict] = {}
    cs = sanitizer()
    for name, argv in {"version": [cs, "--version"], "help": [cs, "--help"],
                       "nvidia-smi": ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
                       }.items():
        runs[name] = run(argv, out / f"{name}.txt", dict(os.environ), 60)

    files = {}
    for name, text in CANDIDATES.items():
        if not wanted(name):
            continue
        files[name] = work / f"{name}.py"
        files[name].write_text(text)
        (out / f"{name}.py").write_text(text)
    # build every extension once, with -lineinfo, outside the sanitizer
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        built = {name: pool.submit(run, driver(path, warmup=1, calls=0), out / f"{name}.build.out",
                                   environment(work), 400) for name, path in files.items()}
        for name, future in built.items():
            runs[f"{name}.build"] = future.result()

    plan: list[tuple[str, str, list[str], bool, str]] = []  # (candidate, tool, extra options, caching, variant)
    for name in ("clean", "oob", "race", "uninit_shared", "uninit_global", "sync"):
        plan += [(name, tool, [], False, "") for tool in TOOLS]
    plan += [("many", "memcheck", [], False, ""), ("library", "initcheck", [], False, ""),
             ("library", "memcheck", [], False, ""), ("library", "racecheck", [], False, ""),
             ("oob", "memcheck", [], True, "caching"), ("oob", "memcheck", ["--padding", "0"], False, "nopadding"),
             ("oob", "memcheck", ["--show-backtrace", "no"], False, "nobacktrace"),
             ("race", "racecheck", ["--racecheck-report", "hazard"], False, "hazard"),
             ("uninit_shared", "racecheck", ["--racecheck-report", "hazard"], False, "hazard"),
             ("many", "memcheck", ["--print-limit", "5"], False, "limit5")]

    plan = [item for item in plan if wanted(item[0])]

    def one(item: tuple[str, str, list[str], bool, str]) -> tuple[str, dict]:
        name, tool, extra, caching, variant = item
        stem = ".".join(filter(None, (name, tool, variant)))
        argv = sanitized(tool, out / f"{stem}.log", driver(files[name]), extra)
        return stem, run(argv, out / f"{stem}.out", environment(work, caching), args.tool_timeout_s)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        for stem, record in pool.map(one, plan):
            runs[stem] = record

    if wanted("standalone"):
        standalone(out, work, runs)
    if args.bench:
        bench(out, work, runs, args)
    (out / "runs.json").write_text(json.dumps(runs, indent=1))
    print(f"{'run':40} {'rc':>8} {'wall s':>8}")
    for stem, record in runs.items():
        print(f"{stem:40} {str(record['rc']):>8} {record['wall_s']:8.1f}")
    return 0


def standalone(out: Path, work: Path, runs: dict) -> None:
    program = work / "standalone.cu"
    program.write_text(STANDALONE)
    (out / "standalone.cu").write_text(STANDALONE)
    binary = work / "standalone"
    runs["standalone.build"] = run(["nvcc", "-O2", "-lineinfo", "-o", str(binary), str(program)],
                                   out / "standalone.build.out", dict(os.environ), 120)
    program_argv = [str(binary), *STANDALONE_ARGS]
    runs["standalone.plain"] = run(program_argv, out / "standalone.plain.out", dict(os.environ), 60)
    for tool in TOOLS:
        runs[f"standalone.{tool}"] = run(sanitized(tool, out / f"standalone.{tool}.log", program_argv),
                                         out / f"standalone.{tool}.out", dict(os.environ), 120)

    # the worker's way: confined by kernel_lsp.process.confine, which execs the program (ncu and the sanitizer follow)
    from kernel_lsp.profile.program import confined_launch

    home = work / "home"
    home.mkdir(exist_ok=True)
    confined = confined_launch(program_argv, home)[0]  # as the worker's plain run: writes to home, /dev, /proc
    runs["standalone.memcheck.confined"] = run(sanitized("memcheck", out / "standalone.memcheck.confined.log", confined),
                                               out / "standalone.memcheck.confined.out", environment(work), 120)
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    runs["standalone.ncu.confined"] = run([ncu, "--clock-control", "none", "--launch-count", "1", "--section",
                                           "SpeedOfLight", *confined], out / "standalone.ncu.confined.out",
                                          environment(work), 120)


def bench(out: Path, work: Path, runs: dict, args: argparse.Namespace) -> None:
    from tests.gpu.candidates import HONEST_MATMUL, HONEST_RELU, MATMUL_PROBLEM, RELU_PROBLEM

    kernelbench = ROOT / "tests" / "fixtures" / "kernelbench"
    problems = {"relu": (HONEST_RELU, kernelbench / RELU_PROBLEM), "matmul": (HONEST_MATMUL, kernelbench / MATMUL_PROBLEM)}
    for name, (text, reference) in problems.items():
        candidate = work / f"bench_{name}.py"
        candidate.write_text(text)
        runs[f"bench.{name}.build"] = run(driver(candidate, reference, warmup=1, calls=0),
                                          out / f"bench.{name}.build.out", environment(work), 400)
        runs[f"bench.{name}.plain"] = run(driver(candidate, reference), out / f"bench.{name}.plain.out",
                                          environment(work), 300)
        for tool in TOOLS:
            left = args.deadline_s - (time.monotonic() - START)
            if left < 20:
                runs[f"bench.{name}.{tool}"] = {"argv": [], "rc": "not run (deadline)", "wall_s": 0.0}
                continue
            stem = f"bench.{name}.{tool}"
            argv = sanitized(tool, out / f"{stem}.log", driver(candidate, reference))
            runs[stem] = run(argv, out / f"{stem}.out", environment(work), min(args.tool_timeout_s, left - 5))


if __name__ == "__main__":
    sys.exit(main())
