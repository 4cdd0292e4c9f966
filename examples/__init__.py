"""Runnable examples; each has a --quick mode that the tests run."""
