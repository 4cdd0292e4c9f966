"""Request-level APIs for the open-loop client (:class:`executor.endpoint.client.OpenLoop`):
the bodies of ``kserve-v2`` and ``http-json`` requests, and :func:`send_request`, which POSTs
one and times its whole answer (no stream: the request's latency ends when the last byte of
its answer arrives, ``Outcome.chunk_s == [finish]``).

A request is ok when the server answered 200 with a JSON body of the expected shape (KServe
v2: an ``outputs`` list of tensors, each with ``name``, ``datatype``, ``shape`` and ``data``;
the first output's first dimension equal to the request's items when the input's was);
otherwise it failed with one of :data:`REQUEST_CAUSES`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from executor.endpoint.client import Job, Outcome, exchange
from executor.endpoint.http1 import Pool, Reply
from executor.endpoint.server_info import BAD_JSON, EndpointError
from sim.scenario.payload import PayloadCfg

REQUEST_APIS = ("kserve-v2", "http-json")
REQUEST_CAUSES = ("refused", "http_NNN", "timeout", "connection_cut", "malformed_json",
                  "bad_response", "client_error",
                  "answers_over_budget")  # http_NNN: the status, e.g. http_503
_NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
          "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
          "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


def request_path(api: str, payload: PayloadCfg, model: str | None) -> str:
    """The path requests are POSTed to."""
    if api == "kserve-v2":
        return f"/v2/models/{model}/infer"
    return payload.path


def _tensor_data(datatype: str, count: int, rng: np.random.Generator,
                 corpus: list[str]) -> list[Any]:
    if datatype == "BYTES":
        return [corpus[int(i)] for i in rng.integers(len(corpus), size=count)]
    if datatype == "BOOL":
        return rng.integers(0, 2, size=count).astype(bool).tolist()  # type: ignore[no-any-return]
    kind = np.dtype(_NUMPY[datatype])
    if kind.kind == "f":
        return rng.standard_normal(count).astype(kind).tolist()  # type: ignore[no-any-return]
    return rng.integers(0, 100, size=count).astype(kind).tolist()  # type: ignore[no-any-return]


# Every request's body is built and encoded before the run (no JSON work on the send path),
# so their sum is held in memory at once: above this the run is refused before a body is
# built (a shape of [1e9], or millions of requests of a large tensor, would take gigabytes)
MAX_BODIES_BYTES = 512 * 2**20
# bytes of JSON per value, measured on this module's data: a float32's repr ~21 (float16
# ~15, float64 ~22), an integer in 0-99 ~4, a boolean ~6, a corpus sentence ~133 (at most
# 368) plus its quotes and separator
_VALUE_BYTES = {"BYTES": 140, "BOOL": 6, "FP16": 22, "FP32": 22, "FP64": 22}


def _body_bytes(api: str, payload: PayloadCfg, size: int) -> int:
    """About how many bytes one request of ``size`` items encodes to (Python ints: a shape
    of [1e18, 1e9] does not overflow here).
    """
    if api == "kserve-v2":
        total = 64
        for tensor in payload.inputs:
            count = 1
            for d in tensor.shape:
                count *= size if d == -1 else d
            total += 64 + len(tensor.name) + count * _VALUE_BYTES.get(tensor.datatype, 5)
        return total

    def walk(node: Any) -> int:
        if isinstance(node, dict):
            return sum(len(json.dumps(k)) + 2 + walk(v) for k, v in node.items()) + 2
        if isinstance(node, list):
            return sum(walk(v) + 2 for v in node) + 2
        if node == "$texts":
            return size * _VALUE_BYTES["BYTES"]
        if node == "$text":
            return _VALUE_BYTES["BYTES"]
        return len(json.dumps(node))

    return walk(payload.body if payload.body is not None else {"inputs": "$texts"})


def check_bodies(api: str, payload: PayloadCfg, counts: Mapping[int, int], what: str) -> None:
    """Refuse a run whose request bodies (``counts``: requests by size) would take more than
    :data:`MAX_BODIES_BYTES` of memory.

    Raises:
        EndpointError: too large; the line names the payload and the requests.
    """
    total = sum(_body_bytes(api, payload, int(size)) * int(n) for size, n in counts.items())
    if total > MAX_BODIES_BYTES:
        field = ("payload.inputs (shape " + ", ".join(str(t.shape) for t in payload.inputs)
                 + ")" if api == "kserve-v2" else "payload.body ($texts: one sentence per item)")
        raise EndpointError(f"{field} x {what}: the request bodies, built before the run, "
                            f"would take about {total / 2**30:.3g} GiB of memory (at most "
                            f"{MAX_BODIES_BYTES // 2**20} MiB): send smaller tensors or fewer "
                            "requests")


def kserve_body(payload: PayloadCfg, job: Job, rng: np.random.Generator,
                corpus: list[str]) -> dict[str, Any]:
    """A v2 inference request for ``job`` (``job.prompt_tokens`` holds its size)."""
    inputs = []
    for tensor in payload.inputs:
        shape = [job.prompt_tokens if d == -1 else d for d in tensor.shape]
        count = int(np.prod(shape))
        inputs.append({"name": tensor.name, "shape": shape, "datatype": tensor.datatype,
                       "data": _tensor_data(tensor.datatype, count, rng, corpus)})
    return {"id": str(job.index), "inputs": inputs}


def _fill(node: Any, job: Job, rng: np.random.Generator, corpus: list[str]) -> Any:
    if isinstance(node, dict):
        return {k: _fill(v, job, rng, corpus) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, job, rng, corpus) for v in node]
    if node == "$size":
        return job.prompt_tokens
    if node == "$id":
        return job.index
    if node == "$text":
        return _tensor_data("BYTES", 1, rng, corpus)[0]
    if node == "$texts":
        return _tensor_data("BYTES", job.prompt_tokens, rng, corpus)
    return node


def json_body(payload: PayloadCfg, job: Job, rng: np.random.Generator,
              corpus: list[str]) -> dict[str, Any]:
    """The ``http-json`` body: the template with its placeholders filled (default template:
    ``{"inputs": "$texts"}``).
    """
    template = payload.body if payload.body is not None else {"inputs": "$texts"}
    filled = _fill(template, job, rng, corpus)
    assert isinstance(filled, dict)
    return filled


def check_kserve_answer(answer: Any, size: int | None) -> str:
    """Why ``answer`` is not a valid v2 inference response ('' when it is)."""
    if not isinstance(answer, dict):
        return "the answer is not a JSON object"
    outputs = answer.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        return "the answer has no 'outputs' list"
    for i, out in enumerate(outputs):
        if not isinstance(out, dict) or not {"name", "datatype", "shape", "data"} <= set(out):
            return f"outputs[{i}] lacks name, datatype, shape or data"
        shape = out["shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return f"outputs[{i}].shape is not a list of ints"
        data = out["data"]
        if isinstance(data, list) and shape and len(data) not in (
                int(np.prod(shape)), shape[0]):
            return f"outputs[{i}].data has {len(data)} values for shape {shape}"
    first = outputs[0]["shape"]
    if size is not None and first and first[0] != size:
        return f"outputs[0].shape {first}: expected {size} rows, one per item sent"
    return ""


def encode(body: dict[str, Any]) -> tuple[bytes, int | None]:
    """A request body as sent, and its rows (:func:`_rows`) to check the answer against."""
    return json.dumps(body).encode(), _rows(body)


async def send_request(pool: Pool, request: bytes, job: Job, out: Outcome, t0: float,
                       kserve: bool, rows: int | None, timeout_s: float | None) -> None:
    """POST one request and record its answer into ``out`` (never raises but on cancel).

    ``kserve``: validate the answer as a v2 inference response of ``rows`` rows.
    """
    reply = Reply()
    try:
        if await exchange(pool, request, reply, out, t0, timeout_s, "connection_cut"):
            _read_answer(reply, out, t0, kserve, rows)
    finally:  # done with the body: the pool's budget gets its bytes back
        reply.release()


def _read_answer(reply: Reply, out: Outcome, t0: float, kserve: bool,
                 rows: int | None) -> None:
    """Record a complete 200 answer into ``out``: ok, or failed as ``malformed_json`` or
    ``bad_response``.
    """
    done = reply.pieces[-1][0] - t0 if reply.pieces else time.perf_counter() - t0
    raw = reply.body()
    try:
        answer = json.loads(raw)
    except BAD_JSON:
        out.status, out.cause = "failed", "malformed_json"
        out.error = f"the answer is not JSON: {raw[:60]!r}"
        return
    problem = check_kserve_answer(answer, rows) if kserve else ""
    if problem:
        out.status, out.cause, out.error = "failed", "bad_response", problem
        return
    out.chunk_s.append(done)
    out.chunk_tokens.append(0)
    out.status = "ok"


def request_sender(bodies: Mapping[int, dict[str, Any]], kserve: bool
                   ) -> tuple[Callable[[Job], bytes], Callable[..., Awaitable[None]]]:
    """The ``make_body`` and ``sender`` an :class:`executor.endpoint.client.OpenLoop` takes for
    request-level jobs whose bodies (by job index) are ``bodies``; ``kserve``: validate the
    answers as v2 inference responses.
    """
    encoded = {i: encode(b) for i, b in bodies.items()}

    async def sender(pool: Pool, request: bytes, job: Job, out: Outcome, t0: float,
                     _chat: bool, timeout_s: float | None) -> None:
        await send_request(pool, request, job, out, t0, kserve, encoded[job.index][1],
                           timeout_s)

    return (lambda job: encoded[job.index][0]), sender


def _rows(body: dict[str, Any]) -> int | None:
    """The first input's first dimension (the items sent), when the body has one."""
    inputs = body.get("inputs")
    if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict):
        shape = inputs[0].get("shape")
        if isinstance(shape, list) and shape and isinstance(shape[0], int):
            return int(shape[0])
    return None
