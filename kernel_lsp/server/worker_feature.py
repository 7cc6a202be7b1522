"""The worker as the server sees it: started on the first job that needs it, its state sent to the client.

Clients receive `kernelLsp/workerStatus` notifications ({state, address, gpu, driver, memoryFreeMiB,
busy, runningJobs, restarts, message}) whenever the state changes, and can ask for it (starting the
worker) with the `kernel-lsp.workerStatus` command.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable

from lsprotocol import types

from kernel_lsp.config import Settings
from kernel_lsp.process.namespaces import nvidia_device_present
from kernel_lsp.server.feature import Feature
from kernel_lsp.server.settings import SettingsManager
from kernel_lsp.worker.backend import JobRunner, make_runner, runner_config
from kernel_lsp.worker.client import WorkerStatus, WorkerUnavailable
from kernel_lsp.worker.daemon import UsageError, read_token

if TYPE_CHECKING:
    from kernel_lsp.server.language_server import KernelLanguageServer

log = logging.getLogger(__name__)
STATUS_NOTIFICATION = "kernelLsp/workerStatus"
STATUS_COMMAND = "kernel-lsp.workerStatus"


class WorkerFeature(Feature):
    def __init__(self, notify: Callable[[str, Any], None], tell_user: Callable[[str], None],
                 settings: SettingsManager | None = None) -> None:
        self._notify = notify
        self._settings = settings  # for the status command
        self._tell_user = tell_user
        self._client: JobRunner | None = None
        self._config: tuple | None = None

    def client(self, settings: Settings) -> JobRunner:
        """The job runner for these settings: a worker client, or the Ray backend when `backend` is "ray" (a new
        one, and the old one closed, when they change)."""
        config = runner_config(settings)
        if self._client is None or config != self._config:
            if self._client is not None:
                log.info("worker settings changed; closing the old worker connection")
                asyncio.ensure_future(self._client.close())
            token = self._token(settings) if settings.worker.backend == "local" else None
            self._client = make_runner(settings, token=token, on_status=self._status_changed,
                                       on_message=self._tell_user)
            self._config = config
        return self._client

    def _token(self, settings: Settings) -> str | None:
        try:
            return read_token(settings.worker.token_file or None)
        except (OSError, UsageError) as exc:
            self._tell_user(f"kernel-lsp: cannot read workerTokenFile: {exc}; connecting without a token")
            return None

    async def status(self, settings: Settings) -> dict[str, Any]:
        client = self.client(settings)
        try:
            round_trip = await client.ping()
        except WorkerUnavailable as exc:
            return {**client.status.to_dict(), "message": str(exc)}
        return {**client.status.to_dict(), "pingMs": round(round_trip * 1000, 3)}

    @property
    def known_status(self) -> WorkerStatus | None:
        """The worker's state as last seen (None before the first job); `gpu` is set once it connected."""
        return self._client.status if self._client is not None else None

    def gpu_missing(self, settings: Settings) -> bool:
        """Whether the worker is known to have no GPU, before a job finds out: the connected worker said so; before
        it connected, the worker these settings start on this machine (no `worker` address, no Ray) would find none,
        as this machine shows no GPU device. A remote worker not connected yet: not known."""
        status = self.known_status
        if status is not None and status.state == "connected":
            return not status.gpu
        local = settings.worker.backend == "local" and not settings.worker.address
        return local and not nvidia_device_present()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def commands(self) -> dict[str, Callable[[tuple[Any, ...]], Any]]:
        return {STATUS_COMMAND: lambda _args: self.status(self._settings.settings if self._settings else Settings())}

    async def shutdown(self) -> None:
        await self.close()

    def _status_changed(self, status: WorkerStatus) -> None:
        if self._client is not None and status is not self._client.status:
            return  # a replaced client closing late ("stopped") says nothing about the worker in use now
        self._notify(STATUS_NOTIFICATION, status.to_dict())


def setup(server: KernelLanguageServer) -> WorkerFeature:
    return WorkerFeature(notify=server.protocol.notify, tell_user=lambda m: server.show(m, types.MessageType.Warning),
                         settings=server.settings)
