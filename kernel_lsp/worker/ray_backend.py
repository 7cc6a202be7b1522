"""The worker backend on a Ray cluster: the same jobs as the local worker, run by a pool of long-lived actors.

Each actor (`WorkerActor`) holds one warm kernel-lsp worker (its own `kernel-lsp worker --stdio` process on the
actor's node: torch imported, CUDA initialised, builds cached) and runs the jobs it is handed through it, so a job
gives the same verdict, findings and codes as on the local backend. On a cluster with GPUs there is one actor per
GPU (`num_gpus=1`: Ray sets its CUDA_VISIBLE_DEVICES, and the actor runs one job at a time, so two timing runs never
share a GPU); without GPUs, `actors` CPU actors (the Triton interpreter path).

`RayBackend` is what the commands and the server use instead of a WorkerClient (the same run / ping / close / status
and a `capacity`, the number of jobs worth running at once). A job waits for an idle actor (queued jobs are plain
asyncio waits: cancelling one means it never reaches Ray), then streams from the actor's `run` generator: progress
messages, then the result. Cancelling a running job cancels the actor task (an async actor: the asyncio task is
cancelled, and the WorkerClient inside cancels the job on its worker, which kills the sandbox child). An actor that
dies (killed, its node lost) is replaced, and the job it ran is retried on the next idle actor, at most
`max_retries` times.

`ray` is imported only here and only when the backend starts (`pip install 'kernel-lsp[ray]'`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel_lsp.contracts.actor_info import ActorInfo
from kernel_lsp.contracts.codec import ContractError, Wire, decode, encode
from kernel_lsp.contracts.job_metrics import DeviceInfoMetrics
from kernel_lsp.worker import protocol
from kernel_lsp.worker.client import WorkerStatus, WorkerUnavailable
from kernel_lsp.worker.protocol import Job, Result

log = logging.getLogger(__name__)

DEFAULT_CPU_ACTORS = 2
READY_TIMEOUT_S = 300.0  # an actor's worker: started, torch imported, CUDA up
RESULT_GRACE_S = 60.0  # beyond the job's own time limit, before the actor itself counts as hung
PASSED_ENV = ("TRITON_INTERPRET", "KERNEL_LSP_CACHE_DIR")  # set here, they are set for the actors' workers too


class WorkerActor:
    """Runs in a Ray worker process; `ray.remote` is applied when the backend starts."""

    def __init__(self, job_timeout_s: float, max_frame: int) -> None:
        from kernel_lsp.worker.client import WorkerClient

        self._client = WorkerClient(job_timeout_s=job_timeout_s, max_frame=max_frame)

    async def ready(self) -> Wire:
        """Starts the worker and waits for its warm-up; what the actor runs on (an ActorInfo, encoded)."""
        await self._client.ping()
        info = await self._client.run(Job("device-info", {}, {}, "device-info"))
        problem = info.error
        try:
            facts = decode(DeviceInfoMetrics, info.metrics) if info.status == "ok" else None
        except ContractError as exc:  # its worker is of another version
            facts, problem = None, f"the worker's device-info does not match this version's contract: {exc}"
        name = ((facts.device if facts else None) or {}).get("name")
        return encode(ActorInfo(socket.gethostname(), os.getpid(), name if isinstance(name, str) else None,
                                bool(facts and facts.cuda_available), problem,
                                os.environ.get("CUDA_VISIBLE_DEVICES")))

    async def run(self, job_wire: dict[str, Any], timeout_s: float | None):
        """A streaming generator: ("progress", message, fraction)... then ("result", result_wire)."""
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(self._client.run(
            Job.from_wire(job_wire), progress=lambda message, fraction: queue.put_nowait(
                ("progress", message, fraction)), timeout_s=timeout_s))
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                while not queue.empty():
                    yield queue.get_nowait()
                yield ("result", task.result().to_wire(0))
                return
        finally:
            if not task.done():  # cancelled: the job is cancelled on the worker before this task ends
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        await self._client.close()


@dataclass
class _Actor:
    handle: Any
    number: int
    info: ActorInfo | None = None  # what it said once ready
    running: str | None = None  # the content hash of the job it runs


class RayBackend:
    def __init__(self, address: str = "", actors: int = 0, job_timeout_s: float = 600.0,
                 max_frame: int = protocol.DEFAULT_MAX_FRAME, max_retries: int = 2,
                 on_status: Callable[[WorkerStatus], None] | None = None,
                 on_message: Callable[[str], None] | None = None,
                 init_options: dict[str, Any] | None = None, use_gpus: bool | None = None) -> None:
        """address: "" starts a Ray instance in this process (or joins the one $RAY_ADDRESS names); "auto" or
        HOST:PORT / ray://HOST:PORT connects to a running cluster. actors: 0 picks one per GPU, else
        DEFAULT_CPU_ACTORS; a number asks for that many (on GPUs: at most one per GPU). use_gpus: None, GPU actors
        when the cluster has GPUs; False, CPU actors anyway (jobs that run on the CPU: --device cpu)."""
        self.address = address
        self.requested = actors
        self.job_timeout_s = job_timeout_s
        self.max_frame = max_frame
        self.max_retries = max_retries
        self.init_options = init_options or {}
        self.use_gpus = use_gpus
        self.status = WorkerStatus(address=f"ray:{address or 'local'}")
        self.retried = 0  # jobs sent again after their actor died
        self._on_status = on_status or (lambda s: None)
        self._on_message = on_message or (lambda m: None)
        self._ray: Any = None
        self._started_ray = False
        self._actor_class: Any = None
        self._gpus = 0
        self._actors: list[_Actor] = []
        self._idle: asyncio.Queue[_Actor] | None = None
        self._replacing = 0
        self._numbers = 0
        self._start_lock = asyncio.Lock()
        self._closed = False

    # --- what WorkerClient offers -------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Jobs worth running at once: one per actor (before the start: what will be asked for)."""
        return len(self._actors) or self.requested or 1

    @property
    def actors(self) -> list[_Actor]:
        return list(self._actors)

    async def run(self, job: Job, progress: Callable[[str, float | None], None] | None = None,
                  timeout_s: float | None = None) -> Result:
        await self._started()
        limit = self.job_timeout_s if timeout_s is None else timeout_s
        attempts = 0
        self._set_status(running_jobs=self.status.running_jobs + 1)
        try:
            while True:
                actor = await self._take()
                try:
                    result = await self._run_on(actor, job, progress, limit)
                except _ActorLost as lost:
                    attempts += 1
                    self._lost(actor, str(lost))
                    if attempts > self.max_retries:
                        return Result("lost", [], {}, {}, f"the job's actor was lost {attempts} times; last: {lost}")
                    self.retried += 1
                    if progress is not None:
                        progress(f"actor {actor.number} was lost ({lost}); retrying on another actor", None)
                    continue
                self._give_back(actor)
                return result
        finally:
            self._set_status(running_jobs=max(self.status.running_jobs - 1, 0))

    async def ping(self) -> float:
        """Starts the pool (when not started) and times one no-op job through an actor."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await self.run(Job("noop", {}, {}, "noop"))
        if result.status != "ok":
            raise WorkerUnavailable(f"ray: a no-op job ended '{result.status}': {result.error}")
        return loop.time() - started

    async def close(self) -> None:
        self._closed = True
        actors, self._actors = self._actors, []
        if self._ray is not None:
            for actor in actors:
                try:
                    self._ray.kill(actor.handle)
                except Exception:  # already gone
                    pass
            if self._started_ray:
                await asyncio.to_thread(self._ray.shutdown)
                self._started_ray = False
        self._set_status(state="stopped", running_jobs=0)

    # --- starting -----------------------------------------------------------------------------------

    async def _started(self) -> None:
        if self._closed:
            raise WorkerUnavailable("ray: the backend was closed")
        async with self._start_lock:
            if self._idle is not None:
                return
            self._set_status(state="starting", message=None)
            try:
                await asyncio.to_thread(self._init_ray)
            except Exception as exc:
                message = f"kernel-lsp: the Ray cluster ({self.address or 'local'}) is unavailable: {exc}"
                self._set_status(state="failed", message=message)
                raise WorkerUnavailable(message) from exc
            count = self.requested or self._gpus or DEFAULT_CPU_ACTORS
            if self._gpus and count > self._gpus:  # an actor per GPU: more would wait for a GPU forever
                self._on_message(f"kernel-lsp: the Ray cluster has {self._gpus} GPU(s): {self._gpus} actor(s), "
                                 f"not {count}")
                count = self._gpus
            self._idle = asyncio.Queue()
            ready = await asyncio.gather(*(self._new_actor() for _ in range(count)), return_exceptions=True)
            problems = [str(r) for r in ready if isinstance(r, BaseException)]
            if not self._actors:
                self._idle = None
                message = f"kernel-lsp: no Ray actor could start: {problems[0] if problems else 'unknown'}"
                self._set_status(state="failed", message=message)
                raise WorkerUnavailable(message)
            if problems:
                self._on_message(f"kernel-lsp: {len(problems)} of {count} Ray actors did not start: {problems[0]}")
            self._set_status(state="connected", gpu=self._describe(), message=None)

    def _init_ray(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("the Ray backend needs ray: pip install 'kernel-lsp[ray]'") from exc
        self._ray = ray
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                       "logging_level": logging.WARNING, **self.init_options}
            if self.address:
                options["address"] = self.address
            elif not os.environ.get("RAY_ADDRESS") and self.requested:
                options.setdefault("num_cpus", max(os.cpu_count() or 1, self.requested))
            ray.init(**options)
            self._started_ray = True
        self._gpus = int(ray.cluster_resources().get("GPU", 0)) if self.use_gpus is not False else 0
        self._actor_class = ray.remote(WorkerActor)

    async def _new_actor(self) -> _Actor:
        self._numbers += 1
        options: dict[str, Any] = {"num_gpus": 1, "num_cpus": 1} if self._gpus else {"num_cpus": 1}
        env = {name: os.environ[name] for name in PASSED_ENV if os.environ.get(name)}
        if env:
            options["runtime_env"] = {"env_vars": env}
        handle = self._actor_class.options(**options, max_concurrency=8).remote(self.job_timeout_s, self.max_frame)
        actor = _Actor(handle, self._numbers)
        try:
            said = await asyncio.wait_for(handle.ready.remote(), READY_TIMEOUT_S)  # an ObjectRef is awaitable
            actor.info = decode(ActorInfo, said)  # a ContractError: an actor of another install did not start
        except BaseException:
            self._ray.kill(handle)
            raise
        self._actors.append(actor)
        assert self._idle is not None
        self._idle.put_nowait(actor)
        log.info("ray: actor %d ready on %s (pid %s, GPU %s)", actor.number, actor.info.host, actor.info.pid,
                 actor.info.gpu or "none")
        return actor

    def _describe(self) -> str:
        infos = [a.info for a in self._actors if a.info is not None]
        gpus = sorted({info.gpu for info in infos if info.gpu})
        kind = f"GPU ({', '.join(gpus)})" if gpus else "CPU"
        hosts = len({info.host for info in infos})
        return f"{len(self._actors)} Ray {kind} actor{'s' if len(self._actors) != 1 else ''} on {hosts} " \
               f"node{'s' if hosts != 1 else ''}"

    # --- the pool -----------------------------------------------------------------------------------

    async def _take(self) -> _Actor:
        assert self._idle is not None
        while True:
            if not self._actors and not self._replacing:
                raise WorkerUnavailable("ray: every actor was lost and none could be started again")
            try:
                actor = await asyncio.wait_for(self._idle.get(), timeout=1.0)
            except asyncio.TimeoutError:
                continue
            if actor in self._actors:
                return actor

    def _give_back(self, actor: _Actor) -> None:
        actor.running = None
        if actor in self._actors and self._idle is not None:
            self._idle.put_nowait(actor)

    async def _run_on(self, actor: _Actor, job: Job, progress: Callable[[str, float | None], None] | None,
                      limit: float) -> Result:
        ray = self._ray
        actor.running = job.content_hash
        stream = actor.handle.run.remote(job.to_wire(), limit)
        try:
            async with asyncio.timeout(limit + RESULT_GRACE_S):
                async for ref in stream:
                    item = await ref
                    if item[0] == "progress":
                        if progress is not None:
                            progress(item[1], item[2])
                    else:
                        return Result.from_wire(item[1])
        except asyncio.CancelledError:
            ray.cancel(stream)
            self._give_back(actor)
            raise
        except TimeoutError:
            ray.cancel(stream)
            raise _ActorLost(f"no answer {limit + RESULT_GRACE_S:g} s after the job started") from None
        except ray.exceptions.RayError as exc:  # the actor died or is unreachable (RayActorError, ...)
            raise _ActorLost(_first_line(exc)) from exc
        raise _ActorLost("the actor's stream ended without a result")

    def _lost(self, actor: _Actor, reason: str) -> None:
        """An actor that died (or hung): out of the pool, killed for good, and a new one started."""
        if actor not in self._actors:
            return
        self._actors.remove(actor)
        log.warning("ray: actor %d lost: %s", actor.number, reason)
        try:
            self._ray.kill(actor.handle)
        except Exception:
            pass
        self._set_status(restarts=self.status.restarts + 1, gpu=self._describe())
        if not self._closed:
            self._replacing += 1
            asyncio.ensure_future(self._replace())

    async def _replace(self) -> None:
        try:
            await self._new_actor()
            self._set_status(gpu=self._describe())
        except Exception as exc:
            self._on_message(f"kernel-lsp: a lost Ray actor could not be replaced: {_first_line(exc)}")
        finally:
            self._replacing -= 1

    def _set_status(self, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(self.status, key, value)
        self._on_status(self.status)


class _ActorLost(Exception):
    pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]

