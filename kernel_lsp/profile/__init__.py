"""Profiling a kernel: the "profile" job (ncu, roofline, SASS, torch profiler, NVML energy), its static variant
without a GPU, and the `kernel-lsp profile` command."""
