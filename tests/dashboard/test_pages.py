"""One AppTest per dashboard page: it renders without an exception and its numbers react."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

PAGES = Path(__file__).resolve().parents[2] / "dashboard" / "app_pages"
TIMEOUT_S = 120


def page(name: str) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=TIMEOUT_S)
    at.run()
    assert not at.exception, at.exception
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_explore_reacts_to_the_rate() -> None:
    at = page("explore")
    before = metrics(at)
    assert float(before["throughput (req/s)"]) > 0 and "P99 latency" in before
    assert len(at.get("plotly_chart")) == 2  # only the open tab's figures are built
    at.number_input(key="explore-rate").set_value(55.0).run()
    assert not at.exception
    after = metrics(at)
    assert after["throughput (req/s)"] != before["throughput (req/s)"]
    assert after["P99 latency"] != before["P99 latency"]


def test_explore_tabs_build_their_figures_only_when_open() -> None:
    at = page("explore")
    assert [tab.label for tab in at.get("tab")] == ["latency", "over time",
                                                    "batches and replicas"]
    for label, charts in (("over time", 2), ("batches and replicas", 3), ("latency", 2)):
        at.session_state["explore-tab"] = label  # what a click on the tab does
        at.run()
        assert not at.exception
        assert len(at.get("plotly_chart")) == charts, label


def test_explore_shows_bad_settings_in_the_page() -> None:
    at = page("explore")
    at.number_input(key="explore-rate").set_value(99_000.0).run()  # over the request cap
    assert not at.exception
    assert any("caps runs" in w.value for w in at.warning)


def test_compare_reacts_to_a_policy_change() -> None:
    at = page("compare")
    table = at.dataframe[0].value
    assert len(table) == 3
    before = table["P99 (ms)"].tolist()
    at.selectbox(key="cmp0-policy-kind").set_value("greedy").run()
    assert not at.exception
    assert at.dataframe[0].value["P99 (ms)"].tolist() != before
    assert len(at.get("plotly_chart")) == 4


def test_calibration_overlays_profiles() -> None:
    at = page("profiles")
    assert len(at.get("plotly_chart")) == 1
    assert len(at.dataframe) == 2  # the two CPU profiles picked by default
    chosen = ["minilm-cpu", "mlp-cpu", "cnn-cpu"]
    at.multiselect(key="calibration-profiles").set_value([f"builtin:{n}" for n in chosen]).run()
    assert not at.exception
    assert len(at.dataframe) == 3  # one summary table per profile
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert {t.get("legendgroup") for t in spec["data"]} == set(chosen)  # each curve overlaid


def test_verify_shows_the_shipped_comparison() -> None:
    at = page("verify")
    assert len(at.dataframe) == 1 and len(at.get("plotly_chart")) >= 1
    at.text_input(key="verify-dir").set_value("/nonexistent").run()
    assert not at.exception and any("No compare.json" in e.value for e in at.error)


def test_course_lessons_run_in_both_languages() -> None:
    at = page("course")
    lessons = at.selectbox(key="course-lesson").options
    assert len(lessons) == 12  # 0 the serving loop … 10 prefix caching, 11 exercises
    for title in lessons:
        at.selectbox(key="course-lesson").set_value(title).run()
        assert not at.exception, title
    at.session_state["lang"] = "zh"  # the sidebar's switch (app.py) sets it
    at.run()
    assert not at.exception and at.title[0].value == "课程"
    first = at.selectbox(key="course-lesson").options[1]
    at.selectbox(key="course-lesson").set_value(first).run()
    before = metrics(at)
    at.slider(key="l1-rate").set_value(60).run()
    assert not at.exception and metrics(at) != before


def test_explore_shows_request_classes_and_priority_helps_the_urgent_class() -> None:
    at = page("explore")
    at.number_input(key="explore-rate").set_value(float(at.number_input(
        key="explore-rate").value) * 1.5).run()  # load, so the discipline matters
    at.checkbox(key="explore-use-classes").check().run()
    assert not at.exception
    table = at.dataframe[-1].value
    assert list(table["class"]) and set(table["class"]) == {"interactive", "batch"}

    def p99(discipline: str) -> dict[str, float]:
        at.selectbox(key="explore-discipline").set_value(discipline).run()
        assert not at.exception
        frame = at.dataframe[-1].value.set_index("class")
        return frame["P99 (ms)"].to_dict()

    fifo, priority = p99("fifo"), p99("priority")
    assert priority["interactive"] < fifo["interactive"]
    assert priority["batch"] >= fifo["batch"] - 1e-9


def test_llm_page_compares_schedulers_and_reacts_to_the_load() -> None:
    at = page("llm")
    # the default tab runs the first scheduler only: no comparison table, no sweep
    assert len(at.dataframe) == 0 and len(at.get("plotly_chart")) == 2
    assert [tab.label for tab in at.get("tab")] == ["this scheduler", "compare schedulers",
                                                    "load sweep"]
    at.session_state["llm-tab"] = "compare schedulers"  # what a click on the tab does
    at.run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["scheduler"]) == ["vllm, chunked prefill (512)", "static (batch 8)"]
    # continuous batching beats request-level batching on the trace's mixed output lengths
    by = table.set_index("scheduler")
    assert by.loc["vllm, chunked prefill (512)", "TTFT P99 (ms)"] < by.loc[
        "static (batch 8)", "TTFT P99 (ms)"]
    assert len(at.get("plotly_chart")) == 0
    at.session_state["llm-tab"] = "load sweep"
    at.run()
    assert not at.exception and len(at.get("plotly_chart")) == 1 and len(at.dataframe) == 0
    at.session_state["llm-tab"] = "this scheduler"
    at.run()
    before = metrics(at)
    at.slider(key="llm-scale").set_value(2.0).run()
    assert not at.exception and metrics(at) != before
    at.selectbox(key="llm-model").set_value(
        "CPU decoder, measured (builtin:llm-small-cpu)").run()
    assert not at.exception


def test_verify_reads_an_llm_compare_directory() -> None:
    at = page("verify")
    llm_dir = PAGES.parent / "examples" / "compare-llm"
    at.text_input(key="verify-dir").set_value(str(llm_dir)).run()
    assert not at.exception
    table = at.dataframe[0].value
    assert {"ttft_ms.p50", "tpot_ms.p99", "output_tokens_per_s"} <= set(table["metric"])
    assert len(at.get("plotly_chart")) == 1  # the TTFT CDFs of sim and live runs
    assert any("prefill ×" in i.value for i in at.info)


def test_verify_lists_and_shows_an_endpoint_comparison_beside_the_live_ones() -> None:
    at = page("verify")  # the examples folder: every comparison in it is listed
    options = at.selectbox(key="verify-run").options
    assert len(options) == 3 and any("endpoint: servelab stub server" in o for o in options)
    stub = next(o for o in options if "endpoint:" in o)
    at.selectbox(key="verify-run").set_value(
        str(PAGES.parent / "examples" / "compare-endpoint-stub")).run()
    assert not at.exception, stub
    assert any("endpoint: servelab stub server" in c.value for c in at.caption)
    table = at.dataframe[0].value
    assert {"ttft_ms.p50", "tpot_ms.p50"} <= set(table["metric"])
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    names = {trace["name"] for trace in spec["data"]}
    assert {"bench-1 (servelab stub server)", "bench-2 (servelab stub server)", "sim"} <= names


def test_explore_autoscaling_holds_fewer_replica_seconds_on_a_day_and_shows_cold_starts(
        ) -> None:
    at = page("explore")
    at.selectbox(key="explore-workload-kind").set_value("sinusoid").run()
    at.slider(key="explore-duration").set_value(240).run()
    at.slider(key="explore-replicas").set_value(4).run()
    assert not at.exception
    fixed = metrics(at)
    assert fixed["replicas (mean)"] == "4.00" and fixed["cold starts"] == "0"
    at.selectbox(key="explore-scaling").set_value("concurrency").run()  # scale to zero
    assert not at.exception
    scaled = metrics(at)
    assert float(scaled["replicas (mean)"]) < 4
    assert int(scaled["cold starts"]) > 0
    cost = {k: float(v["cost per million"].split()[0]) for k, v in
            (("fixed", fixed), ("scaled", scaled))}
    assert cost["scaled"] < cost["fixed"]
    at.session_state["explore-tab"] = "over time"  # the replica count over the day
    at.run()
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"]
              for c in at.get("plotly_chart")]
    assert "P99 latency per time bin and replica count" in titles


def test_the_autoscaling_lesson_compares_fixed_and_on_demand_fleets() -> None:
    at = page("course")
    title = next(t for t in at.selectbox(key="course-lesson").options if t.startswith("9."))
    at.selectbox(key="course-lesson").set_value(title).run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("")
    assert len(table) == 5
    zero = table.loc["concurrency, scale to zero (Knative)"]

    def num(text: str) -> float:
        return float(str(text).replace(",", ""))

    assert int(zero["cold starts"]) > 0 and int(table.loc["fixed 4", "cold starts"]) == 0
    assert num(zero["USD / million"]) < num(table.loc["fixed 4", "USD / million"])
    at.slider(key="l9-cold").set_value(60.0).run()
    assert not at.exception
    slower = at.dataframe[0].value.set_index("")
    assert num(slower.loc["concurrency, scale to zero (Knative)", "P99 ms"]) > num(
        zero["P99 ms"])


def test_the_autoscaling_lesson_shows_ray_serves_replica_count_beside_servelabs() -> None:
    from dashboard.lesson_rayserve import load_result

    data = load_result()
    assert data is not None  # the committed benchmark result
    at = page("course")
    title = next(t for t in at.selectbox(key="course-lesson").options if t.startswith("9."))
    at.selectbox(key="course-lesson").set_value(title).run()
    assert not at.exception
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    ray = next(s for s in specs if s["layout"]["title"]["text"]
               == "Replicas over the burst day: Ray Serve vs servelab")
    names = [trace["name"] for trace in ray["data"]]
    assert names[:3] == ["Ray Serve replicas", "Ray Serve replicas running",
                         "servelab predicted replicas"]
    assert max(ray["data"][0]["y"]) == data["runs"][0]["live"]["max_replicas"]
    table = at.dataframe[1].value
    assert set(table["run"]) == {str(k) for k in range(1, len(data["runs"]) + 1)}
