"""`kernel-lsp serve`: the language server, on stdio (the default) or TCP."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from kernel_lsp.commands.shared import EXIT_USAGE, private_stdout


def add_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the language server (stdio by default)")
    serve.add_argument("--tcp", metavar="HOST:PORT", help="listen on TCP instead of stdio")
    serve.add_argument("--log-file", help="write logs to this file instead of stderr")
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The exit status is the server's: 0 after shutdown and exit, or at the end of the input; 1 after exit
    without shutdown, or when the input ended inside a message (kernel_lsp/server/connection.py)."""
    from kernel_lsp.server.connection import serve_stdio, serve_tcp
    from kernel_lsp.server.setup import create_server

    server = create_server()
    if args.tcp:
        host, _, port = args.tcp.rpartition(":")
        if not host or not port.isdigit():
            print(f"kernel-lsp: --tcp expects HOST:PORT, got {args.tcp!r}", file=sys.stderr)
            return EXIT_USAGE
        with _big_parses_in_a_process():
            return serve_tcp(server, host, int(port))
    with _big_parses_in_a_process():
        return serve_stdio(server, sys.stdin.fileno(), private_stdout())


@contextlib.contextmanager
def _big_parses_in_a_process() -> Iterator[None]:
    """Every big Python parse of the server, on its loop or in its threads, goes to a child process
    (kernel_lsp/server/parsing.py says why)."""
    from kernel_lsp.server.parsing import ParseProcess
    from kernel_lsp.sources import offload_large_parses

    process = ParseProcess()
    offload_large_parses(process.parse)
    try:
        yield
    finally:
        offload_large_parses(None)
        process.close()
