"""Where the Anthropic API key and endpoint come from (the model client and every command that starts a pass)."""

from __future__ import annotations

from kernel_lsp.findings import secret_variable

API_KEY_ENV, BASE_URL_ENV = "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"


def api_key() -> str | None:
    """The Anthropic API key of the environment. A command (kernel_lsp.cli.main) holds it out of os.environ, so the
    worker, the compilers and the candidates they run never inherit it; this reads it from where it is held
    (findings.secret_variable), as often as asked."""
    return secret_variable(API_KEY_ENV)
