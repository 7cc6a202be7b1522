"""The candidate sandbox on the CPU: how a run ended, limits, output caps, pre-started children, cancellation."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import msgpack
import pytest

from kernel_lsp.process.failures import classify_exception
from kernel_lsp.worker.sandbox import Sandbox, SandboxLimits, SandboxRun, SandboxStartError, SandboxTask

USER_FILE = "/home/user/project/candidate.py"
LIMITS = SandboxLimits(wall_time_s=20.0)


def candidate(source: str, function: str = "main", **kwargs: object) -> SandboxTask:
    return SandboxTask(entry="kernel_lsp.worker.tasks:call_function",
                       args={"file": "candidate.py", "function": function, "kwargs": kwargs},
                       files={"candidate.py": source}, origins={"candidate.py": USER_FILE})


async def run(sandbox: Sandbox, source: str, limits: SandboxLimits = LIMITS, **kwargs: object) -> SandboxRun:
    return await sandbox.run(candidate(source, **kwargs), limits)


async def assert_keeps_serving(sandbox: Sandbox) -> None:
    outcome = await run(sandbox, "def main():\n    return 'still serving'\n")
    assert (outcome.status, outcome.value) == ("ok", "still serving")


def line_of(source: str, text: str) -> int:
    return next(number for number, line in enumerate(source.splitlines(), 1) if text in line)


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for init, which may reap it late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
async def sandbox():
    sandbox = Sandbox()
    yield sandbox
    await sandbox.close()


async def test_returns_the_value_and_the_output(sandbox: Sandbox):
    source = ("import os, sys\n"
              "def main(n):\n"
              "    print('hello')\n"
              "    return {'n': n, 'cwd': os.getcwd(), 'path0': sys.path[0]}\n")
    outcome = await run(sandbox, source, n=3)
    assert outcome.status == "ok"
    assert outcome.value["n"] == 3
    assert outcome.value["cwd"] == outcome.value["path0"]  # the task dir is both
    assert Path(outcome.value["cwd"]).name.startswith("kernel-lsp-task-")
    assert not Path(outcome.value["cwd"]).exists()  # removed after the run
    assert (outcome.stdout, outcome.stderr, outcome.output_truncated) == ("hello\n", "", False)
    assert (outcome.exit_code, outcome.signal_name, outcome.traceback) == (0, None, [])
    assert msgpack.unpackb(msgpack.packb(outcome.to_dict()))["value"]["n"] == 3


async def test_each_task_gets_a_fresh_child(sandbox: Sandbox):
    source = "import os\ndef main():\n    return os.getpid()\n"
    first, second = await run(sandbox, source), await run(sandbox, source)
    assert first.status == second.status == "ok"
    assert first.value != second.value and first.value != os.getpid()


async def test_spinning_candidate_times_out_and_is_killed(sandbox: Sandbox):
    started = time.monotonic()
    outcome = await run(sandbox, "def main():\n    while True:\n        pass\n", SandboxLimits(wall_time_s=1.0))
    assert time.monotonic() - started < 3.0
    assert outcome.status == "timeout"
    assert "1 s" in outcome.message
    assert outcome.signal_name == "SIGKILL"
    await assert_keeps_serving(sandbox)


async def test_segfault_is_a_signal_on_the_users_line(sandbox: Sandbox):
    source = "import ctypes\ndef main():\n    return ctypes.string_at(0)\n"
    outcome = await run(sandbox, source)
    assert outcome.status == "signal"
    assert outcome.signal_name == "SIGSEGV"
    assert outcome.exit_code is None
    assert outcome.traceback[-1].function == "string_at"  # the crash itself is inside ctypes
    deepest_own = [f for f in outcome.traceback if f.file == USER_FILE][-1]
    assert (deepest_own.line, deepest_own.function, deepest_own.text) == (3, "main", "return ctypes.string_at(0)")
    await assert_keeps_serving(sandbox)


async def test_unbounded_allocation_is_out_of_memory(sandbox: Sandbox):
    source = "def main():\n    x = []\n    while True:\n        x.append(bytearray(50_000_000))\n"
    outcome = await run(sandbox, source, SandboxLimits(wall_time_s=20.0, host_memory_bytes=2**30))
    assert outcome.status == "out-of-memory"
    assert outcome.error_type == "MemoryError"
    assert outcome.traceback[-1].line == 4
    await assert_keeps_serving(sandbox)


async def test_cuda_tasks_get_a_data_limit_instead_of_an_address_space_limit(sandbox: Sandbox):
    source = ("import resource\n"
              "def main():\n"
              "    assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY\n"
              "    assert resource.getrlimit(resource.RLIMIT_DATA)[0] == 2**30\n"
              "    x = []\n"
              "    while True:\n"
              "        x.append(bytearray(50_000_000))\n")
    task = candidate(source)
    task = SandboxTask(task.entry, {**task.args, "uses_cuda": True}, task.files, task.origins)  # not passed on
    outcome = await sandbox.run(task, SandboxLimits(wall_time_s=30.0, host_memory_bytes=2**30))
    assert (outcome.status, outcome.error_type) == ("out-of-memory", "MemoryError")
    assert outcome.traceback[-1].line == 7


async def test_flood_of_output_is_capped_and_drained(sandbox: Sandbox):
    source = ("import sys\n"
              "def main():\n"
              "    for _ in range(100):\n"
              "        sys.stdout.write('x' * 1_000_000)\n"
              "    return 'done'\n")
    limits = SandboxLimits(wall_time_s=20.0, output_bytes=64 * 1024)
    started = time.monotonic()
    outcome = await run(sandbox, source, limits)
    assert time.monotonic() - started < 10.0
    assert (outcome.status, outcome.value) == ("ok", "done")
    assert outcome.output_truncated
    assert outcome.stdout == "x" * limits.output_bytes
    await assert_keeps_serving(sandbox)


async def test_exception_traceback_points_at_the_users_file_and_line(sandbox: Sandbox):
    source = ("def helper(n):\n"
              "    if n > 2:\n"
              "        raise ValueError(f'n too large: {n}')\n"
              "\n"
              "def main():\n"
              "    return helper(3)\n")
    outcome = await run(sandbox, source)
    assert outcome.status == "python-exception"
    assert (outcome.error_type, outcome.message) == ("ValueError", "ValueError: n too large: 3")
    assert [(f.file, f.line, f.function) for f in outcome.traceback] == [(USER_FILE, 6, "main"),
                                                                          (USER_FILE, 3, "helper")]
    assert outcome.traceback[-1].text == "raise ValueError(f'n too large: {n}')"
    assert outcome.to_dict()["traceback"][-1] == {"file": USER_FILE, "line": 3, "function": "helper",
                                                  "text": "raise ValueError(f'n too large: {n}')"}
    await assert_keeps_serving(sandbox)


async def test_syntax_error_is_reported_on_its_line(sandbox: Sandbox):
    source = "def main():\n    return 1\n\ndef broken(:\n    pass\n"
    outcome = await run(sandbox, source)
    assert (outcome.status, outcome.error_type) == ("python-exception", "SyntaxError")
    assert (outcome.traceback[-1].file, outcome.traceback[-1].line) == (USER_FILE, line_of(source, "broken"))


async def test_cuda_error_text_is_a_cuda_error(sandbox: Sandbox):
    source = "def main():\n    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n"
    outcome = await run(sandbox, source)
    assert outcome.status == "cuda-error"
    assert "illegal memory access" in outcome.message


async def test_abort_after_a_cuda_error_is_a_cuda_error(sandbox: Sandbox):
    source = ("import os, sys\n"
              "def main():\n"
              "    sys.stderr.write(\"terminate called after throwing an instance of 'c10::Error'\\n"
              "  what():  CUDA error: misaligned address\\n\")\n"
              "    sys.stderr.flush()\n"
              "    os.abort()\n")
    outcome = await run(sandbox, source)
    assert (outcome.status, outcome.signal_name) == ("cuda-error", "SIGABRT")
    assert "CUDA error: misaligned address" in outcome.message
    await assert_keeps_serving(sandbox)


async def test_exit_without_a_result_is_a_sandbox_error(sandbox: Sandbox):
    outcome = await run(sandbox, "import os\ndef main():\n    os._exit(3)\n")
    assert (outcome.status, outcome.exit_code) == ("sandbox-error", 3)
    await assert_keeps_serving(sandbox)


async def test_value_msgpack_cannot_carry_is_a_sandbox_error(sandbox: Sandbox):
    outcome = await run(sandbox, "def main():\n    return object()\n")
    assert outcome.status == "sandbox-error"
    assert "msgpack" in outcome.message


async def test_warm_child_has_the_preload_imported_and_starts_fast():
    sandbox = Sandbox(preload=("torch",))  # importing torch alone takes seconds: a cold start could not pass
    try:
        source = "import sys\ndef main():\n    return 'torch' in sys.modules\n"
        for _ in range(2):  # the first child, then the one pre-started after the first run
            await sandbox.start()
            started = time.monotonic()
            outcome = await run(sandbox, source)
            assert time.monotonic() - started < 1.0
            assert (outcome.status, outcome.value) == ("ok", True)
    finally:
        await sandbox.close()


async def started_run(sandbox: Sandbox, pid_file: Path, then: str) -> tuple[asyncio.Task, int]:
    """A run whose task writes its pid to `pid_file` and then runs `then` (lines of its body); it and the pid."""
    source = ("import os, time\n"
              "def main(pid_file):\n"
              "    with open(pid_file, 'w') as f:\n"
              "        f.write(str(os.getpid()))\n" + then)
    running = asyncio.create_task(run(sandbox, source, pid_file=str(pid_file)))
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return running, int(pid_file.read_text())


async def test_cancelling_a_run_kills_the_child(sandbox: Sandbox, tmp_path: Path):
    running, pid = await started_run(sandbox, tmp_path / "pid", "    while True:\n        pass\n")
    assert is_running(pid)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    deadline = time.monotonic() + 2
    while is_running(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not is_running(pid)
    await assert_keeps_serving(sandbox)


class OutOfMemoryError(RuntimeError):
    """Named like torch.OutOfMemoryError: the child tells torch's errors by class name."""


