"""Bad input gets one clear line naming the field, a non-zero exit and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servelab.cli import app

GOOD = {
    "seed": 1,
    "service": {"kind": "constant", "ms": 1},
    "workload": {"kind": "poisson", "rate_rps": 100, "n_requests": 50},
    "policy": {"kind": "greedy", "max_batch_size": 4},
}


def write(tmp_path: Path, data: object, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def with_(section: str, **changes: object) -> dict:
    data = json.loads(json.dumps(GOOD))
    if section:
        data[section] = {**data.get(section, {}), **changes}
    else:
        data.update(changes)
    return data


def bad_profile(tmp_path: Path) -> dict:
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"schema_version": 1, "batch_sizes": [1, 2],
                                "samples_s": {"1": [0.001, 0.002]}}))
    return with_("", service={"kind": "profile", "path": str(prof)})


def wrong_schema_profile(tmp_path: Path) -> dict:
    prof = tmp_path / "old.json"
    prof.write_text(json.dumps({"schema_version": 99, "samples_s": {"1": [0.001]}}))
    return with_("", service={"kind": "profile", "path": str(prof)})


def malformed_csv(tmp_path: Path) -> dict:
    f = tmp_path / "t.csv"
    f.write_bytes(b"TIMESTAMP\n\xff\xfe garbage")
    return with_("", workload={"kind": "trace", "path": str(f)})


CASES = [
    ("unknown policy kind", lambda t: with_("policy", kind="magic"), "policy.kind"),
    ("unknown workload kind", lambda t: with_("workload", kind="flood"), "workload.kind"),
    ("unknown service kind", lambda t: with_("", service={"kind": "quantum"}), "service.kind"),
    ("negative rate", lambda t: with_("workload", rate_rps=-5), "workload.rate_rps"),
    ("zero batch", lambda t: with_("policy", max_batch_size=0), "policy.max_batch_size"),
    ("bad timer", lambda t: with_("", policy={"kind": "dynamic", "timer": "later"}),
     "policy.timer"),
    ("typo key", lambda t: with_("policy", max_batch=3), "policy.max_batch"),
    ("unbounded workload", lambda t: with_("", workload={"kind": "poisson", "rate_rps": 1}),
     "duration_s"),
    ("bad discipline", lambda t: with_("", queue={"discipline": "lifo"}), "queue.discipline"),
    ("bad routing", lambda t: with_("", routing="nearest", replicas=2), "routing"),
    ("zero replicas", lambda t: with_("", replicas=0), "replicas"),
    ("missing trace", lambda t: with_("", workload={"kind": "trace", "path": "/no/such.csv"}),
     "workload.path"),
    ("malformed csv", malformed_csv, "workload"),
    ("missing profile file", lambda t: with_("", service={"kind": "profile",
                                                          "path": "/no/profile.json"}),
     "service.path"),
    ("unknown builtin profile", lambda t: with_("", service={"kind": "profile",
                                                             "path": "builtin:nope"}),
     "service.path"),
    ("profile missing batch sizes", bad_profile, "batch_sizes"),
    ("profile wrong schema", wrong_schema_profile, "schema_version"),
    ("slo policy without slo", lambda t: with_("", policy={"kind": "slo"}), "slo_ms"),
    ("warm-up as long as the run", lambda t: with_("", warmup_s=5,
                                                   workload={"kind": "poisson", "rate_rps": 5,
                                                             "duration_s": 5}),
     "warmup_s"),
    ("mmpp one state", lambda t: with_("", workload={"kind": "mmpp", "rates_rps": [5],
                                                     "mean_dwell_s": 1, "duration_s": 1}),
     "workload.rates_rps"),
    ("batch beyond profile", lambda t: with_("", service={"kind": "profile"},
                                             policy={"kind": "greedy",
                                                     "max_batch_size": 500},
                                             workload={"kind": "poisson", "rate_rps": 5000,
                                                       "n_requests": 3000}),
     "outside the measured range"),
    ("not a mapping", lambda t: "- just\n- a list\n", "mapping"),
    ("invalid yaml", lambda t: "a: [unclosed\n", "YAML"),
]


@pytest.mark.parametrize(("label", "make", "field"), CASES, ids=[c[0] for c in CASES])
def test_cli_bad_input_is_one_clear_line(tmp_path, label, make, field) -> None:
    path = write(tmp_path, make(tmp_path))
    result = CliRunner().invoke(app, ["simulate", path, "-q"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert field in result.output, result.output
    assert result.output.strip().startswith("error:")


def test_bad_override_and_missing_file(tmp_path) -> None:
    path = write(tmp_path, GOOD)
    for args, text in [(["simulate", path, "--set", "policy.max_batch_size"], "KEY=VALUE"),
                       (["simulate", path, "--set", "policy.max_batch_size=-1"],
                        "policy.max_batch_size"),
                       (["simulate", str(tmp_path / "nope.yaml")], "not found"),
                       (["simulate", "builtin:nope"], "unknown builtin")]:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and text in result.output, (args, result.output)


def test_console_script_exits_nonzero_without_traceback(tmp_path) -> None:
    path = write(tmp_path, with_("workload", rate_rps=-1))
    proc = subprocess.run([sys.executable, "-m", "servelab.cli", "simulate", path],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "workload.rate_rps" in proc.stderr
