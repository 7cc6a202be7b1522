"""The plumbing of kernel-lsp's child processes, shared by the worker's sandbox and the candidate's process:
frames on pipes, how an exception ended a run, confinement (Landlock, seccomp) and the allow-listed
environment. Stdlib and msgpack only."""