class AcceleratorError(RuntimeError):
    """Named like torch.AcceleratorError."""


@pytest.mark.parametrize(("error", "status"), [
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out-of-memory"),
    (OutOfMemoryError("Tried to allocate 80.00 GiB"), "out-of-memory"),
    (MemoryError(), "out-of-memory"),
    (AcceleratorError("an illegal memory access was encountered"), "cuda-error"),
    (RuntimeError("CUDA error: unspecified launch failure"), "cuda-error"),
    (RuntimeError("Triton Error [CUDA]: misaligned address"), "cuda-error"),
    (RuntimeError("device-side assert triggered"), "cuda-error"),
    (RuntimeError("Error building extension 'softmax': nvcc fatal"), "compile-error"),
    (ValueError("out of memory range"), "python-exception"),  # only RuntimeErrors are read for markers
    (KeyError("x"), "python-exception"),
])
def test_classify_exception(error: BaseException, status: str):
    assert classify_exception(error)[0] == status


def test_classify_follows_the_cause_chain():
    try:
        try:
            raise RuntimeError("Error building extension 'k': error: identifier \"x\" is undefined")
        except RuntimeError as build_error:
            raise ImportError("could not load the kernel") from build_error
    except ImportError as error:
        status, decisive = classify_exception(error)
    assert status == "compile-error"
    assert isinstance(decisive, RuntimeError)


