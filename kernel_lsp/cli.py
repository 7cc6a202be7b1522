"""kernel-lsp's command line: builds the parser from the commands (kernel_lsp/commands/, one module each) and runs
the one asked for."""

from __future__ import annotations

import argparse
import logging
import sys

from kernel_lsp import __version__
from kernel_lsp.commands import bench, campaign, check, doctor, optimize, profile, sanitize, serve, verify, worker
from kernel_lsp.commands.shared import EXIT_INTERRUPTED, EXIT_USAGE
from kernel_lsp.findings import secrets_held

COMMANDS = (serve, check, worker, doctor, verify, bench, profile, sanitize, optimize, campaign)  # in help order


def main(argv: list[str] | None = None) -> int:
    """Runs the command asked for; Ctrl-C ends any of them with one line and 130, never a traceback (the command's
    own clean-up, a worker shut down included, has run by then: asyncio.run cancels the work and waits for it).
    The credentials the command may use (findings.SECRET_VARIABLES) are held out of os.environ while it runs."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level, getattr(args, "log_file", None))
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        # the API key and the worker's token leave os.environ for the command's lifetime: no child inherits them
        with secrets_held():
            return args.run(args)
    except KeyboardInterrupt:
        print(f"kernel-lsp {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernel-lsp", description="Language server and checks for GPU kernels.")
    parser.add_argument("--version", action="version", version=f"kernel-lsp {__version__}")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="what the log (stderr, or serve --log-file) holds")
    sub = parser.add_subparsers(dest="command")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def setup_logging(level: str, log_file: str | None) -> None:
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    logging.basicConfig(level=level, handlers=[handler], format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    logging.getLogger("pygls").setLevel(max(logging.WARNING, logging.getLevelName(level)))  # it logs every message


if __name__ == "__main__":
    sys.exit(main())
