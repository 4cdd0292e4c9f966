"""Calibration: measuring real models (batch latencies, LLM step times, cold starts) and the
profile formats the measurements are stored in (:mod:`calibration.profile`,
:mod:`calibration.step_profile`).

Only :mod:`calibration.profile` is imported eagerly; torch is imported lazily by the runners.
The commands that drive a calibration live in :mod:`servelab.calibrate` and
:mod:`servelab.calibrate_llm`.
"""

from calibration.profile import (
    SCHEMA_VERSION,
    LatencyProfile,
    ProfileError,
    builtin_profiles,
    load_profile,
    profile_summary,
)

__all__ = [
    "SCHEMA_VERSION",
    "LatencyProfile",
    "ProfileError",
    "builtin_profiles",
    "load_profile",
    "profile_summary",
]
