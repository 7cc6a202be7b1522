"""`kernel-lsp serve`: the language server, on stdio (the default) or TCP."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

from kernel_lsp.commands.shared import EXIT_OK, EXIT_USAGE, private_stdout


def add_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the language server (stdio by default)")
    serve.add_argument("--tcp", metavar="HOST:PORT", help="listen on TCP instead of stdio")
    serve.add_argument("--log-file", help="write logs to this file instead of stderr")
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kernel_lsp.server.setup import create_server

    server = create_server()
    if args.tcp:
        host, _, port = args.tcp.rpartition(":")
        if not host or not port.isdigit():
            print(f"kernel-lsp: --tcp expects HOST:PORT, got {args.tcp!r}", file=sys.stderr)
            return EXIT_USAGE
        with _interrupts_told(), _big_parses_in_a_process():
            server.start_tcp(host, int(port))
        return EXIT_OK
    with _interrupts_told(), _big_parses_in_a_process():
        server.start_io(sys.stdin.buffer, private_stdout())
    return EXIT_OK


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


@contextlib.contextmanager
def _interrupts_told() -> Iterator[None]:
    """pygls ends its loop quietly on Ctrl-C (it catches KeyboardInterrupt); raised again once it has, so that
    `serve` ends as every command does (cli.main: one line, 130) and not as a clean exit."""
    interrupted = []

    def on_interrupt(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt
