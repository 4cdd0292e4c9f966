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


def csv_workload(text: str, **extra: object):
    def make(tmp_path: Path) -> dict:
        f = tmp_path / "trace.csv"
        f.write_text(text)
        return with_("", workload={"kind": "trace", "path": str(f), **extra})
    return make


def profile_file(text: str):
    def make(tmp_path: Path) -> dict:
        f = tmp_path / "prof.json"
        f.write_text(text)
        return with_("", service={"kind": "profile", "path": str(f)})
    return make


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
    ("unknown top-level key", lambda t: with_("", replica=2), "replica: unknown key"),
    ("rate of the wrong type", lambda t: with_("workload", rate_rps="fast"),
     "workload.rate_rps"),
    ("zero rate", lambda t: with_("workload", rate_rps=0), "workload.rate_rps"),
    ("empty rates_rps", lambda t: with_("", workload={"kind": "mmpp", "rates_rps": [],
                                                      "mean_dwell_s": 1, "duration_s": 1}),
     "workload.rates_rps"),
    ("trace with no rows", csv_workload("TIMESTAMP\n"), "workload.path"),
    ("trace unsorted", csv_workload("TIMESTAMP\n0.5\n0.2\n0.9\n"),
     "workload.timestamp_column"),
    ("trace non-numeric timestamps", csv_workload("TIMESTAMP\nabc\ndef\n"),
     "workload.timestamp_column"),
    ("trace size column with zeros", csv_workload("TIMESTAMP,n\n0.1,1\n0.2,0\n",
                                                  size_column="n"), "workload.size_column"),
    ("profile truncated", profile_file('{"schema_version": 1, "samples_s": {"1": [0.00'),
     "not valid JSON"),
    ("profile negative samples", profile_file(json.dumps({
        "schema_version": 1, "batch_sizes": [1], "samples_s": {"1": [-0.001, 0.002]}})),
     "samples must be finite and > 0"),
    ("profile non-integer batch size", profile_file(json.dumps({
        "schema_version": 1, "batch_sizes": [1.5], "samples_s": {"1.5": [0.001]}})),
     "not a batch size"),
    ("profile schema from the future", profile_file(json.dumps({
        "schema_version": 7, "batch_sizes": [1], "samples_s": {"1": [0.001]}})),
     "schema_version"),
]


@pytest.mark.parametrize(("label", "make", "field"), CASES, ids=[c[0] for c in CASES])
def test_cli_bad_input_is_one_clear_line(tmp_path, label, make, field) -> None:
    path = write(tmp_path, make(tmp_path))
    result = CliRunner().invoke(app, ["simulate", path, "-q"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert field in result.output, result.output
    assert_one_error_line(result.output)


def assert_one_error_line(output: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error:"), output


FLAG_CASES = [
    ("--set without =", ["simulate", "{path}", "--set", "policy.max_batch_size"],
     "KEY=VALUE"),
    ("--set out of range", ["simulate", "{path}", "--set", "policy.max_batch_size=-1"],
     "policy.max_batch_size"),
    ("--set on a missing path", ["simulate", "{path}", "--set", "nosuch.key=1"],
     "nosuch: unknown key"),
    ("--set through a number", ["simulate", "{path}", "--set", "seed.x=1"],
     "'seed' is not a section"),
    ("scenario file missing", ["simulate", "{tmp}/nope.yaml"], "not found"),
    ("unknown builtin scenario", ["simulate", "builtin:nope"], "unknown builtin"),
    ("grid without =", ["sweep", "{path}", "--grid", "policy.max_batch_size"], "--grid"),
    ("grid range incomplete", ["sweep", "{path}", "--grid", "policy.max_batch_size=1:"],
     "START:STOP:STEP"),
    ("grid range not numbers", ["sweep", "{path}", "--grid", "policy.max_batch_size=a:b:c"],
     "range bounds must be numbers"),
    ("slo key unknown", ["capacity", "{path}", "--slo", "p42_ms=3"], "allowed"),
    ("goodput slo without slo_ms", ["capacity", "{path}", "--slo", "goodput_frac=0.9"],
     "slo_ms"),
    ("live drain timeout not positive", ["live", "{path}", "--drain-timeout-s", "0"],
     "--drain-timeout-s"),
]


@pytest.mark.parametrize(("label", "args", "text"), FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_bad_flags_are_one_clear_line(tmp_path, label, args, text) -> None:
    path = write(tmp_path, {**GOOD, "model": {"name": "mlp"}})
    argv = [a.format(path=path, tmp=tmp_path) for a in args]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert text in result.output, result.output
    assert_one_error_line(result.output)


def yaml_bomb() -> bytes:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines).encode()


UPLOAD_CASES = [
    ("oversized", b"a: 1\n" * 500_000, "s.yaml", "the limit is"),
    ("not text", b"\x89PNG\r\n\x1a\n\x00\xff", "s.yaml", "not a UTF-8 text file"),
    ("not YAML", b"a: [unclosed\n  b: {", "s.yaml", "not valid YAML"),
    ("YAML bomb", yaml_bomb(), "s.yaml", "aliases"),
    ("not JSON", b'{"schema_version": 1,', "p.json", "not valid JSON"),
]


@pytest.mark.parametrize(("label", "data", "name", "text"), UPLOAD_CASES,
                         ids=[c[0] for c in UPLOAD_CASES])
def test_bad_dashboard_uploads_are_one_clear_line(label, data, name, text) -> None:
    pytest.importorskip("streamlit")
    from dashboard.state import UploadError, parse_upload

    with pytest.raises(UploadError) as info:
        parse_upload(data, name)
    message = str(info.value)
    assert text in message and name in message and "\n" not in message


def test_at_least_thirty_bad_inputs_are_covered() -> None:
    assert len(CASES) + len(FLAG_CASES) + len(UPLOAD_CASES) >= 30


def test_a_bad_sweep_keeps_what_was_already_written(tmp_path) -> None:
    path = write(tmp_path, GOOD)
    out = tmp_path / "sweep"
    first = CliRunner().invoke(app, ["sweep", path, "--grid", "policy.max_batch_size=1,2",
                                     "--seeds", "1", "--workers", "1", "--out", str(out)])
    assert first.exit_code == 0, first.output
    before = (out / "runs.jsonl").read_text()
    again = CliRunner().invoke(app, ["sweep", path, "--grid", "policy.max_batch_size=1:",
                                     "--out", str(out)])
    assert again.exit_code == 2
    assert (out / "runs.jsonl").read_text() == before and len(before.splitlines()) == 2


def test_console_script_exits_nonzero_without_traceback(tmp_path) -> None:
    path = write(tmp_path, with_("workload", rate_rps=-1))
    proc = subprocess.run([sys.executable, "-m", "servelab.cli", "simulate", path],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "workload.rate_rps" in proc.stderr
