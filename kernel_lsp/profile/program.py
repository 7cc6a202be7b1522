"""Standalone CUDA programs: a `.cu` file with its own `main()`, built with nvcc and run by the worker.

A header comment sets the build flags and the program's arguments (each optional, anywhere in the first lines):

    // kernel-lsp: build=-O3 -DN=4096 run=1048576 --check

The worker builds it (`nvcc -lineinfo -arch=native` plus the header's flags), runs it once confined (a non-zero
exit, a CUDA error it prints, a signal: findings), then profiles it live under ncu or checks it under
compute-sanitizer, which start it themselves with the same scrubbed environment (no secrets, HOME in a scratch
folder) but without the confinement (it is the user's own program, as `nvcc && ./a.out` would run it).
A line `FILE.cu:LINE` in what it prints (a CUDA_CHECK macro's __FILE__ and __LINE__) places its error there;
otherwise errors sit on `main`.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kernel_lsp.compile.process import ProcessResult, output_tail, run_process
from kernel_lsp.contracts.profile_report import ProfileProblem
from kernel_lsp.findings import SOURCE, Finding, Range, Severity, path_to_uri
from kernel_lsp.process.namespaces import isolation_status
from kernel_lsp.candidate.handle import candidate_launch, in_sandbox

HEADER_LINES = 20
HEADER = re.compile(r"//\s*kernel-lsp:\s*(?P<body>.*)$")
KEY = re.compile(r"\b(build|run)=")
MAIN = re.compile(r"^[^\S\n]*(?:int|auto|void)\s+main\s*\(", re.MULTILINE)
COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
CUDA_ERROR = re.compile(r"(?i)\bCUDA(?: runtime)? error\b|\bcuda\w*Error\w*\b|an illegal memory access|"
                        r"unspecified launch failure|misaligned address|device-side assert")
FILE_LINE = re.compile(r"(?P<file>[\w./-]+\.cu[h]?)[:(](?P<line>\d+)")
BUILD_TIMEOUT_S = 300.0
RUN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ProgramHeader:
    build: tuple[str, ...] = ()
    run: tuple[str, ...] = ()
    problems: tuple[ProfileProblem, ...] = ()


def program_header(text: str) -> ProgramHeader:
    """The build flags and run arguments of the file's `// kernel-lsp:` lines (the later of two wins)."""
    values: dict[str, tuple[str, ...]] = {}
    problems: list[ProfileProblem] = []
    for line in text.splitlines()[:HEADER_LINES]:
        match = HEADER.search(line)
        if match is None:
            continue
        body = match.group("body")
        keys = list(KEY.finditer(body))
        for index, key in enumerate(keys):
            end = keys[index + 1].start() if index + 1 < len(keys) else len(body)
            try:
                values[key.group(1)] = tuple(shlex.split(body[key.end():end]))
            except ValueError as exc:
                problems.append(ProfileProblem("profile-bad-header", f"the {key.group(1)}= header does not parse: "
                                                                     f"{exc}"))
    return ProgramHeader(values.get("build", ()), values.get("run", ()), tuple(problems))


def has_main(text: str) -> bool:
    """The file defines main() (comments are not code)."""
    return MAIN.search(COMMENTS.sub(lambda m: "\n" * m.group(0).count("\n"), text)) is not None


def main_line(text: str) -> int:
    match = MAIN.search(COMMENTS.sub(lambda m: " " * len(m.group(0)) if "\n" not in m.group(0)
                                     else "\n" * m.group(0).count("\n"), text))
    return text.count("\n", 0, match.start()) if match else 0


@dataclass
class ProgramRun:
    binary: Path | None
    build: ProcessResult | None = None
    run: ProcessResult | None = None
    problems: list[ProfileProblem] = field(default_factory=list)

    @property
    def built(self) -> bool:
        return self.binary is not None


def nvcc_path() -> str:
    return shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


async def build_program(source: Path, header: ProgramHeader, output: Path,
                        timeout_s: float = BUILD_TIMEOUT_S) -> ProgramRun:
    """nvcc -lineinfo -arch=native and the header's flags; the build's output stays in the ProgramRun."""
    argv = [nvcc_path(), "-lineinfo", "-arch=native", *header.build, "-o", str(output), str(source)]
    try:
        result = await run_process(argv, timeout_s=timeout_s, cwd=str(source.parent))
    except OSError as exc:
        return ProgramRun(None, problems=[ProfileProblem("profile-tool-missing", f"cannot run nvcc: {exc}")])
    run = ProgramRun(output if result.returncode == 0 and output.is_file() else None, build=result)
    if result.timed_out:
        run.problems.append(ProfileProblem("profile-build-failed", f"nvcc ran past {timeout_s:.0f} s building "
                                                                   f"{source.name}"))
    elif not run.built:
        run.problems.append(ProfileProblem("profile-build-failed", f"{source.name} did not build: "
                                                                   f"{_tail(result.output)}"))
    return run


def confined_launch(program: list[str], home: Path, allow_network: bool = False) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that run `program` as a candidate's process runs: the environment's allow-list (no
    secret), HOME and TMPDIR in `home`, writes only there and in the build caches, no network unless allowed
    (kernel_lsp.process.confine confines itself, then execs the program; the rules stay across the exec). The
    plain run only: under ncu or compute-sanitizer the program is started directly with this environment."""
    environment, writable = candidate_launch(home)
    argv = [sys.executable, "-P", "-m", "kernel_lsp.process.confine", *(f"--writable={w}" for w in writable)]
    argv = [*argv, *(["--allow-network"] if allow_network else []), "--", *program]
    if isolation_status().startswith("isolated"):  # the run's folder (the program, its task files) read-only
        argv = in_sandbox(argv, writable, (str(home.parent),), allow_network)
    return argv, environment


async def run_program(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
                      timeout_s: float = RUN_TIMEOUT_S) -> ProcessResult:
    return await run_process(argv, timeout_s=timeout_s, cwd=str(cwd), env=env)


def runtime_findings(result: ProcessResult, path: str, text: str, name: str, timeout_s: float = RUN_TIMEOUT_S
                     ) -> list[Finding]:
    """A run that failed (exit code, signal, timeout) or printed CUDA errors: one finding per distinct message,
    on the FILE:LINE it names when that is this file, else on main()."""
    lines = [line.strip() for line in result.output.splitlines() if CUDA_ERROR.search(line)]
    messages: list[tuple[str, int | None]] = []
    for line in dict.fromkeys(lines):
        located = FILE_LINE.search(line)
        at = int(located.group("line")) - 1 if located and Path(located.group("file")).name == name else None
        messages.append((line[:300], at))
    if result.timed_out:
        messages.append((f"the program ran past {timeout_s:.0f} s and was stopped", None))
    elif result.returncode and not messages:
        code = result.returncode
        how = f"died from signal {-code}" if code < 0 else f"exited with code {code}"
        messages.append((f"the program {how}: {_tail(result.output)}", None))
    elif result.returncode:
        messages[0] = (f"{messages[0][0]} (exit code {result.returncode})", messages[0][1])
    default = main_line(text)
    return [Finding(path_to_uri(path), Range.line(default if at is None else at), Severity.ERROR, SOURCE,
                    "program-error", message, data={"exitCode": result.returncode, "timedOut": result.timed_out})
            for message, at in messages]


def _tail(text: str) -> str:
    return output_tail(text, 4, "(no output)")
