"""The one base class of the errors a user can fix (bad input, a missing file, a wrong flag).

Every such error names the field or flag and what is allowed. The CLI prints it as one line
with exit code 2; any other exception is a bug and is reported as one (exit 3).
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input: the message names the field and what is allowed."""
