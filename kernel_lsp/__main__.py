"""Lets `python -m kernel_lsp` work like the `kernel-lsp` script."""
import sys

from kernel_lsp.cli import main

sys.exit(main())
