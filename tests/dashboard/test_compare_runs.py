"""The Verify page's listing: live and endpoint comparisons, each labelled with what it
measured (the shipped examples, the endpoint one made against the stub server by
``dashboard/examples/make_endpoint_example.py``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dashboard.compare_runs import compare_dirs, label, listing, measured_by, run_dirs, server_name

EXAMPLES = Path(__file__).resolve().parents[2] / "dashboard" / "examples"
STUB = EXAMPLES / "compare-endpoint-stub"


def test_the_shipped_examples_are_listed_live_first_then_the_endpoint_one() -> None:
    found = listing(EXAMPLES)
    names = [d.name for d, _ in found]
    assert names == ["compare-llm", "compare-mlp", "compare-endpoint-stub"]
    labels = {d: label(info) for d, info in found}
    assert labels[EXAMPLES / "compare-mlp"] == "live: servelab executor on cpu"
    # the server is named from what it reported (its /v1/models owned_by), with the API
    assert labels[STUB].startswith("endpoint: servelab stub server (OpenAI completions) at "
                                   "http://127.0.0.1:")


def test_an_endpoint_compare_holds_bench_runs_whose_meta_names_the_server() -> None:
    runs = run_dirs(STUB)
    assert [d.name for d in runs] == ["bench-1", "bench-2"]
    meta = json.loads((runs[0] / "meta.json").read_text())
    assert meta["device"]["kind"] == "endpoint" and meta["driver"] == "bench"
    assert server_name(meta) == "servelab stub server"
    info = measured_by(STUB)
    assert info["kind"] == "endpoint" and info["server"] == "servelab stub server"
    data = json.loads((STUB / "compare.json").read_text())
    assert data["driver"] == "bench" and data["kind"] == "llm"
    assert {"ttft_ms.p50", "tpot_ms.p50"} <= {r["metric"] for r in data["rows"]}


def test_a_sweep_is_listed_once_and_servers_are_named_from_their_metadata(tmp_path) -> None:
    shutil.copytree(EXAMPLES / "compare-mlp", tmp_path / "sweep")
    assert compare_dirs(tmp_path) == [tmp_path / "sweep"]  # not one entry per rho-*
    assert compare_dirs(tmp_path / "missing") == []
    # a KServe v2 model's metadata names its platform; vLLM's /v1/models its owner
    assert server_name({"server_model_metadata": {"platform": "kserve"}}) == "KServe"
    assert server_name({"server_models": {"data": [{"owned_by": "vllm"}]}}) == "vLLM"
    assert server_name({"server": "ray-serve"}) == "Ray Serve"
    assert server_name({}) is None
    # a request-level endpoint compare (bench-i runs, no server self-description)
    run = tmp_path / "rq" / "bench-1"
    run.mkdir(parents=True)
    (run.parent / "compare.json").write_text(json.dumps(
        {"scenario": "rq", "driver": "bench", "endpoint": "http://127.0.0.1:8000",
         "repeats": 1, "rows": []}))
    (run / "meta.json").write_text(json.dumps(
        {"driver": "bench", "device": {"kind": "endpoint", "api": "http-json",
                                       "url": "http://127.0.0.1:8000"}}))
    info = measured_by(tmp_path / "rq")
    assert info["kind"] == "endpoint"
    assert label(info) == "endpoint: a server (HTTP JSON) at http://127.0.0.1:8000"
