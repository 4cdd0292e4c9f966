"""Request-level routes for the local stub (:mod:`executor.endpoint.stub`): the KServe v2 /
Open Inference Protocol (``/v2/health/ready``, ``/v2/models/{name}``,
``POST /v2/models/{name}/infer``) and plain JSON (``POST /predict``, the model in the body's
``model`` field, default ``instant``).

The model name chooses a behaviour, ``MODE[:A[:B...]][~tag]`` (the tag keeps counters and
batchers apart; not ``#``, which ends a URL's path):

* ``instant``: answer at once;
* ``sleep:MS``: answer after MS milliseconds;
* ``batch:MAX:WINDOW_MS:BASE_MS:PER_ITEM_MS[:OUTSIDE_MS]``: a size-or-timeout batcher whose
  timer starts at the first request (Ray Serve's ``@serve.batch``), one batch at a time, each
  taking ``BASE_MS + PER_ITEM_MS * requests`` of sleep: a server whose behaviour servelab's
  simulator models exactly; ``OUTSIDE_MS`` (default 0) is slept before a request joins the
  batcher, a fixed path outside the replica's busy time (a proxy's hop);
* ``errors``: answers 200, 500, 429, 503, 200, … in turn;
* ``cut``: closes the connection without an answer;
* ``malformed``: 200 with a body that is not JSON;
* ``badshape``: 200 with a v2 answer whose output has the wrong number of rows;
* ``slow:SECONDS``: waits that long before answering;
* any other name: 404 (no such model).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from aiohttp import web

ERROR_CYCLE = (200, 500, 429, 503)
MODES = ("instant", "sleep", "batch", "errors", "cut", "malformed", "badshape", "slow")


class Batcher:
    """One batch at a time; a batch closes when full or WINDOW after its first request."""

    def __init__(self, max_size: int, window_s: float, base_s: float, per_item_s: float) -> None:
        self.max_size, self.window_s = max_size, window_s
        self.base_s, self.per_item_s = base_s, per_item_s
        self.queue: list[asyncio.Future[int]] = []
        self.wake = asyncio.Event()
        self.sizes: list[int] = []
        self.window_late_s: list[float] = []  # per batch: how late its timers fired (a busy
        self.service_late_s: list[float] = []  # event loop), window and service apart
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def submit(self) -> int:
        """Wait for this request's batch to finish; return its index in ``sizes``."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.queue.append(fut)
        self.wake.set()
        return await fut

    async def _loop(self) -> None:
        while True:
            while not self.queue:
                self.wake.clear()
                await self.wake.wait()
            deadline = time.perf_counter() + self.window_s
            late = 0.0
            while len(self.queue) < self.max_size:
                left = deadline - time.perf_counter()
                if left <= 0:
                    late = -left
                    break
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), left)
                except TimeoutError:
                    late = max(time.perf_counter() - deadline, 0.0)
                    break
            batch, self.queue = self.queue[:self.max_size], self.queue[self.max_size:]
            service_s = self.base_s + self.per_item_s * len(batch)
            t0 = time.perf_counter()
            await asyncio.sleep(service_s)
            self.window_late_s.append(late)
            self.service_late_s.append(max(time.perf_counter() - t0 - service_s, 0.0))
            self.sizes.append(len(batch))
            for fut in batch:
                if not fut.done():
                    fut.set_result(len(self.sizes) - 1)


