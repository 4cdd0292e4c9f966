"""The errors every part of servelab shares: bad input a user can fix, a policy that breaks
the contract, a run that loses requests.

:class:`UserError` is the one base class of the errors a user can fix (bad input, a missing
file, a wrong flag): each names the field or flag and what is allowed, and the CLI prints it
as one line with exit code 2; any other exception is a bug and is reported as one (exit 3).
It lives here, in the package that raises it most, and ``calibration`` imports it from here.

They live in a module of their own, which the optional compiled build (``servelab compile``)
leaves interpreted: mypyc cannot compile a subclass of ``RuntimeError``.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input: the message names the field and what is allowed."""


class PolicyError(RuntimeError):
    """A policy returned a decision that breaks the contract (a bug in the policy)."""


class InvariantError(RuntimeError):
    """Requests were lost or double-counted (a bug in a driver or the core)."""
