"""Against KServe's own Python model server (``kserve`` 0.21, its own virtual environment,
created on first use and cached) serving MiniLM on a loopback port: the Open Inference
Protocol (KServe v2) request servelab sends and the answer KServe gives, checked field by
field against the protocol; ``servelab bench`` and ``servelab calibrate --endpoint`` through
it; and bad input where only a real server tells (an unknown model's 404, tensors KServe's
model refuses with 400, a body that is not a v2 request).

The protocol's REST shapes (KServe's ``docs/predict-api/v2/required_api.md``): a request is
``{"id"?, "parameters"?, "inputs": [{"name", "shape", "datatype", "parameters"?, "data"}],
"outputs"?}``; a response is ``{"model_name", "model_version"?, "id"?, "parameters"?,
"outputs": [{"name", "shape", "datatype", "parameters"?, "data"}]}``; ``data`` holds
``prod(shape)`` values in row-major order; errors are ``{"error": message}``.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pandas as pd
import pytest
import yaml

from calibration.model_runners import load_corpus
from executor.endpoint.client import Job
from executor.endpoint.request_bench import bench_requests
from executor.endpoint.request_client import kserve_body
from sim.scenario.payload import PayloadCfg
from tests.executor.endpoint.conftest import KSERVE_MINILM, REPO, bench_cli, env

pytestmark = pytest.mark.slow

DATATYPES = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES"}
PAYLOAD = {"model": "minilm", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}]}


def _check_tensor(t: Any, where: str) -> None:
    assert isinstance(t, dict), where
    assert {"name", "shape", "datatype", "data"} <= set(t) <= {
        "name", "shape", "datatype", "parameters", "data"}, (where, set(t))
    assert isinstance(t["name"], str) and t["name"], where
    assert isinstance(t["shape"], list) and all(
        isinstance(d, int) and d >= 0 for d in t["shape"]), where
    assert t["datatype"] in DATATYPES, where
    assert isinstance(t["data"], list) and len(t["data"]) == math.prod(t["shape"]), where


def check_v2_request(body: Any) -> None:
    """A v2 inference request, as the protocol defines it."""
    assert isinstance(body, dict) and "inputs" in body
    assert set(body) <= {"id", "parameters", "inputs", "outputs"}, set(body)
    assert isinstance(body.get("id", ""), str)
    assert isinstance(body["inputs"], list) and body["inputs"]
    for i, tensor in enumerate(body["inputs"]):
        _check_tensor(tensor, f"inputs[{i}]")


def check_v2_response(answer: Any, request_id: str) -> None:
    """A v2 inference response, as the protocol defines it."""
    assert isinstance(answer, dict)
    assert set(answer) <= {"model_name", "model_version", "id", "parameters", "outputs"}
    assert isinstance(answer["model_name"], str) and answer["model_name"]
    assert answer.get("id") == request_id  # the request's id, echoed
    assert isinstance(answer["outputs"], list) and answer["outputs"]
    for i, tensor in enumerate(answer["outputs"]):
        _check_tensor({k: v for k, v in tensor.items() if v is not None}, f"outputs[{i}]")


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def _post(url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def test_the_request_servelab_sends_and_kserves_answer_follow_the_protocol(
        kserve_minilm: Any) -> None:
    url = kserve_minilm.url
    assert _get(f"{url}/v2/health/live")[0] == 200
    assert _get(f"{url}/v2/health/ready")[0] == 200
    status, meta = _get(f"{url}/v2/models/minilm")
    assert status == 200 and meta["name"] == "minilm"
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    body = kserve_body(PayloadCfg.model_validate(PAYLOAD), Job(7, 0.0, "", 3, 0),
                       np.random.default_rng(0), load_corpus())
    check_v2_request(body)  # what bench and calibrate send
    status, answer = _post(f"{url}/v2/models/minilm/infer", body)
    assert status == 200, answer
    check_v2_response(answer, "7")
    out = answer["outputs"][0]
    assert out["shape"] == [3, 384] and out["datatype"] == "FP32"
    vectors = np.asarray(out["data"], dtype=float).reshape(3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)  # normalised MiniLM
    # the same sentences through servelab's own MiniLM give the same embeddings
    from calibration.model_runners import MiniLMRunner

    runner = MiniLMRunner(device="cpu", threads=1)
    mine = np.asarray(runner.run_batch(body["inputs"][0]["data"]).tolist(), dtype=float)
    assert np.allclose(vectors, mine, atol=1e-4)


def test_a_burst_of_eight_becomes_one_batch(kserve_minilm: Any) -> None:
    url = f"{kserve_minilm.url}/v2/models/minilm/infer"

    async def burst() -> list[Any]:
        async with aiohttp.ClientSession() as session:
            async def one(i: int) -> Any:
                body = {"id": str(i), "inputs": [{"name": "text", "shape": [1],
                                                  "datatype": "BYTES", "data": [f"s {i}"]}]}
                async with session.post(url, json=body) as resp:
                    assert resp.status == 200
                    return await resp.json()
            return list(await asyncio.gather(*(one(i) for i in range(8))))

    answers = asyncio.run(burst())
    params = [a["parameters"] for a in answers]
    assert {p["batch_size"] for p in params} == {8}, params  # a full batch goes at once
    assert len({p["batch_id"] for p in params}) == 1


def _scenario(path: Path, **workload: Any) -> Path:
    load = {"kind": "poisson", "rate_rps": 8, "duration_s": 4, **workload}
    path.write_text(yaml.safe_dump({
        "name": path.stem, "seed": 2, "service": {"kind": "linear", "base_ms": 10,
                                                  "per_item_ms": 2},
        "workload": load, "warmup_s": 0,
        "policy": {"kind": "dynamic", "max_batch_size": KSERVE_MINILM["max_batch_size"],
                   "max_wait_ms": KSERVE_MINILM["window_ms"], "timer": "first"},
        "payload": PAYLOAD}))
    return path


def test_bench_and_calibrate_cli_against_kserve(kserve_minilm: Any, tmp_path: Path) -> None:
    url = kserve_minilm.url
    out = tmp_path / "run"
    proc = bench_cli(str(_scenario(tmp_path / "s.yaml")), "--endpoint", url, "--api",
                     "kserve-v2", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) >= 10 and (requests["status"] == "ok").all()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["driver"] == "bench"
    assert meta["server_model_metadata"]["name"] == "minilm"
    profile_path = tmp_path / "kserve.json"
    proc = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "calibrate", "--endpoint", url, "--api",
         "kserve-v2", "--endpoint-model", "minilm", "--batch-sizes", "1,8", "--reps", "4",
         "--window-ms", str(KSERVE_MINILM["window_ms"]), "--server-max-batch-size",
         str(KSERVE_MINILM["max_batch_size"]), "--out", str(profile_path)],
        capture_output=True, text=True, timeout=300, env=env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    profile = json.loads(profile_path.read_text())
    bursts = profile["endpoint"]["bursts"]
    assert set(bursts) == {"1", "8"}
    assert profile["endpoint"]["server_metadata"]["name"] == "minilm"
    # a full burst of 8 runs without the window (the batcher dispatches when full), so its
    # latency is what the model takes for 8 sentences, above one sentence's minus the window
    assert bursts["8"]["median_ms"] > bursts["1"]["median_ms"] - KSERVE_MINILM["window_ms"]
    proc = subprocess.run([sys.executable, "-m", "servelab.cli", "simulate",
                           str(_scenario(tmp_path / "p.yaml")), "--set",
                           f"service={{kind: profile, path: {profile_path}}}"],
                          capture_output=True, text=True, timeout=120, env=env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def _one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(("args", "needles"), [
    (["--model", "nosuch"], ("404", "no model 'nosuch'")),
    # a tensor of the wrong datatype: the model's InvalidInput, KServe's 400 and its message
    (["--set", "payload.inputs=[{name: text, datatype: FP32, shape: [-1]}]"],
     ("HTTP 400", "expected BYTES")),
    # not a v2 request at all: KServe's FastAPI validation answers 422 (the protocol says 400)
    (["--api", "http-json", "--set", "payload.path=/v2/models/minilm/infer", "--set",
      "payload.body={inputs: $texts}"], ("HTTP 422",)),
])
def test_bad_input_a_real_server_refuses_is_one_line(kserve_minilm: Any, tmp_path: Path,
                                                     args: list[str],
                                                     needles: tuple[str, ...]) -> None:
    proc = bench_cli(str(_scenario(tmp_path / "s.yaml")), "--endpoint", kserve_minilm.url,
                     "--api", "kserve-v2", *args)
    _one_line_error(proc, *needles)


def test_refused_tensors_mid_run_are_counted_by_cause(kserve_minilm: Any,
                                                      tmp_path: Path) -> None:
    # 1 item passes the pre-flight request; 32 items are more than the model's max_items, so
    # KServe answers every request 400 and the run counts them
    too_many = KSERVE_MINILM["max_items"] * 2
    result = bench_requests(_scenario(tmp_path / "s.yaml", rate_rps=5, duration_s=1,
                                      size=too_many),
                            kserve_minilm.url, api="kserve-v2")
    n = len(result.requests)
    assert n >= 1 and result.summary["ok"] == 0
    assert result.summary["client"]["errors_by_cause"] == {"http_400": n}
    errors = result.requests["error"].dropna()
    assert errors.str.contains(f"at most {KSERVE_MINILM['max_items']} items").all()
