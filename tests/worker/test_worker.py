"""The real worker process, driven through the server's WorkerClient and through raw protocol frames."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.worker import protocol
from kernel_lsp.worker.client import WorkerClient, WorkerUnavailable
from kernel_lsp.worker.protocol import Job

SLEEPER = "import time\n\ndef main(seconds):\n    time.sleep(seconds)\n    return seconds\n"
SPINNER = "def main():\n    while True:\n        pass\n"


def python_job(source: str, function: str = "main", limits: dict | None = None, **kwargs) -> Job:
    return Job("run-python", {"candidate.py": source},
               {"file": "candidate.py", "function": function, "kwargs": kwargs,
                "origins": {"candidate.py": "/home/user/candidate.py"}, "limits": limits or {}}, "")


@pytest.fixture
async def client():
    messages: list[str] = []
    worker = WorkerClient(on_message=messages.append)
    worker.messages = messages
    yield worker
    await worker.close()


async def test_round_trip_and_device_info(client: WorkerClient):
    assert (await client.run(Job("noop", {}, {}, ""))).status == "ok"
    assert await client.ping() < 5
    assert client.status.state == "connected" and client.status.versions["python"]
    info = await client.run(Job("device-info", {}, {}, ""), timeout_s=300)
    assert info.status == "ok"
    assert info.metrics["versions"]["torch"]  # torch is installed for the tests
    if not info.metrics["cudaAvailable"]:
        assert "no GPU" in info.error


async def test_sandboxed_candidate_results_and_failures(client: WorkerClient):
    ok = await client.run(python_job(SLEEPER, seconds=0))
    assert (ok.status, ok.findings, ok.artifacts["sandbox_run"]["value"]) == ("ok", [], 0)
    spun = await client.run(python_job(SPINNER, limits={"wallTimeS": 1}))
    assert spun.status == "ok"
    (finding,) = spun.findings
    assert finding["code"] == "run-timeout"
    assert finding["uri"] == "file:///home/user/candidate.py"
    raised = await client.run(python_job("def main():\n    x = 1\n    return x / 0\n"))
    (finding,) = raised.findings
    assert finding["code"] == "run-python-exception" and "ZeroDivisionError" in finding["message"]
    assert finding["range"][0] == 2  # line 3 of the user's file, 0-based
    assert (await client.run(python_job(SLEEPER, seconds=0))).status == "ok"


async def test_killed_worker_loses_the_job_and_restarts(client: WorkerClient):
    await client.ping()
    first_pid = client._connection.process.pid
    running = asyncio.ensure_future(client.run(python_job(SLEEPER, seconds=60)))
    await asyncio.sleep(1.0)
    os.kill(first_pid, signal.SIGKILL)
    lost = await asyncio.wait_for(running, timeout=30)
    assert lost.status == "lost" and "exited with status -9" in lost.error
    assert client.status.restarts == 1 and len(client.messages) == 1 and "1 job(s) lost" in client.messages[0]
    again = await client.run(python_job(SLEEPER, seconds=0))
    assert again.status == "ok" and client._connection.process.pid != first_pid
    assert client.status.state == "connected"


async def test_job_timeout_cancels_on_the_worker(client: WorkerClient):
    result = await client.run(python_job(SLEEPER, seconds=60), timeout_s=1)
    assert result.status == "timeout" and "jobTimeoutS" in result.error
    assert (await client.run(Job("noop", {}, {}, ""))).status == "ok"


async def test_unknown_job_kind_fails_that_job_only(client: WorkerClient):
    result = await client.run(Job("no-such-kind", {}, {}, ""))
    assert result.status == "failed" and result.error.startswith("unknown-job-kind")
    assert result.code == "unknown-job-kind"  # what a reader branches on, apart from the sentence
    assert (await client.run(Job("noop", {}, {}, ""))).status == "ok"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_listener(address: str, env: dict[str, str]) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "kernel_lsp", "worker", "--listen", address],
                               env={**os.environ, **env}, stderr=subprocess.PIPE)
    for _ in range(200):
        probe = WorkerClient(address=address, token=env.get("KERNEL_LSP_TOKEN"))
        try:
            await probe.ping()
            await probe.close()
            return process
        except WorkerUnavailable:
            await asyncio.sleep(0.1)
    process.kill()
    raise AssertionError(f"worker did not listen on {address}: {process.stderr.read().decode()}")


@pytest.fixture
async def tcp_worker():
    port = free_port()
    process = await start_listener(f"tcp:127.0.0.1:{port}", {"KERNEL_LSP_TOKEN": "s3cret-token"})
    yield port
    process.kill()
    process.wait()


async def test_token_is_required_and_checked(tcp_worker: int):
    address = f"tcp:127.0.0.1:{tcp_worker}"
    for token in ("wrong", None):
        with pytest.raises(WorkerUnavailable, match="auth-failed"):
            await WorkerClient(address=address, token=token)._connected()
    # a raw client that skips hello: its submit is refused and never answered with a result
    reader, writer = await asyncio.open_connection("127.0.0.1", tcp_worker)
    await protocol.write_message(writer, protocol.submit(1, python_job(SLEEPER, seconds=0)))
    reply = await protocol.read_message(reader, protocol.DEFAULT_MAX_FRAME)
    assert (reply["kind"], reply["code"]) == ("error", "not-authenticated")
    writer.close()
    good = WorkerClient(address=address, token="s3cret-token")
    assert (await good.run(Job("noop", {}, {}, ""))).status == "ok"
    await good.close()


def test_listening_beyond_loopback_without_a_token_exits_2():
    env = {k: v for k, v in os.environ.items() if k != "KERNEL_LSP_TOKEN"}
    result = subprocess.run([sys.executable, "-m", "kernel_lsp", "worker", "--listen", "tcp:0.0.0.0:7799"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "without a token" in result.stderr


async def test_garbage_never_kills_the_worker(tmp_path: Path):
    path = tmp_path / "w.sock"
    process = await start_listener(f"unix:{path}", {})
    rng = random.Random(1234)
    try:
        for attempt in range(30):
            reader, writer = await asyncio.open_unix_connection(str(path))
            junk = rng.randbytes(rng.randint(1, 4096))
            if attempt % 3 == 0:
                junk = (0xFFFFFFF0).to_bytes(4, "big") + junk  # a huge length prefix
            writer.write(junk)
            await writer.drain()
            writer.close()
        # a well-formed client on a connection that first sent nonsense frames is still served
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(protocol.encode_frame({"kind": "nonsense", "id": 5}) + protocol.encode_frame({"kind": "ping"}))
        await writer.drain()
        codes = [(await protocol.read_message(reader, protocol.DEFAULT_MAX_FRAME))["code"] for _ in range(2)]
        assert codes == ["unknown-kind", "bad-field"]
        writer.close()
        survivor = WorkerClient(address=f"unix:{path}")
        assert await survivor.ping() < 5
        await survivor.close()
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


def gpu_sleeper(seconds: float) -> Job:
    return Job("run-python", {"c.py": SLEEPER},
               {"file": "c.py", "function": "main", "kwargs": {"seconds": seconds}, "usesCuda": True}, "")


async def test_gpu_jobs_queue_one_at_a_time(client: WorkerClient):
    progress: list[str] = []
    first = asyncio.ensure_future(client.run(gpu_sleeper(2)))
    await asyncio.sleep(0.5)
    second = await client.run(gpu_sleeper(0), progress=lambda text, fraction: progress.append(text))
    assert second.status == "ok"
    assert first.done() and (await first).status == "ok"  # the second job only ran once the first was done
    assert any(p.startswith("waiting for the GPU") for p in progress), progress


CPP_EXTENSION = "int add_one(int x) { return x + 1; }"


async def test_extension_built_once_per_content(client: WorkerClient, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(tmp_path))  # the worker starts with the first job
    job = Job("build-extension", {"main.cpp": CPP_EXTENSION},
              {"name": "kl_add_one", "functions": ["add_one"], "extraCflags": ["-O0"]}, "")
    first = await client.run(job, timeout_s=900)
    assert first.status == "ok" and first.findings == [], first.artifacts
    assert first.metrics["cached"] is False
    second = await client.run(job, timeout_s=900)
    assert second.metrics["cached"] is True
    assert second.metrics["buildDirectory"] == first.metrics["buildDirectory"]
    assert second.metrics["durationS"] < first.metrics["durationS"] / 3
    broken = await client.run(Job("build-extension", {"main.cpp": "int add_one(int x) { return y; }"},
                                  {"name": "kl_broken", "functions": ["add_one"]}, ""), timeout_s=900)
    assert [f["code"] for f in broken.findings] == ["run-compile-error"], [f["message"] for f in broken.findings]


@pytest.mark.parametrize("source, limits, code", [
    ("import ctypes\n\ndef main():\n    return ctypes.string_at(0)\n", {}, "run-signal"),
    ("def main():\n    hoard = []\n    while True:\n        hoard.append(bytearray(50_000_000))\n",
     {"hostMemoryBytes": 2 * 2**30}, "run-out-of-memory"),
])
async def test_crashing_candidates_through_the_worker(client: WorkerClient, source: str, limits: dict, code: str):
    result = await client.run(python_job(source, limits=limits))
    assert [f["code"] for f in result.findings] == [code], result.artifacts["sandbox_run"]
    if code == "run-signal":  # the signal itself, not the 128+N its sandbox's bubblewrap exits with
        assert result.artifacts["sandbox_run"]["signal_name"] == "SIGSEGV", result.artifacts["sandbox_run"]
    assert (await client.run(python_job(SLEEPER, seconds=0))).status == "ok"


async def test_a_flood_of_output_is_capped(client: WorkerClient):
    source = "import sys\n\ndef main():\n    for _ in range(100):\n        sys.stdout.write('x' * 2**20)\n    return 7\n"
    result = await client.run(python_job(source, limits={"outputBytes": 2**20}))
    outcome = result.artifacts["sandbox_run"]
    assert (outcome["status"], outcome["value"], outcome["output_truncated"]) == ("ok", 7, True)
    assert len(outcome["stdout"]) <= 2**20
