"""The Ray backend against a local Ray instance the test starts, CPU-only (Triton's interpreter): the same verdicts
as the local worker, a job whose actor is killed retried elsewhere, cancellation of queued and running jobs."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from kernel_lsp.kinds.verify import verify_job
from kernel_lsp.worker.client import WorkerClient
from kernel_lsp.worker.protocol import Job
from tests.problems import relu_problem, triton_relu

ray = pytest.importorskip("ray", reason="the Ray backend's tests need ray: pip install 'kernel-lsp[ray]'")
from kernel_lsp.worker.ray_backend import RayBackend  # noqa: E402

OPTIONS = {"device": "cpu", "trials": 2, "timedCalls": 5, "warmup": 1, "baselines": ["eager"]}
SLEEPER = '''import os
import time


def work(seconds, markers, name):
    open(os.path.join(markers, name + ".started"), "w").close()
    time.sleep(seconds)
    open(os.path.join(markers, name + ".finished"), "w").close()
    return name
'''


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (the backends join it: they neither start nor stop it)."""
    os.environ["TRITON_INTERPRET"] = "1"  # the actors' workers run Triton on the CPU
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    yield
    ray.shutdown()


@pytest.fixture
def markers() -> Path:
    """Where the sleeper jobs leave their markers: a run-python job's code is confined like a candidate's, and of
    the host writes only the candidates' build caches and the worker's built extensions (whose cache folder the
    actors' workers share with this test: KERNEL_LSP_CACHE_DIR, tests/conftest.py)."""
    extensions = Path(os.environ["KERNEL_LSP_CACHE_DIR"]) / "extensions"
    extensions.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="ray-markers-", dir=extensions))
    folder.chmod(0o777)  # the sandbox's user (nobody, when the tests run as root) writes here
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def sleeper(markers: Path, name: str, seconds: float) -> Job:
    return Job("run-python", {"sleeper.py": SLEEPER},
               {"file": "sleeper.py", "function": "work",
                "kwargs": {"seconds": seconds, "markers": str(markers), "name": name}}, f"sleep-{name}")


def candidates(folder: Path) -> list[Job]:
    """Honest, wrong, writing into its input, and crashing: four verdicts to agree on."""
    (folder / "relu.py").write_text(relu_problem())
    honest = triton_relu(1024)
    texts = {
        "honest": honest,
        "wrong": honest.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 0.5)"),
        "in_place": honest.replace("        return out\n", "        x.zero_()\n        return out\n"),
        "crash": honest.replace("        out = torch.empty_like(x)\n",
                                "        raise RuntimeError('boom')\n"),
    }
    jobs = []
    for name, text in texts.items():
        path = folder / f"{name}.py"
        path.write_text(text)
        jobs.append(verify_job(path, folder / "relu.py", OPTIONS))
    return jobs


def verdict(result) -> tuple:
    return (result.status, result.metrics.get("verdict"), sorted({f["code"] for f in result.findings}))


async def test_a_batch_across_actors_gives_the_verdicts_of_the_local_worker(local_ray, tmp_path: Path):
    jobs = candidates(tmp_path)
    local = WorkerClient()
    try:
        expected = [verdict(await local.run(job)) for job in jobs]
    finally:
        await local.close()
    assert [v[1] for v in expected] == ["verified", "rejected", "rejected", "rejected"], expected

    backend = RayBackend(actors=3)
    try:
        await backend.ping()
        assert backend.capacity == 3 and backend.status.state == "connected"
        assert backend.status.gpu == "3 Ray CPU actors on 1 node"
        assert len({a.info.pid for a in backend.actors}) == 3
        progress: list[str] = []
        results = await asyncio.gather(*(backend.run(job, progress=lambda m, _f: progress.append(m))
                                         for job in jobs))
    finally:
        await backend.close()
    assert [verdict(r) for r in results] == expected
    assert progress, "the actors' progress messages reach the caller"
    assert backend.status.state == "stopped"


async def test_an_actor_killed_mid_job_is_retried_and_the_batch_completes(local_ray, markers: Path):
    backend = RayBackend(actors=2)
    try:
        await backend.ping()
        jobs = [sleeper(markers, f"job{i}", 4.0) for i in range(4)]
        batch = asyncio.gather(*(backend.run(job) for job in jobs))
        deadline = time.monotonic() + 30
        while not any(a.running for a in backend.actors):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # the job is inside its sandbox now
        victim = next(a for a in backend.actors if a.running)
        ray.kill(victim.handle, no_restart=True)
        results = await asyncio.wait_for(batch, 120)
        assert [r.status for r in results] == ["ok"] * 4, [r.error for r in results]
        assert [r.artifacts["sandbox_run"]["status"] for r in results] == ["ok"] * 4
        assert backend.retried == 1 and backend.status.restarts == 1
        assert victim not in backend.actors
        deadline = time.monotonic() + 120
        while backend.capacity < 2:  # the lost actor was replaced
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        assert (await backend.run(sleeper(markers, "after", 0.0))).status == "ok"
    finally:
        await backend.close()


