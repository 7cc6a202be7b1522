"""The job kinds a candidate goes through, one module each, shared by the server, the CLI, the agent and the worker.

A kind's module holds both sides: its options (kinds/options.py: typed, defaults defined once), the function that
builds its job from a candidate (the files gathered by kinds/files.py, from disk or from unsaved texts), the typed
outcome of a finished job (verdict or report, one-line summary, findings), and `handle`, the worker's handler,
registered by kind in kernel_lsp/commands/worker.py. docs/ARCHITECTURE.md, "Adding a job kind", walks through one.

Nothing is imported here: the settings import kinds.options, below everything else.
"""
