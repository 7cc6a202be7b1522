"""Verification: correctness against a reference, integrity checks, timing; runs inside the worker."""