class StubV2:
    """Handlers and per-model state."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.batchers: dict[str, Batcher] = {}
        # per ``batch`` model, per answered request (in the order they were answered): how
        # late its outside sleep ended (s), the index of the batch it rode in, and how long
        # the stub held it (s: from its handler's entry, before the body is read, until the
        # handler resumed after its batch; the client's latency less this is the path
        # outside the handler: both HTTP legs, the client's and aiohttp's own work)
        self.outside_late_s: dict[str, list[float]] = {}
        self.request_batch: dict[str, list[int]] = {}
        self.request_held_s: dict[str, list[float]] = {}

    def _answer(self, model: str, rows: int, width: int = 2) -> dict[str, Any]:
        return {"model_name": model, "model_version": "1", "outputs": [{
            "name": "output", "datatype": "FP32", "shape": [rows, width],
            "data": [0.5] * (rows * width)}]}

    async def _behave(self, request: web.Request, model: str, rows: int,
                      kserve: bool, entered_s: float | None = None) -> web.StreamResponse:
        entered_s = time.perf_counter() if entered_s is None else entered_s
        mode, *args = model.split("~")[0].split(":")
        self.counts[model] += 1
        if mode == "errors":
            status = ERROR_CYCLE[(self.counts[model] - 1) % len(ERROR_CYCLE)]
            if status != 200:
                return web.json_response({"error": "stub error"}, status=status)
        if mode == "cut":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if mode == "malformed":
            return web.Response(text="{not json", content_type="application/json")
        if mode in ("sleep", "slow"):
            await asyncio.sleep(float(args[0]) / (1e3 if mode == "sleep" else 1.0)
                                if args else 60.0)
        if mode == "batch":
            outside_s = float(args[4]) / 1e3 if len(args) > 4 else 0.0
            t0 = time.perf_counter()
            if len(args) > 4:
                await asyncio.sleep(outside_s)
            outside_late_s = max(time.perf_counter() - t0 - outside_s, 0.0)
            batcher = self.batchers.get(model)
            if batcher is None:
                given = [*args, *("8", "5", "5", "1")[len(args):]][:4]
                size, window, base, per = (float(a) for a in given)
                batcher = self.batchers[model] = Batcher(int(size), window / 1e3, base / 1e3,
                                                         per / 1e3)
            index = await batcher.submit()
            self.outside_late_s.setdefault(model, []).append(outside_late_s)
            self.request_batch.setdefault(model, []).append(index)
            self.request_held_s.setdefault(model, []).append(time.perf_counter() - entered_s)
        rows_out = rows + 1 if mode == "badshape" else rows
        return web.json_response(self._answer(model, rows_out) if kserve else
                                 {"outputs": [[0.5, 0.5]] * rows_out})

    async def infer(self, request: web.Request) -> web.StreamResponse:
        """``POST /v2/models/{name}/infer``."""
        entered_s = time.perf_counter()
        model = request.match_info["name"]
        if model.split("~")[0].split(":")[0] not in MODES:
            return web.json_response({"error": f"no model {model}"}, status=404)
        try:
            body = await request.json()
            tensor = body["inputs"][0]
            rows = int(tensor["shape"][0])
        except (ValueError, KeyError, IndexError, TypeError):
            return web.json_response({"error": "expected inputs: [{name, shape, datatype, "
                                      "data}]"}, status=400)
        return await self._behave(request, model, rows, kserve=True, entered_s=entered_s)

    async def predict(self, request: web.Request) -> web.StreamResponse:
        """``POST /predict`` with ``{"model": NAME, "inputs": [...]}``."""
        entered_s = time.perf_counter()
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "not JSON"}, status=400)
        items = body.get("inputs") if isinstance(body, dict) else None
        model = str(body.get("model", "instant")) if isinstance(body, dict) else "instant"
        rows = len(items) if isinstance(items, list) else 1
        return await self._behave(request, model, rows, kserve=False, entered_s=entered_s)

    async def metadata(self, request: web.Request) -> web.Response:
        """``GET /v2/models/{name}``."""
        model = request.match_info["name"]
        if model.split("~")[0].split(":")[0] not in MODES:
            return web.json_response({"error": f"no model {model}"}, status=404)
        return web.json_response({
            "name": model, "versions": ["1"], "platform": "servelab-stub",
            "inputs": [{"name": "input", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 2]}]})

    async def batches(self, request: web.Request) -> web.Response:
        """``GET /stub/batches/{name}``: the sizes of the batches a ``batch`` model ran, and
        how late each one's timers (window, service) fired, in seconds; per answered request
        (in the order answered), how late its outside sleep ended (s), its batch's index and
        how long the stub held it (s).
        """
        name = request.match_info["name"]
        batcher = self.batchers.get(name)
        return web.json_response({
            "sizes": batcher.sizes if batcher else [],
            "window_late_s": batcher.window_late_s if batcher else [],
            "service_late_s": batcher.service_late_s if batcher else [],
            "outside_late_s": self.outside_late_s.get(name, []),
            "request_batch": self.request_batch.get(name, []),
            "request_held_s": self.request_held_s.get(name, [])})

    async def ready(self, request: web.Request) -> web.Response:
        """Up."""
        return web.json_response({"ready": True})


def add_routes(application: web.Application) -> None:
    """Add the request-level routes to the stub's application."""
    stub = StubV2()
    application.router.add_post("/v2/models/{name}/infer", stub.infer)
    application.router.add_get("/v2/models/{name}", stub.metadata)
    application.router.add_get("/v2/health/ready", stub.ready)
    application.router.add_get("/v2/health/live", stub.ready)
    application.router.add_post("/predict", stub.predict)
    application.router.add_get("/stub/batches/{name}", stub.batches)
