"""The `kernel-lsp` commands, one module each: `add_parser(sub)` adds its subcommand and sets `run`, the function
that runs it (`run(args) -> exit status`); `shared.py` holds what several of them use. Heavy imports (torch, the
SDK, pygls) happen inside `run`, so building the parser stays fast. cli.py lists them in help order."""
