"""`servelab profile show` fits 80 columns without cutting a number."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from calibration.profile import builtin_profiles, load_profile, profile_summary
from servelab.calibrate import _ms, show


@pytest.mark.parametrize("name", ["minilm-cpu", "mlp-cpu"])
def test_every_median_is_printed_whole_at_80_columns(name: str) -> None:
    profile = load_profile(f"builtin:{name}")
    out = io.StringIO()
    show(profile, Console(file=out, width=80, color_system=None))
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines() if not line.startswith("fit:")) <= 80
    rows = [line.split() for line in text.splitlines()]
    for row in profile_summary(profile):
        printed = next(r for r in rows if r[:2] == [str(row["batch_size"]), str(row["n"])])
        assert printed[2] == _ms(row["median_ms"])  # the whole median, on the size's row


def test_ms_keeps_four_significant_figures() -> None:
    assert [_ms(v) for v in (9.7114, 13.123, 256.54, 1211.96)] == ["9.711", "13.12", "256.5",
                                                                    "1212"]
    assert builtin_profiles()
