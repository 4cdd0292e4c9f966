"""Uploads on the dashboard: one error surface — a line naming the field, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("streamlit")
import yaml
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "dashboard" / "app_pages"
TIMEOUT_S = 120


def upload(page: str, key: str, name: str, content: bytes) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{page}.py"), default_timeout=TIMEOUT_S)
    at.run()
    at.file_uploader(key=key).set_value((name, content, "application/octet-stream")).run()
    assert not at.exception, at.exception
    return at


def errors(at: AppTest) -> str:
    return " | ".join(e.value for e in at.error)


BASE = {"name": "r", "seed": 3, "service": {"kind": "constant", "ms": 5},
        "workload": {"kind": "poisson", "rate_rps": 55, "duration_s": 20},
        "policy": {"kind": "greedy", "max_batch_size": 4}}


def bad_scenarios(tmp_path: Path) -> list[tuple[str, bytes, str]]:
    trace = tmp_path / "t.csv"
    trace.write_text("t\n0.0\n0.1\n0.2\n")
    text = {"trace": yaml.safe_dump({**BASE, "workload": {"kind": "trace", "path": str(trace),
                                                         "timestamp_column": "t"}}),
            "seed": yaml.safe_dump({**BASE, "seed": [1, 2]}),
            "slo": yaml.safe_dump({**BASE, "slo_ms": "fast"}),
            "workload": yaml.safe_dump({**BASE, "workload": "hello"}),
            "queue": yaml.safe_dump({**BASE, "queue": {"max_len": -5}}),
            "batch": yaml.safe_dump({**BASE, "policy": {"kind": "greedy",
                                                        "max_batch_size": 500}}),
            "timer": yaml.safe_dump({**BASE, "policy": {"kind": "dynamic",
                                                        "timer": "arrival"}}),
            "fixed": yaml.safe_dump({**BASE, "policy": {"kind": "fixed", "batch_size": 4}}),
            "scale": yaml.safe_dump({**BASE, "autoscaling": {"kind": "target",
                                                             "max_replicas": 20,
                                                             "cold_start_s": 1}}),
            "look": yaml.safe_dump({**BASE, "autoscaling": {"kind": "target",
                                                            "look_back_period_s": 100,
                                                            "cold_start_s": 1}}),
            "list": "- 1\n- 2\n", "broken": "a: [1,\n"}
    return [("trace.yaml", text["trace"].encode(), "workload.kind 'trace'"),
            ("llm-demo.yaml", (ROOT / "servelab" / "scenarios" / "llm-demo.yaml").read_bytes(),
             "an LLM scenario"),
            ("seed.yaml", text["seed"].encode(), "seed"),
            ("slo.yaml", text["slo"].encode(), "slo_ms"),
            ("workload.yaml", text["workload"].encode(), "workload"),
            ("queue.yaml", text["queue"].encode(), "max_len"),
            ("batch.yaml", text["batch"].encode(), "policy.max_batch_size 500"),
            ("timer.yaml", text["timer"].encode(), "policy.timer 'arrival'"),
            ("fixed.yaml", text["fixed"].encode(), "policy.timeout_ms"),
            ("scale.yaml", text["scale"].encode(), "autoscaling.max_replicas 20"),
            ("look.yaml", text["look"].encode(), "autoscaling.look_back_period_s 100"),
            ("list.yaml", text["list"].encode(), "mapping of scenario keys"),
            ("broken.yaml", text["broken"].encode(), "not valid YAML")]


def test_bad_scenario_files_restore_to_one_line_naming_the_field(tmp_path) -> None:
    for name, content, field in bad_scenarios(tmp_path):
        at = upload("explore", "restore", name, content)
        shown = errors(at)
        assert f"Could not restore {name}" in shown and field in shown, (name, shown)
        assert "Traceback" not in shown and "\n" not in shown.strip()
        assert float(at.number_input(key="explore-rate").value) == 40.0  # defaults kept


def test_a_good_scenario_file_restores_without_an_error() -> None:
    at = upload("explore", "restore", "good.yaml", yaml.safe_dump(BASE).encode())
    assert not at.error
    from dashboard.restore import restorable

    # every field the file sets, as it sets it; the shown sections gain the schema's
    # defaults for what the file leaves out (the dynamic window: 2 ms, not the page's 5)
    got = restorable(yaml.safe_dump(BASE).encode(), "good.yaml")
    assert {k: v for k, v in got.items() if k not in ("workload", "policy")} == {
        k: v for k, v in BASE.items() if k not in ("workload", "policy")}
    for section in ("workload", "policy"):
        assert got[section].items() >= BASE[section].items(), (section, got[section])
    dynamic = restorable(yaml.safe_dump({**BASE, "policy": {"kind": "dynamic"}}).encode(), "d")
    assert dynamic["policy"]["max_wait_ms"] == 2.0


def test_a_restored_file_sets_the_controls_and_names_what_it_left_behind() -> None:
    # a keyed widget keeps its state and ignores a new default: the restore must draw the
    # controls anew with the file's values (before, the page kept 40 req/s and no
    # autoscaler whatever the file said), once, so the user's changes after it stay
    day = {**BASE, "workload": {"kind": "mmpp", "rates_rps": [80, 5], "mean_dwell_s": 3.0,
                                "duration_s": 30},
           "autoscaling": {"kind": "target", "max_replicas": 4, "cold_start_s": 1,
                           "aggregation_function": "max", "look_back_period_s": 7,
                           "control_period_s": 0.5}}
    at = upload("explore", "restore", "day.yaml", yaml.safe_dump(day).encode())
    assert not at.error, errors(at)
    assert at.selectbox(key="explore-workload-kind").value == "mmpp"
    assert float(at.number_input(key="explore-hi").value) == 80.0
    assert float(at.slider(key="explore-dwell").value) == 3.0
    assert at.selectbox(key="explore-scaling").value == "target"
    assert at.selectbox(key="scaling-target-agg").value == "max"  # Ray's aggregation_function
    assert float(at.slider(key="scaling-target-look").value) == 7.0
    # what the page has no control for is named in one line (the constant service, the
    # control period), not dropped silently
    shown = " ".join(w.value for w in at.warning)
    assert "Restored without: autoscaling.control_period_s, service.kind, service.ms" in shown
    at.number_input(key="explore-hi").set_value(90.0).run()  # the user's change stays
    assert float(at.number_input(key="explore-hi").value) == 90.0 and not at.exception


@pytest.mark.parametrize(("name", "content"), [
    ("deep.json", b"[" * 100_000 + b"]" * 100_000),
    ("deep-object.json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
])
def test_a_deeply_nested_profile_upload_is_refused_cleanly(name: str, content: bytes) -> None:
    at = upload("profiles", "calibration-upload", name, content)
    assert f"{name}: nested more than 100 levels deep" in errors(at)


@pytest.mark.parametrize(("name", "content", "message"), [
    ("deep.json", b"[" * 200 + b"]" * 200, "deep.json: nested more than 100 levels deep"),
    ("old.json", b'{"schema_version": 99, "samples_s": {"1": [0.001]}}',
     "old.json: schema_version is 99; this servelab reads 1"),
], ids=["too deep", "old schema"])
def test_a_bad_profile_upload_names_the_file_once(name: str, content: bytes,
                                                  message: str) -> None:
    # the page put the file's name before messages that already start with it (issue 28's
    # ledger: "deep.json: deep.json: nested more than 100 levels deep")
    at = upload("profiles", "calibration-upload", name, content)
    assert errors(at) == message


def test_a_deeply_nested_yaml_restore_is_refused_cleanly() -> None:
    at = upload("explore", "restore", "deep.yaml", b"[" * 5_000 + b"]" * 5_000)
    assert "nested more than 100 levels deep" in errors(at)


@pytest.mark.parametrize("section", [
    {"policy": {"kind": "none"}},
    {"policy": {"kind": "greedy", "max_batch_size": 16}},
    # the fixed policy's flush control once shared its key with the queue timeout's: the
    # page failed with a duplicate key whenever fixed was chosen
    {"policy": {"kind": "fixed", "batch_size": 4, "timeout_ms": 7}},
    {"policy": {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 2.5, "timer": "first"}},
    {"policy": {"kind": "aimd", "max_batch_size": 8, "slo_ms": 50}},
    {"workload": {"kind": "gamma", "rate_rps": 30, "cv": 3, "duration_s": 20}},
    {"workload": {"kind": "sinusoid", "rate_rps": 30, "amplitude": 0.5, "period_s": 60,
                  "duration_s": 20}},
    {"workload": {"kind": "closed", "clients": 4, "think_ms": 50, "duration_s": 20}},
    {"autoscaling": {"kind": "concurrency", "max_replicas": 3, "cold_start_s": 2,
                     "stable_window_s": 20, "panic_window_s": 4}},
], ids=lambda section: "-".join(f"{k}-{v['kind']}" for k, v in section.items()))
def test_each_kind_restores_onto_its_controls(section: dict[str, Any]) -> None:
    at = upload("explore", "restore", "k.yaml", yaml.safe_dump({**BASE, **section}).encode())
    assert not at.error, errors(at)
    (part, body), = section.items()
    key = {"policy": "explore-policy-kind", "workload": "explore-workload-kind",
           "autoscaling": "explore-scaling"}[part]
    assert at.selectbox(key=key).value == body["kind"]
    # only the constant service (the page runs profiles) is left behind
    shown = " ".join(w.value for w in at.warning)
    assert "Restored without: service.kind, service.ms (" in shown, shown


@pytest.mark.parametrize(("section", "named"), [
    # per-state dwell times: the page shows one; it says so instead of failing
    ({"workload": {"kind": "mmpp", "rates_rps": [80, 5], "mean_dwell_s": [1.0, 4.0],
                   "duration_s": 30}}, "workload.mean_dwell_s"),
    # a count instead of a duration (duration_s unset): the page runs 60 s and says so
    ({"workload": {"kind": "poisson", "rate_rps": 30, "n_requests": 300,
                   "duration_s": None}}, "workload.n_requests"),
    # a price of 0 is a price the control holds, not one it leaves behind
    ({"price_per_replica_hour": 0}, None),
    # a class without its optional keys is the class the editor holds
    ({"classes": [{"name": "a", "share": 0.5, "priority": 0},
                  {"name": "b", "share": 0.5, "priority": 1, "slo_ms": 80}]}, None),
    # an autoscaler restored without delays runs the schema's (Ray's 30 / 600 / 30 s),
    # not the page's own defaults, and the controls show them
    ({"autoscaling": {"kind": "target", "max_replicas": 4, "cold_start_s": 2}}, None),
], ids=["dwell-list", "n-requests", "price-0", "classes", "autoscaler-defaults"])
def test_valid_files_restore_without_a_traceback_and_name_only_what_is_left(
        section: dict[str, Any], named: str | None) -> None:
    at = upload("explore", "restore", "v.yaml", yaml.safe_dump({**BASE, **section}).encode())
    assert not at.error, errors(at)
    shown = " ".join(w.value for w in at.warning)
    left = shown.split("Restored without: ")[1].split(" (")[0].split(", ")
    assert left[:2] == ["service.kind", "service.ms"], shown  # the page runs profiles
    assert left[2:] == ([named] if named else []), shown
    if "autoscaling" in section:
        assert [float(at.slider(key=k).value) for k in (
            "scaling-target-up", "scaling-target-down", "scaling-target-look")] == [
            30.0, 600.0, 30.0]
