"""Calibration: the latency-profile format and (later) measurement of real models.

Only :mod:`calibration.profile` is imported eagerly; torch is imported lazily by the runners.
"""

from calibration.profile import (
    BUILTIN_PREFIX,
    SCHEMA_VERSION,
    LatencyProfile,
    ProfileError,
    builtin_profiles,
    load_profile,
    profile_summary,
)

__all__ = [
    "BUILTIN_PREFIX",
    "SCHEMA_VERSION",
    "LatencyProfile",
    "ProfileError",
    "builtin_profiles",
    "load_profile",
    "profile_summary",
]