def test_a_failing_subprocess_outside_cpp_extension_is_not_a_build_failure():
    try:
        subprocess.run(["false"], check=True)
    except subprocess.CalledProcessError as error:
        assert classify_exception(error)[0] == "python-exception"


async def test_processes_the_candidate_leaves_behind_are_killed(sandbox: Sandbox):
    source = "import subprocess\ndef main():\n    return subprocess.Popen(['sleep', '60']).pid\n"
    outcome = await run(sandbox, source)
    assert outcome.status == "ok"
    deadline = time.monotonic() + 2
    while is_running(outcome.value) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not is_running(outcome.value)


async def test_a_child_that_cannot_start_is_a_sandbox_error_and_the_start_is_retried(tmp_path: Path):
    sandbox = Sandbox(python=str(tmp_path / "no-such-python"))
    try:
        with pytest.raises(SandboxStartError):
            await sandbox.start()
        outcome = await run(sandbox, "def main():\n    return 1\n")
        assert outcome.status == "sandbox-error"
        assert "no-such-python" in outcome.message
    finally:
        await sandbox.close()


async def test_a_waiting_child_killed_from_outside_is_replaced(sandbox: Sandbox):
    await sandbox.start()
    waiting = _sandbox_children()
    assert len(waiting) == 1  # the child of its keeper, a child of this process
    os.kill(waiting[0], 9)
    await asyncio.sleep(0.2)
    outcome = await run(sandbox, "import os\ndef main():\n    return os.getpid()\n")
    assert outcome.status == "ok" and outcome.value != waiting[0]


async def test_no_child_starts_while_a_run_runs_and_the_next_waits_after_it(sandbox: Sandbox, tmp_path: Path):
    """The next child's imports (a candidate's process with its CUDA context, on a worker) would share the CPU and
    the device with the judge's timed rounds: it starts when the run ends."""
    await sandbox.start()
    running, runner = await started_run(sandbox, tmp_path / "pid", "    time.sleep(1.5)\n")
    during = []
    while not running.done():
        during.extend(pid for pid in _sandbox_children() if pid != runner)
        await asyncio.sleep(0.05)
    assert (await running).status == "ok"
    assert during == [], f"children started while the run ran: {sorted(set(during))}"
    deadline = time.monotonic() + 10
    while not [pid for pid in _sandbox_children() if pid != runner] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert [pid for pid in _sandbox_children() if pid != runner], "no child waits for the next run"


def _sandbox_children() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_waiting_child(int(p))]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def _is_waiting_child(pid: int) -> bool:
    try:
        grandparent = _parent(_parent(pid))
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return grandparent == os.getpid() and b"kernel_lsp.worker.child" in command


