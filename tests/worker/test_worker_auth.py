"""Every socket asks for the token, unix sockets included: a listening worker given no token makes one, writes it
(mode 0600) where its clients look, and refuses, without dying, any connection that does not present it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.worker import protocol
from kernel_lsp.worker.client import WorkerClient, WorkerUnavailable
from kernel_lsp.worker.protocol import ConnectionClosed, Job

NOOP = Job("noop", {}, {}, "")


async def listening(address: str, env: dict[str, str], ready: Path | None) -> subprocess.Popen:
    """`kernel-lsp worker --listen ADDRESS`, once it accepts connections (and, when `ready` is named, that file
    exists: the token file, written before the socket is)."""
    environment = {k: v for k, v in os.environ.items() if k != "KERNEL_LSP_TOKEN"}
    process = subprocess.Popen([sys.executable, "-m", "kernel_lsp", "worker", "--listen", address],
                               env={**environment, **env}, stderr=subprocess.PIPE)
    for _ in range(300):
        if process.poll() is not None:
            break
        if ready is None or ready.exists():
            try:
                _reader, writer = await open_raw(address)
                writer.close()
                return process
            except OSError:
                pass
        await asyncio.sleep(0.1)
    process.kill()
    raise AssertionError(f"worker did not listen on {address}: {process.stderr.read().decode()}")


async def open_raw(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if address.startswith("unix:"):
        return await asyncio.open_unix_connection(address[5:])
    host, _, port = address[4:].rpartition(":")
    return await asyncio.open_connection(host, int(port))


async def hello_answer(address: str, token: str | None) -> tuple[dict, bool]:
    """The worker's answer to a hello with `token`, and whether it then closed the connection."""
    reader, writer = await open_raw(address)
    try:
        await protocol.write_message(writer, protocol.hello("raw test client", token))
        answer = await protocol.read_message(reader, protocol.DEFAULT_MAX_FRAME)
        if answer["kind"] == "welcome":
            return answer, False
        try:
            await asyncio.wait_for(protocol.read_message(reader, protocol.DEFAULT_MAX_FRAME), 10)
            closed = False
        except (ConnectionClosed, ConnectionError):
            closed = True
        except TimeoutError:
            closed = False
        return answer, closed
    finally:
        writer.close()


def stop(process: subprocess.Popen) -> None:
    """Ctrl-C: the worker's clean-up runs (its token file removed)."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def refused_then_served(address: str, token: str, process: subprocess.Popen) -> None:
    for presented in (None, "wrong-" + token, ""):
        answer, closed = await hello_answer(address, presented)
        assert (answer["kind"], answer["code"]) == ("error", "auth-failed"), answer
        assert "token" in answer["message"] and closed
        with pytest.raises(WorkerUnavailable, match="auth-failed"):
            await WorkerClient(address=address, token=presented or "nope")._connected()
    assert process.poll() is None  # refusals never kill the worker
    answer, _ = await asyncio.wait_for(hello_answer(address, token), 30)
    assert answer["kind"] == "welcome"
    client = WorkerClient(address=address, token=token)
    try:
        assert (await client.run(NOOP)).status == "ok"
    finally:
        await client.close()


async def test_a_unix_socket_without_a_given_token_makes_one_and_asks_for_it(tmp_path: Path):
    path = tmp_path / "w.sock"
    token_file = Path(f"{path}.token")
    process = await listening(f"unix:{path}", {}, token_file)
    try:
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and stat.S_IMODE(path.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 32
        await refused_then_served(f"unix:{path}", token, process)
        await served_by_the_token_file(f"unix:{path}")  # no token given: the one beside the socket
    finally:
        stop(process)
    assert not token_file.exists()  # removed when the worker stops


async def test_a_unix_socket_with_a_given_token_asks_for_that_one(tmp_path: Path):
    path = tmp_path / "w.sock"
    process = await listening(f"unix:{path}", {"KERNEL_LSP_TOKEN": "given-token-5678"}, None)
    try:
        assert not Path(f"{path}.token").exists()  # the clients hold the given token: nothing written
        with pytest.raises(WorkerUnavailable, match="auth-failed"):
            await WorkerClient(address=f"unix:{path}")._connected()
        await refused_then_served(f"unix:{path}", "given-token-5678", process)
    finally:
        stop(process)


async def served_by_the_token_file(address: str) -> None:
    """A client given no token finds the one the worker made, and is served."""
    found = WorkerClient(address=address)
    try:
        assert (await found.run(NOOP)).status == "ok"
    finally:
        await found.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_tcp_on_loopback_without_a_given_token_makes_one_too(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("KERNEL_LSP_CACHE_DIR", str(tmp_path))  # the worker's and this client's cache folder
    address = f"tcp:127.0.0.1:{free_port()}"
    token_file = protocol.token_file_for(address)
    assert token_file == tmp_path / "worker-tokens" / f"tcp-127.0.0.1-{address.rsplit(':', 1)[1]}.token"
    process = await listening(address, {"KERNEL_LSP_CACHE_DIR": str(tmp_path)}, token_file)
    try:
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        await refused_then_served(address, token_file.read_text().strip(), process)
        await served_by_the_token_file(address)
    finally:
        stop(process)


def test_where_clients_look_for_a_made_token():
    assert protocol.token_file_for("unix:/run/user/1000/kl.sock") == Path("/run/user/1000/kl.sock.token")
    assert protocol.token_file_for("") is None  # the stdio worker: a pipe, no listener, no token
    assert protocol.token_file_for("tcp:10.0.0.5:7777") is None  # a remote worker: the token is given on both sides
    assert protocol.token_file_for("tcp:[::1]:7777").name == "tcp-__1-7777.token"
