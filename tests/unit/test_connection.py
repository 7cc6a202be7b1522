"""The LSP connection (kernel_lsp/server/connection.py) without a client: which JSON values it answers -32600, and
that the server's loop ends even when a task cannot be cancelled."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from kernel_lsp.server import connection
from kernel_lsp.server.connection import invalid_requests, run_server
from kernel_lsp.server.setup import create_server


@pytest.mark.parametrize("value, replies", [
    ({"jsonrpc": "2.0", "id": 1, "method": "m"}, []),
    ({"jsonrpc": "2.0", "id": "a", "method": "m", "params": {}}, []),
    ({"jsonrpc": "2.0", "method": "m"}, []),
    ({"jsonrpc": "2.0", "id": 3, "result": None}, []),
    ({"jsonrpc": "2.0", "id": 3, "error": {"code": 1, "message": "no"}}, []),
    ([{"jsonrpc": "2.0", "id": 1, "method": "m"}, {"jsonrpc": "2.0", "method": "n"}, {"jsonrpc": "2.0", "id": 2,
      "method": "m"}], [(1, "a batch (a JSON array): LSP has none"), (2, "a batch (a JSON array): LSP has none")]),
    ([], [(None, "a batch (a JSON array): LSP has none")]),
    ("hello", [(None, '"hello" instead of an object')]),
    (None, [(None, "null instead of an object")]),
    ({"jsonrpc": "2.0", "id": 7}, [(7, 'no "method"')]),
    ({"id": 7, "method": "m"}, [(7, 'no "jsonrpc"')]),
    ({"jsonrpc": "1.0", "id": 7, "method": "m"}, [(7, '"jsonrpc" is "1.0", not "2.0"')]),
    ({"jsonrpc": "2.0", "method": "m", "params": None, "jsonrpc2": 1, "id": 7.5},
     [(7.5, '"id" is 7.5, neither an integer nor a string')]),
    ({"jsonrpc": "2.0", "id": True, "method": "m"}, [(True, '"id" is true, neither an integer nor a string')]),
    ({"jsonrpc": "2.0", "id": None, "method": "m"}, [(None, '"id" is null, neither an integer nor a string')]),
    ({"jsonrpc": "2.0", "id": [1], "method": "m"}, [([1], '"id" is [1], neither an integer nor a string')]),
    ({"jsonrpc": "2.0", "id": 8, "method": 3}, [(8, '"method" is 3, not a string')]),
    ({"id": 8, "result": 1}, [(None, 'a response without "jsonrpc": "2.0"')]),
])
def test_invalid_requests_are_those_json_rpc_calls_invalid(value, replies) -> None:
    assert invalid_requests(value) == replies


def test_the_server_ends_even_when_a_task_cancelled_at_exit_never_finishes(monkeypatch, caplog) -> None:
    """A subprocess being started when `exit` comes (a compile on a didOpen just before): cancelled before its pipes
    are connected, CPython 3.11 never finishes it, and asyncio.run would keep the process alive after `exit` for
    good. run_server gives it EXIT_GRACE_S, logs it, and returns exit's status."""
    monkeypatch.setattr(connection, "EXIT_GRACE_S", 0.5)
    server = create_server()

    async def serving() -> int:
        asyncio.ensure_future(asyncio.create_subprocess_exec(sys.executable, "-c", "pass",
                                                             stdout=asyncio.subprocess.PIPE))
        await asyncio.sleep(0)  # it has spawned; its pipes connect on a later turn of the loop
        raise SystemExit(3)  # as pygls's `exit` handler ends the loop

    statuses: list[int] = []
    ending = threading.Thread(target=lambda: statuses.append(run_server(server, serving())), daemon=True)
    ending.start()
    ending.join(60)  # a guard against the hang this is about, not a measure: it returns within a second
    assert statuses == [3]
    assert [r.getMessage() for r in caplog.records if "did not stop" in r.getMessage()] == [
        "exiting with 1 task(s) that did not stop within 0.5 s: create_subprocess_exec"]