# values no random folder name can contain by chance (one test failed when "oa" was part of a home's name)
SECRETS = {name: f"secret-value-of-{name.lower()}" for name in (
    "ANTHROPIC_API_KEY", "KERNEL_LSP_TOKEN", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "TORCH_HUB_TOKEN",
    "MY_SERVICE_PASSWORD", "OPENAI_API_KEY")}


async def test_secrets_stay_out_of_the_candidates_environment(tmp_path: Path):
    """A candidate that reads its environment (os.environ, /proc/self/environ) and writes it to a file of its
    choosing finds none of the worker's secrets; HOME is a scratch folder of its own, removed after the run."""
    leak = tmp_path / "leaked.txt"
    source = ("import os\n"
              "def main(leak):\n"
              "    raw = open('/proc/self/environ', 'rb').read().decode(errors='replace')\n"
              "    open(leak, 'w').write(repr(dict(os.environ)) + raw)\n"
              "    return {'home': os.environ.get('HOME'), 'names': sorted(os.environ),\n"
              "            'triton': os.environ.get('TRITON_CACHE_DIR')}\n")
    sandbox = Sandbox(env={**os.environ, **SECRETS, "CUDA_VISIBLE_DEVICES": "0", "HOME": str(tmp_path)})
    try:
        outcome = await run(sandbox, source, leak=str(leak))
    finally:
        await sandbox.close()
    assert outcome.status == "ok", outcome.message
    written = leak.read_text()
    for name, value in SECRETS.items():
        assert name not in outcome.value["names"]
        assert value not in written, f"{name} reached the candidate"
    assert "CUDA_VISIBLE_DEVICES" in outcome.value["names"]  # what CUDA needs still gets through
    home = Path(outcome.value["home"])
    assert home != tmp_path and home.name.startswith("kernel-lsp-home-")
    assert not home.exists()  # removed with the child
    assert outcome.value["triton"].endswith("builds/triton")  # build caches apart from the trusted ones


@pytest.mark.parametrize("name, allowed", [
    ("PATH", True), ("CUDA_VISIBLE_DEVICES", True), ("TRITON_INTERPRET", True), ("LC_ALL", True),
    ("ANTHROPIC_API_KEY", False), ("KERNEL_LSP_TOKEN", False), ("TORCH_HUB_TOKEN", False),
    ("CUDA_SECRET", False), ("AWS_ACCESS_KEY_ID", False), ("GOOGLE_APPLICATION_CREDENTIALS", False),
    ("SSH_AUTH_SOCK", False), ("HF_TOKEN", False), ("DATABASE_URL", False), ("NPM_CONFIG_USERCONFIG", False),
])
def test_environment_allow_list(name: str, allowed: bool):
    from kernel_lsp.process.isolation import allowed as is_allowed

    assert is_allowed(name) is allowed


def test_a_waiting_child_whose_sandbox_died_removes_its_own_folder(tmp_path: Path):
    """A worker killed (or a Ray actor stopped) never removes its waiting child's scratch folder: the child does,
    once its task pipe closes without a task."""
    import sys

    from kernel_lsp.process.frames import read_frame

    home = tmp_path / "kernel-lsp-home-x"
    (home / "inside").mkdir(parents=True)
    task_read, task_write = os.pipe()
    result_read, result_write = os.pipe()
    child = subprocess.Popen([sys.executable, "-P", "-m", "kernel_lsp.worker.child", "--task-fd", str(task_read),
                              "--result-fd", str(result_write), f"--home={home}"],
                             pass_fds=(task_read, result_write), stdin=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    os.close(task_read)
    os.close(result_write)
    try:
        assert "ready" in read_frame(result_read)
        assert home.is_dir()
        os.close(task_write)  # what the parent's death does to the pipe
        assert child.wait(30) == 0
        assert not home.exists()
    finally:
        child.kill()
        os.close(result_read)


FORGED_REPLY = '''import os, struct, sys
import msgpack
def main():
    fd = int(sys.argv[sys.argv.index("--result-fd") + 1])
    body = msgpack.packb({"status": "ok", "message": "", "value": "forged", "error_type": None,
                          "traceback": [{"file": "/etc/passwd", "line": "one", "function": "f", "text": ""}]})
    os.write(fd, struct.pack(">I", len(body)) + body)
    os._exit(0)
'''


async def test_a_reply_the_tasks_code_forged_that_breaks_the_contract_is_a_sandbox_error(sandbox: Sandbox):
    """The task's code runs in the child and can write to its result pipe: the reply is decoded
    (contracts.sandbox_reply.ChildReply), and one that does not decode names its keys and is no value."""
    outcome = await run(sandbox, FORGED_REPLY)
    assert (outcome.status, outcome.value) == ("sandbox-error", None), outcome
    assert "breaks its contract" in outcome.message and ".traceback[0].line" in outcome.message
    await assert_keeps_serving(sandbox)
