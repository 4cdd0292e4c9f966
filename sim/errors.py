"""Errors of the serving core: a policy that breaks the contract, a run that loses requests.

They live in a module of their own, which the optional compiled build (``servelab compile``)
leaves interpreted: mypyc cannot compile a subclass of ``RuntimeError``.
"""

from __future__ import annotations


class PolicyError(RuntimeError):
    """A policy returned a decision that breaks the contract (a bug in the policy)."""


class InvariantError(RuntimeError):
    """Requests were lost or double-counted (a bug in a driver or the core)."""
