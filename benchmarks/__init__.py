"""Runnable benchmarks; results under benchmarks/results/."""
