"""The verify job and KernelBench's metrics for `kernel-lsp bench DIR` (the command: kernel_lsp/commands/bench.py).

candidates  find the candidates in a folder, pair each with its reference, build its "verify" job
metrics     per-problem results -> fast_p, geometric means, counts (pure functions, no torch)
report      the text table, bench.json and a self-contained bench.html with inline SVG plots
"""
