"""The sanitize and profile jobs' path for a standalone `.cu` program (issue 22), run on this machine with
stand-ins for the tools a CPU cannot run: `nvcc` (no GPU for -arch=native) builds a program that prints what the
real one printed; `compute-sanitizer` runs the program and writes the log compute-sanitizer wrote for it on an
H100 (tests/fixtures/sanitizer/standalone.*); `ncu` runs the program and answers the report's imports with the
CSV pages recorded on the H200 (tests/fixtures/h200/ncu_*.csv, of kernels.cu). Everything between is the
worker's own code: the header's flags, the build, the plain run confined through
`python -m kernel_lsp.process.confine` (Landlock and seccomp where the kernel has them), each tool's argv, reading
its output, and the findings and hints on the program's lines."""

from __future__ import annotations

import shlex
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernel_lsp.profile.report import problem_messages
from kernel_lsp.findings import uri_to_path
from kernel_lsp.contracts.options import from_config
from kernel_lsp.jobs.files import JOB_KEYS
from kernel_lsp.kinds.sanitize import SanitizeOptions, SanitizeOutcome, sanitize_job, sanitize_result
from tests.gpu.sanitizer_candidates import STANDALONE, bug_line

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "sanitizer"
H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200"

NVCC = """#!/bin/sh
# stand-in for nvcc: records its argv, writes -o's file as a program printing what the real program printed
echo "$@" > "{calls}/nvcc"
while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift;; esac; shift; done
{build}
"""

SANITIZER = r"""#!/bin/sh
# stand-in for compute-sanitizer: records its argv, runs the program, writes the recorded log of the tool, its
# source file renamed as this build's
echo "$@" >> "{calls}/sanitizer"
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) tool="$2"; shift 2;;
    --log-file) log="$2"; shift 2;;
    --leak-check|--padding|--print-limit|--target-processes) shift 2;;
    *) break;;
  esac
done
"$@" > /dev/null 2>&1
# the recording names its source standalone.cu: compute-sanitizer prints the name nvcc was given (its base name)
source=$(basename "$(awk '{{print $NF}}' "{calls}/nvcc")")
sed "s/ in standalone\.cu:/ in $source:/" "{recorded}/standalone.$tool.log" > "$log"
grep -q "ERROR SUMMARY: 0 errors" "$log" && exit 0
grep -q "(0 errors, 0 warnings)" "$log" && exit 0
exit 1
"""


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def stand_ins(tmp_path: Path, monkeypatch, without_sandbox) -> Path:
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    program = '#!/bin/sh\\necho "ok $1"\\n'
    _script(bin_dir / "nvcc", NVCC.format(calls=calls, build=f"printf '{program}' > \"$out\"; chmod +x \"$out\""))
    _script(bin_dir / "compute-sanitizer", SANITIZER.format(calls=calls, recorded=RECORDED))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return calls


async def _sanitize(path: Path, tmp_path: Path, tools: list[str]) -> SanitizeOutcome:
    job = sanitize_job(path, None, {"tools": tools})
    options = from_config(SanitizeOptions, job.config, ignore=JOB_KEYS)
    context = SimpleNamespace(cache_dir=tmp_path / "cache", progress=None)
    return SanitizeOutcome.of(await sanitize_result(job, options, context))


async def test_a_program_is_built_run_confined_and_its_error_lands_on_its_line(tmp_path: Path, stand_ins: Path):
    path = tmp_path / "prog.cu"
    path.write_text(STANDALONE)
    outcome = await _sanitize(path, tmp_path, ["memcheck", "racecheck", "initcheck", "synccheck"])
    assert outcome.error is None, outcome.error
    build = shlex.split((stand_ins / "nvcc").read_text())
    assert build[:2] == ["-lineinfo", "-arch=native"] and "-O2" in build  # the header's build= flags
    # the plain run went through the confining exec and printed what the program prints
    assert outcome.report.warm.exit_code == 0 and "ok 1000000" in outcome.report.warm.tail, outcome.report
    runs = [shlex.split(line) for line in (stand_ins / "sanitizer").read_text().splitlines()]
    assert [run[run.index("--tool") + 1] for run in runs] == ["memcheck", "racecheck", "initcheck", "synccheck"]
    assert all(run[-1] == "1000000" for run in runs)  # the header's run= arguments, to the program itself
    [finding] = outcome.user_errors
    assert uri_to_path(finding.uri) == path and finding.code == "sanitizer-memcheck"
    assert finding.range.start.line == bug_line(STANDALONE) - 1
    assert "4 bytes just past the end of a 4000000-byte allocation" in finding.message, finding.message
    assert outcome.summary.startswith("errors found"), outcome.summary
    tools = {run.tool: run for run in outcome.report.tools}
    assert "cudaErrorLaunchFailure" in " ".join(tools["memcheck"].notes)
    assert not tools["racecheck"].problem and not tools["synccheck"].problem, tools


