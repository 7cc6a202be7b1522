"""Scheduling of checks: per-document debounce and cancellation, bounded concurrency, the result cache."""
