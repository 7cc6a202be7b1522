"""The GPU worker: protocol, daemon, client, sandbox."""