async def test_a_program_that_does_not_build_is_said_and_nothing_is_sanitized(tmp_path: Path, monkeypatch):
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    _script(bin_dir / "nvcc", NVCC.format(calls=calls, build='echo "prog.cu(8): error: identifier \\"z\\" is '
                                                            'undefined" >&2; exit 1'))
    _script(bin_dir / "compute-sanitizer", SANITIZER.format(calls=calls, recorded=RECORDED))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    path = tmp_path / "prog.cu"
    path.write_text(STANDALONE)
    outcome = await _sanitize(path, tmp_path, ["memcheck"])
    assert not (calls / "sanitizer").exists()  # no tool ran
    assert not outcome.clean and not outcome.user_errors
    assert "prog.cu did not build" in " ".join(p.message for p in outcome.report.problems), outcome.report
    assert 'identifier "z" is undefined' in " ".join(p.message for p in outcome.report.problems)


NCU = r"""#!/bin/sh
# stand-in for ncu: a report's import prints the recorded page; a profiling run runs the program, writes the report
echo "$@" >> "{calls}/ncu"
case " $* " in
  *" --import "*" raw "*) cat "{h200}/ncu_raw.csv"; exit 0;;
  *" --import "*) cat "{h200}/ncu_details.csv"; exit 0;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --export) report="$2"; shift 2;;
    */program) break;;
    *) shift;;
  esac
done
"$@" || exit $?
: > "$report"
"""


async def test_a_program_is_profiled_live_with_its_kernels_on_its_lines(tmp_path: Path, stand_ins: Path):
    from kernel_lsp.kinds.profile import ProfileOptions, ProfileOutcome, profile_job
    from kernel_lsp.profile.worker_job import program_profile

    _script(tmp_path / "bin" / "ncu", NCU.format(calls=stand_ins, h200=H200))
    text = (H200 / "kernels.cu").read_text()
    path = tmp_path / "kernels.cu"
    path.write_text("// kernel-lsp: run=--size 4096\n" + text)
    job = profile_job(path, None, {"launchCount": 1})
    options = from_config(ProfileOptions, job.config, ignore=JOB_KEYS)
    said = []

    async def progress(message, fraction=None):
        said.append(message)

    context = SimpleNamespace(cache_dir=tmp_path / "cache", progress=progress)
    outcome = ProfileOutcome.of(await program_profile(job, options, context))
    assert outcome.error is None, outcome.error
    report = outcome.report
    assert report.source == "ncu", report.problems
    [profiling] = [shlex.split(line) for line in (stand_ins / "ncu").read_text().splitlines()
                   if "--import" not in line]
    assert profiling[-3:] == [str(Path(profiling[-3])), "--size", "4096"] and profiling[-3].endswith("/program")
    assert "--launch-count" in profiling and "-k" in profiling  # its own kernels only
    recorded = [kernel.kernel for kernel in report.kernels]
    assert "vec_add" in recorded and "smem_conflict" in recorded, recorded
    written = path.read_text().splitlines()
    hints = [f for f in outcome.findings if f.code.startswith("hint-")]
    assert {f.message.split(":", 1)[0] for f in hints} == set(recorded)  # a hint for each kernel ncu measured
    for finding in hints:  # on its kernel's line of the file (one header line above the recorded source)
        kernel = finding.message.split(":", 1)[0]
        assert f" {kernel}(" in written[finding.range.start.line], (kernel, finding.range.start.line)
    # the stand-in binary has no device code: the SASS rules say why they are missing, the profile stands
    assert any(problem.startswith("no SASS of") for problem in problem_messages(report)), report.problems
    assert said[:2] == ["building kernels.cu with nvcc", "running kernels.cu"], said
