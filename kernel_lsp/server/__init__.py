"""pygls wiring only: LSP messages in, findings out as diagnostics and code lenses."""
