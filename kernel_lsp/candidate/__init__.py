"""The candidate's process and what both sides of it share, for every job that runs a candidate (verification,
profiling, sanitizing, the CuTe DSL check): the judge's handle on it (`handle.py`: start it confined, ask it, read
its answers), the process itself (`side.py`, `python -m kernel_lsp.candidate.side`), the exchange of values between
them (`exchange.py`, `device_share.py`), loading the candidate's module (`models.py`), the launch hooks installed
before its import (`interpose.py`, `prestart.py`), what is recorded and checked in it (`kernels.py`,
`integrity.py`, `ablation.py`, `shared_fill.py`) and the timing loop and input sets both sides use (`timing.py`).

It imports only the layers below it (process, sources): the judge (kernel_lsp.verify) and the profiler
(kernel_lsp.profile) use it, never the other way round.
"""
