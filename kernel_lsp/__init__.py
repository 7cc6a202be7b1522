"""kernel-lsp: a language server and agent daemon for GPU kernel authors."""

__version__ = "0.1.0"
