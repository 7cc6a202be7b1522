"""`kernel-lsp worker`: a GPU worker on stdio (one client: the server starts it so) or listening (unix:PATH or
tcp:HOST:PORT) for clients holding the token."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from kernel_lsp.commands.shared import EXIT_OK, EXIT_USAGE, private_stdout


def add_parser(sub: Any) -> None:
    worker = sub.add_parser("worker", help="run a GPU worker (the server starts one itself; use --listen on a GPU "
                            "server)")
    where = worker.add_mutually_exclusive_group()
    where.add_argument("--stdio", action="store_true", help="serve one client on stdin/stdout (the default)")
    where.add_argument("--listen", metavar="unix:PATH|tcp:HOST:PORT", help="listen for clients")
    worker.add_argument("--token-file", help="file holding the token clients must present (else $KERNEL_LSP_TOKEN)")
    worker.add_argument("--max-frame-mib", type=int, default=64, help="largest message accepted (MiB)")
    worker.add_argument("--idle-exit", type=float, metavar="SECONDS", help="with --listen: exit once no client has "
                        "been connected for this long (the commands' shared worker is started so)")
    worker.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kernel_lsp.worker.daemon import UsageError, WorkerDaemon, parse_listen, read_token, run_listener, run_stdio

    try:
        token = read_token(args.token_file)
        if args.listen:
            parse_listen(args.listen, token)  # refuse a bad address before anything starts
        if args.idle_exit is not None and (not args.listen or args.idle_exit <= 0):
            raise UsageError("--idle-exit takes a positive number of seconds, with --listen")
    except (UsageError, OSError) as exc:
        print(f"kernel-lsp worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    daemon = WorkerDaemon(token=token, max_frame=args.max_frame_mib * 2**20, single_client=not args.listen,
                          handlers=job_handlers())
    if args.listen:
        try:
            asyncio.run(run_listener(daemon, args.listen, args.idle_exit))
        except (UsageError, OSError) as exc:  # its token file or its socket could not be made
            print(f"kernel-lsp worker: {exc}", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK
    protocol_out = private_stdout()
    asyncio.run(run_stdio(daemon, sys.stdin, protocol_out))
    return EXIT_OK


def job_handlers() -> dict:
    """The job kinds this worker runs: its own, and the candidate's kinds of kernel_lsp/kinds (one line per kind)."""
    from kernel_lsp.kinds import cute_dsl, profile, sanitize, verify
    from kernel_lsp.worker.jobs import JOB_KINDS

    return {**JOB_KINDS, verify.KIND: verify.handle, profile.KIND: profile.handle, cute_dsl.KIND: cute_dsl.handle,
            sanitize.KIND: sanitize.handle}
