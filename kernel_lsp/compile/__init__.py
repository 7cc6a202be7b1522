"""nvcc and host-compiler runs for compile diagnostics, and the mapping of their output to findings."""
