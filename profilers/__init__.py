"""Parsers and rules for what compilers and profilers report about kernels (ptxas, sass, ncu, nvml, roofline)."""
