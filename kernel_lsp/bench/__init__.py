"""`kernel-lsp bench DIR`: verify every candidate in a folder and report KernelBench's metrics.

candidates  find the candidates in a folder, pair each with its reference, build its "verify" job
metrics     per-problem results -> fast_p, geometric means, counts (pure functions, no torch)
report      the text table, bench.json and a self-contained bench.html with inline SVG plots
command     the command itself: options, the worker, progress on stderr, exit status
"""
