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


LLM = {
    "seed": 1,
    "service": {"kind": "llm_linear", "base_ms": 5, "per_prefill_token_ms": 0.01,
                "per_decode_seq_ms": 0.05},
    "workload": {"kind": "poisson", "rate_rps": 5, "n_requests": 20, "prompt_tokens": 10,
                 "output_tokens": 5},
    "policy": {"kind": "vllm", "num_gpu_blocks": 64},
}


def llm_with(section: str, **changes: object) -> dict:
    data = json.loads(json.dumps(LLM))
    if section:
        data[section] = {**data.get(section, {}), **changes}
    else:
        data.update(changes)
    return data


def llm_trace(tmp_path: Path, output: str) -> dict:
    f = tmp_path / "llm.csv"
    f.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,{output}\n1,10,5\n")
    return llm_with("", workload={"kind": "trace", "path": str(f),
                                  "prompt_tokens_column": "ContextTokens",
                                  "output_tokens_column": "GeneratedTokens"})


def alias_bomb_in_params(tmp_path: Path) -> str:
    body = "\n".join("    " + line for line in yaml_bomb().decode().splitlines())
    return yaml.safe_dump(GOOD) + "model:\n  name: mlp\n  params:\n" + body + "\n"


AUTOSCALED = {"kind": "concurrency", "min_replicas": 0, "max_replicas": 2, "cold_start_s": 1}
# issue 28: malformed or hostile inputs that gave a traceback, a hang, runaway memory or a
# silently wrong number; each is now one line naming the field
ISSUE_28_CASES = [
    ("size above 2**53", lambda t: with_("workload", size=2**63), "workload.size"),
    ("n_requests above 2**53", lambda t: with_("workload", n_requests=2**63),
     "workload.n_requests"),
    ("max_batch_size above 2**53", lambda t: with_("policy", max_batch_size=2**62),
     "policy.max_batch_size"),
    ("trace with mixed time zones", csv_workload(
        "TIMESTAMP\n2024-01-01T00:00:00+00:00\n2024-01-01T00:00:01+05:00\n"
        "2024-01-01T00:00:02\n"), "workload.timestamp_column"),
    ("time_scale overflows a row to inf", csv_workload("TIMESTAMP\n0\n1e300\n",
                                                       time_scale=1e10),
     "workload.time_scale"),
    ("fractional trace sizes", csv_workload("TIMESTAMP,n\n0,2.9\n1,1\n", size_column="n"),
     "workload.size_column"),
    ("trace size above 2**53", csv_workload("TIMESTAMP,n\n0,1e17\n1,1\n",
                                            size_column="n"), "workload.size_column"),
    ("preferred sizes above max", lambda t: with_(
        "", policy={"kind": "dynamic", "max_batch_size": 4, "preferred_batch_sizes": [8, 16]}),
     "policy.preferred_batch_sizes"),
    ("cold start .inf", lambda t: with_("", autoscaling={**AUTOSCALED, "cold_start_s": ".inf"}),
     "autoscaling.cold_start_s"),
    ("max_wait_ms .inf", lambda t: with_("", policy={"kind": "dynamic", "max_batch_size": 1000,
                                                     "max_wait_ms": ".inf"}),
     "policy.max_wait_ms"),
    ("rate nan", lambda t: with_("workload", rate_rps=".nan"), "workload.rate_rps"),
    ("linear cv 1e6", lambda t: with_("", service={"kind": "linear", "base_ms": 1,
                                                   "per_item_ms": 0, "cv": 1e6}),
     "service.cv"),
    ("builtin path outside the data folder", lambda t: with_(
        "", workload={"kind": "trace", "path": "builtin:../../pyproject.toml"}),
     "workload.path"),
    ("YAML alias bomb in model.params", alias_bomb_in_params, "model.params"),
    ("llm warmup .inf", lambda t: llm_with("", warmup_s=".inf"), "warmup_s"),
    ("llm trace output tokens 2**62", lambda t: llm_trace(t, str(2**62)),
     "workload.output_tokens_column"),
    ("llm fractional output tokens", lambda t: llm_trace(t, "2.9"),
     "workload.output_tokens_column"),
    ("n_requests 1e9 (pre-flight)", lambda t: with_("workload", n_requests=10**9),
     "workload.n_requests: this run would take"),
    ("mmpp dwell 1e-12 (pre-flight)", lambda t: with_(
        "", workload={"kind": "mmpp", "rates_rps": [100, 0], "mean_dwell_s": 1e-12,
                      "n_requests": 200}), "raise workload.mean_dwell_s"),
    ("control period 1e-9 (pre-flight)", lambda t: with_(
        "", autoscaling={**AUTOSCALED, "min_replicas": 1, "control_period_s": 1e-9}),
     "raise autoscaling.control_period_s"),
    ("cold start 1e15 with min 0 (pre-flight)", lambda t: with_(
        "", autoscaling={**AUTOSCALED, "cold_start_s": 1e15}), "lower autoscaling.cold_start_s"),
    ("trace rate_scale 1e9 (pre-flight)", csv_workload("TIMESTAMP\n0\n1\n2\n",
                                                       rate_scale=1e9),
     "workload.rate_scale: this run would take"),
    ("closed loop of 1e9 clients (pre-flight)", lambda t: with_(
        "", workload={"kind": "closed", "clients": 10**9, "think_ms": 1, "duration_s": 10}),
     "workload.duration_s: this run would take"),
    ("llm output_tokens 2**62 (one message, not one per union member)",
     lambda t: llm_with("workload", output_tokens=2**62),
     "error: workload.output_tokens: Input should be less than or equal to 9007199254740991"),
    ("llm KV memory beyond 2**53 blocks", lambda t: llm_with(
        "", policy={"kind": "vllm", "gpu_memory_gb": 1e300, "kv_bytes_per_token": 1}),
     "policy.gpu_memory_gb"),
    ("llm 1e9 output tokens that fit (pre-flight)", lambda t: llm_with(
        "", workload={**LLM["workload"], "output_tokens": 10**9},
        policy={"kind": "vllm", "num_gpu_blocks": 10**9}), "workload.output_tokens"),
]

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
    # the control loop ticks on while a removed replica waits: 1e18 s ran for ever
    ("graceful shutdown wait of 1e18 s", lambda t: with_(
        "", workload={"kind": "poisson", "rate_rps": 100, "duration_s": 10},
        autoscaling={"kind": "target", "min_replicas": 1, "max_replicas": 4,
                     "cold_start_s": 0.5, "upscale_delay_s": 0, "downscale_delay_s": 0.5,
                     "look_back_period_s": 0.5, "graceful_shutdown_wait_loop_s": 1e18}),
     "autoscaling.graceful_shutdown_wait_loop_s"),
]


