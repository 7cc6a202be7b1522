"""The job kinds a candidate goes through, one module each, shared by the server, the CLI, the agent and the worker.

A kind's module holds both sides: the function that builds its job from a candidate (its options are
contracts/options.py's: typed, defaults defined once; its files are gathered by jobs/files.py, from disk or from
unsaved texts, both in lower layers, so every layer may use them), the typed
outcome of a finished job (verdict or report, one-line summary, findings), and `handle`, the worker's handler,
registered by kind in kernel_lsp/commands/worker.py. docs/ARCHITECTURE.md, "Adding a job kind", walks through one.

Nothing is imported here.
"""
