"""Uploads on the dashboard: one error surface — a line naming the field, never a traceback."""

from __future__ import annotations

from pathlib import Path

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
            "list": "- 1\n- 2\n", "broken": "a: [1,\n"}
    return [("trace.yaml", text["trace"].encode(), "workload.kind 'trace'"),
            ("llm-demo.yaml", (ROOT / "servelab" / "scenarios" / "llm-demo.yaml").read_bytes(),
             "an LLM scenario"),
            ("seed.yaml", text["seed"].encode(), "seed"),
            ("slo.yaml", text["slo"].encode(), "slo_ms"),
            ("workload.yaml", text["workload"].encode(), "workload"),
            ("queue.yaml", text["queue"].encode(), "max_len"),
            ("batch.yaml", text["batch"].encode(), "policy.max_batch_size 500"),
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

    assert restorable(yaml.safe_dump(BASE).encode(), "good.yaml") == BASE


@pytest.mark.parametrize(("name", "content"), [
    ("deep.json", b"[" * 100_000 + b"]" * 100_000),
    ("deep-object.json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
])
def test_a_deeply_nested_profile_upload_is_refused_cleanly(name: str, content: bytes) -> None:
    at = upload("profiles", "calibration-upload", name, content)
    assert f"{name}: nested more than 100 levels deep" in errors(at)


def test_a_deeply_nested_yaml_restore_is_refused_cleanly() -> None:
    at = upload("explore", "restore", "deep.yaml", b"[" * 5_000 + b"]" * 5_000)
    assert "nested more than 100 levels deep" in errors(at)
