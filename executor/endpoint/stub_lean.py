"""The lean stub for the client-overhead benchmark (``benchmarks/bench_client.py``): the
``instant`` behaviour of :mod:`executor.endpoint.stub` and :mod:`executor.endpoint.stub_v2`
(every token, or the whole v2 answer, at once) served by a bare asyncio protocol, so that the
server is not what limits the rate the client is measured at.

The stub (aiohttp: request objects, routing, a stream response per request) spends more CPU
per request than the client it is meant to measure; this one parses the request line, the
``Content-Length`` and the JSON body, and writes one pre-built answer. It keeps its own
timestamps: ``GET /stub/log`` returns, per request since the last call, a key (the hash of
the prompt's token ids, or the v2 request's ``id``), the time its last byte was read
(``recv_s``) and the time its answer was written (``sent_s``), in ``time.perf_counter``
seconds (``CLOCK_MONOTONIC``: the same clock in every process), so the benchmark can take
the server's own time out of each request's latency.

Routes: ``GET /v1/models``, ``/metrics``, ``/health``, ``/stub/log``; ``POST /v1/completions``,
``/v1/chat/completions`` (SSE, chunked, usage on every chunk as vLLM's
``continuous_usage_stats``), ``/v2/models/{name}/infer``, ``/predict``; ``GET /v2/models/{name}``.
Run: ``python -m executor.endpoint.stub_lean --port N``; it prints ``ready`` when serving.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
from typing import Any, cast

from executor.endpoint.stub import METRICS, _chunk

MODELS = json.dumps({"object": "list", "data": [
    {"id": "instant", "object": "model", "owned_by": "servelab-stub",
     "max_model_len": 4096}]}).encode()


def _response(status: int, body: bytes, kind: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
            % (status, b"OK" if status == 200 else b"Error", kind, len(body))) + body


def _sse(n: int, prompt_tokens: int, chat: bool) -> bytes:
    body = b"".join(_chunk(i, prompt_tokens, chat) for i in range(n)) + b"data: [DONE]\n\n"
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(body)) + body + b"\r\n0\r\n\r\n"


def _v2_answer(rows: int) -> bytes:
    return _response(200, json.dumps({"model_name": "instant", "model_version": "1",
                                      "outputs": [{"name": "output", "datatype": "FP32",
                                                   "shape": [rows, 2],
                                                   "data": [0.5] * (rows * 2)}]}).encode())


class Log:
    """Per request: key, recv_s, sent_s."""

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.recv_s: list[float] = []
        self.sent_s: list[float] = []
        self.cache: dict[tuple[Any, ...], bytes] = {}

    def take(self) -> bytes:
        """The log as JSON, emptied."""
        out = json.dumps({"keys": self.keys, "recv_s": self.recv_s, "sent_s": self.sent_s})
        self.keys, self.recv_s, self.sent_s = [], [], []
        return out.encode()


class _Server(asyncio.Protocol):
    def __init__(self, log: Log) -> None:
        self.log = log
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buf = self.buf + data if self.buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            length = 0
            low = head.lower()
            at = low.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = low.find(b"\r\n", at + 2)
                length = int(low[at + 17:stop if stop >= 0 else None].strip())
            if len(buf) < end + 4 + length:
                break
            body = buf[end + 4:end + 4 + length]
            buf = buf[end + 4 + length:]
            self._answer(head.split(b" ", 2), body, now)
        self.buf = buf

    def _answer(self, line: list[bytes], body: bytes, now: float) -> None:
        assert self.transport is not None
        method, path = line[0], line[1] if len(line) > 1 else b"/"
        key = -1
        if method == b"POST":
            request = json.loads(body)
            if path.endswith(b"/completions"):
                chat = path.endswith(b"/chat/completions")
                n = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
                prompt = request.get("messages" if chat else "prompt")
                tokens = len(prompt) if isinstance(prompt, list) and not chat else 1
                key = hash(tuple(prompt)) if isinstance(prompt, list) and not chat else -1
                cached = (n, tokens, chat)
                answer = self.log.cache.get(cached)
                if answer is None:
                    answer = self.log.cache[cached] = _sse(n, tokens, chat)
            else:  # v2 infer or /predict
                inputs = request.get("inputs")
                if path.endswith(b"/infer"):
                    rows = int(inputs[0]["shape"][0])
                    key = int(request.get("id", -1))
                else:
                    rows = len(inputs) if isinstance(inputs, list) else 1
                answer = self.log.cache.get((rows,)) or self.log.cache.setdefault(
                    (rows,), _v2_answer(rows))
            self.transport.write(answer)
            self.log.keys.append(key)
            self.log.recv_s.append(now)
            self.log.sent_s.append(time.perf_counter())
            return
        if path == b"/v1/models":
            self.transport.write(_response(200, MODELS))
        elif path == b"/metrics":
            self.transport.write(_response(200, METRICS.encode(), b"text/plain"))
        elif path == b"/stub/log":
            self.transport.write(_response(200, self.log.take()))
        elif path.startswith(b"/v2/models/"):
            self.transport.write(_response(200, json.dumps({
                "name": "instant", "versions": ["1"], "platform": "servelab-stub",
                "inputs": [{"name": "input", "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 2]}],
            }).encode()))
        else:
            self.transport.write(_response(200 if path.startswith(b"/health") else 404, b"{}"))


def main() -> None:
    """Serve on 127.0.0.1:PORT until killed (uvloop's event loop when installed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    log = Log()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(lambda: _Server(log), "127.0.0.1", port, backlog=4096)
        gc.freeze()  # no collection pauses in the answers' times (the log only grows)
        gc.disable()
        print("ready", flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop
        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve())


if __name__ == "__main__":
    main()