ALL_CASES = CASES + ISSUE_28_CASES


@pytest.mark.parametrize(("label", "make", "field"), ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_cli_bad_input_is_one_clear_line(tmp_path, label, make, field) -> None:
    path = write(tmp_path, make(tmp_path))
    result = CliRunner().invoke(app, ["simulate", path, "-q"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert field in result.output, result.output
    assert_one_error_line(result.output)


def assert_one_error_line(output: str) -> None:
    # a search's progress lines (capacity prints one per candidate) are not errors
    lines = [line for line in output.splitlines() if line.strip()
             and not line.startswith(("searching ", "candidate "))]
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
    # issue 28
    ("grid range of nan", ["sweep", "{path}", "--grid", "workload.rate_rps=nan:nan:nan"],
     "must be finite"),
    ("grid list with nan", ["sweep", "{path}", "--grid", "workload.rate_rps=1,.nan"],
     "not a finite number"),
    ("grid of a billion values", ["sweep", "{path}", "--grid",
                                  "policy.max_batch_size=1:1000000000:1"], "at most 10,000"),
    ("grid key given twice", ["sweep", "{path}", "--grid", "policy.max_batch_size=1",
                              "--grid", "policy.max_batch_size=2"], "given twice"),
    ("sweep beyond the budget", ["sweep", "{path}", "--grid",
                                 "workload.n_requests=100,1000000000", "--seeds", "2"],
     "this sweep would take"),
    ("capacity over a non-load knob", ["capacity", "{path}", "--slo", "p99_ms=10", "--over",
                                       "workload.n_requests"], "not a load knob"),
    ("capacity tol nan", ["capacity", "{path}", "--slo", "p99_ms=10", "--tol", "nan"],
     "--tol"),
    ("capacity tol above 1", ["capacity", "{path}", "--slo", "p99_ms=10", "--tol", "5"],
     "--tol"),
    ("capacity error_rate above 1", ["capacity", "{path}", "--slo", "error_rate=2"],
     "--slo error_rate"),
    ("capacity slo nan", ["capacity", "{path}", "--slo", "p99_ms=nan"], "--slo p99_ms"),
    ("capacity slo that nothing meets", ["capacity", "{path}", "--slo", "p99_ms=1e-300",
                                         "--seeds", "1", "--workers", "1"],
     "no candidate holds"),
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


def test_a_calibration_beyond_the_budget_is_refused_with_its_estimate(tmp_path) -> None:
    pytest.importorskip("torch")
    result = CliRunner().invoke(app, ["calibrate", "--model", "mlp", "--device", "cpu",
                                      "--threads", "1", "--batch-sizes", "1-1000000000",
                                      "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "--batch-sizes: this calibration would take" in error[0]
    assert "pass --yes" in error[0] and not (tmp_path / "p.json").exists()


def test_at_least_thirty_bad_inputs_are_covered() -> None:
    assert len(ALL_CASES) + len(FLAG_CASES) + len(UPLOAD_CASES) >= 30


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