async def test_cancellation_stops_queued_and_running_jobs(local_ray, markers: Path):
    backend = RayBackend(actors=2)
    try:
        await backend.ping()
        tasks = [asyncio.ensure_future(backend.run(sleeper(markers, f"job{i}", 6.0))) for i in range(5)]
        deadline = time.monotonic() + 30
        while len(list(markers.glob("*.started"))) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes), outcomes
        await asyncio.sleep(8.0)  # past the time the running ones would have needed
        assert len(list(markers.glob("*.started"))) == 2  # the three queued never started
        assert list(markers.glob("*.finished")) == []  # the two running were stopped
        assert backend.status.running_jobs == 0
        started = time.monotonic()
        results = await asyncio.gather(*(backend.run(sleeper(markers, f"next{i}", 0.0)) for i in range(2)))
        assert [r.status for r in results] == ["ok", "ok"] and time.monotonic() - started < 30
    finally:
        await backend.close()


def test_bench_over_ray_gives_the_local_table_and_runs_one_job_per_actor(local_ray, tmp_path: Path, capsys):
    from tests.cli.test_bench_command import bench

    (tmp_path / "kb" / "level1").mkdir(parents=True)
    folder = tmp_path / "candidates" / "level1"
    folder.mkdir(parents=True)
    honest = triton_relu(1024)
    for number, (name, text) in enumerate({"Relu": honest, "Wrong": honest.replace("0.0)", "0.5)"),
                                           "Zeroed": honest.replace("return out", "return out.zero_()")}.items(), 1):
        (tmp_path / "kb" / "level1" / f"{number}_{name}.py").write_text(relu_problem())
        (folder / f"{number}_{name}.py").write_text(text)

    def rows(*more: str) -> tuple[dict, str]:
        out = tmp_path / f"report{len(more)}"
        status = bench(str(tmp_path / "candidates"), "--kernelbench", str(tmp_path / "kb"), "--device", "cpu",
                       "--trials", "2", "--calls", "5", "--baselines", "eager", "--out", str(out), *more)
        captured = capsys.readouterr()
        assert status == 0, captured.err
        document = json.loads((out / "bench.json").read_text())
        return document, captured.err

    local, _ = rows()
    on_ray, err = rows("--backend", "ray", "--actors", "3")

    def verdicts(document: dict) -> list[tuple]:
        return [(p["name"], p["verdict"], sorted({f["code"] for f in p["findings"]})) for p in document["problems"]]

    assert verdicts(on_ray) == verdicts(local)
    assert [v[1] for v in verdicts(local)] == ["verified", "rejected", "rejected"]
    assert on_ray["run"]["backend"] == "ray" and on_ray["run"]["parallel"] == 3
    assert local["run"]["backend"] == "local" and local["run"]["parallel"] == 1
    assert "3 of 3 done" in err


def test_optimize_over_ray_runs_one_expansion_per_actor_and_replays_in_parallel(local_ray, tmp_path: Path, capsys,
                                                                               monkeypatch):
    """`kernel-lsp optimize --backend ray --actors 2`: two expansions at once, each verifying its candidate on an
    actor; then --replay re-verifies the pass's candidates over the pool."""
    from kernel_lsp.agent.trajectory import read_trajectory
    from kernel_lsp.cli import main
    from tests.agent.fake_api import FakeMessagesApi, text_turn
    from tests.agent.test_loop import FAST, SLOW, problem, write_and_verify

    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(tmp_path / "cache"))
    file = problem(tmp_path, SLOW)
    faster = FAST.replace("4096", "2048")
    script = [write_and_verify(FAST), write_and_verify(faster)] + [text_turn("no more ideas")] * 6
    cpu = ["--device", "cpu", "--trials", "2", "--calls", "5", "--baselines", "eager"]
    with FakeMessagesApi(script) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        status = main(["optimize", str(file), "--reference", str(tmp_path / "ref.py"), "--format", "json",
                       "--backend", "ray", "--actors", "2", *cpu])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    document = json.loads(captured.out)
    assert "2 expansions at once" in captured.err
    assert sorted(a["outcome"].split()[0] for a in document["attempts"]) == ["verified"] * 3
    events = read_trajectory(Path(document["trajectory_path"]))
    assert {e.get("expansion") for e in events if e["kind"] == "tool_call"} == {1, 2}

    assert main(["optimize", str(file), "--replay", document["trajectory_path"], "--backend", "ray",
                 "--actors", "2", *cpu]) == 0
    out = capsys.readouterr().out
    assert "#0: verified" in out and "#1: verified" in out and "#2: verified" in out
