"""Profiling a kernel: the "profile" job (ncu, roofline, SASS, torch profiler, NVML energy), its static variant
without a GPU (the `kernel-lsp profile` command: kernel_lsp/commands/profile.py)."""
