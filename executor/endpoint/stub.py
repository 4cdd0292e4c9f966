"""A small OpenAI-compatible streaming server for the tests (the client-overhead benchmark
uses its lean twin, :mod:`executor.endpoint.stub_lean`).

It streams exactly the tokens asked for (``max_tokens``), one SSE chunk each, with usage on
every chunk as vLLM's ``continuous_usage_stats`` does. The model name chooses a behaviour,
``MODE[:A[:B]][#tag]`` (the tag only keeps counters apart):

* ``instant``: every token at once;
* ``timed:TTFT_MS:ITL_MS``: the first token TTFT_MS after the request, then one every ITL_MS;
* ``slowing:TTFT_MS:ITL_MS:FACTOR:AFTER``: as ``timed``, but from this model name's AFTER-th
  request on both times are FACTOR times longer (a machine loaded partway; no CPU involved);
* ``errors``: answers 200, 500, 429, 503, 200, … in turn (a counter per model name);
* ``cut``: closes the connection after half the tokens;
* ``malformed``: the second chunk is not JSON;
* ``few`` / ``many``: one token fewer / more than asked, then ``[DONE]``;
* ``slow:SECONDS``: sends the headers, then waits that long before the first token.

Its usage counts a completion's token-id prompt as its length, and a chat prompt as
:data:`CHAT_TEMPLATE_TOKENS` plus one token per whitespace-separated word of the messages (a
stand-in for a chat template and a tokenizer). ``"stream": false`` gets one JSON answer.

Run it with ``python -m executor.endpoint.stub --port N``; it prints ``ready`` when serving.
It also answers ``/health``, ``/v1/models`` and a ``/metrics`` page in vLLM's format, and
the request-level routes of :mod:`executor.endpoint.stub_v2` (KServe v2, plain JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import Counter

from aiohttp import web

from executor.endpoint.stub_v2 import add_routes as add_v2_routes

ERROR_CYCLE = (200, 500, 429, 503)
CHAT_TEMPLATE_TOKENS = 7  # the stub's chat "template": what vLLM's would add around a message
METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="False",num_gpu_blocks="1024"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="stub"} 0.0
"""


def _chunk(i: int, prompt_tokens: int, chat: bool) -> bytes:
    choice = ({"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None} if chat
              else {"index": 0, "text": f"t{i} ", "finish_reason": None})
    body = {"id": "cmpl-stub", "object": "text_completion", "model": "stub",
            "choices": [choice], "usage": {"prompt_tokens": prompt_tokens,
                                           "completion_tokens": i + 1,
                                           "total_tokens": prompt_tokens + i + 1}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Stub:
    """The stub's request handlers and per-model counters."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """Stream the answer the model name's behaviour calls for."""
        t0 = time.perf_counter()
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        model = str(body.get("model", "instant"))
        mode, *args = model.split("#")[0].split(":")
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt = body.get("prompt") if not chat else body.get("messages")
        prompt_tokens = len(prompt) if isinstance(prompt, list) and not chat else 1
        if chat:  # a chat template of CHAT_TEMPLATE_TOKENS, one token per word of the text
            prompt_tokens = CHAT_TEMPLATE_TOKENS + sum(
                len(str(m.get("content", "")).split()) for m in prompt or []
                if isinstance(m, dict))
        self.counts[model] += 1
        nth = self.counts[model]  # this request's number under its model name
        if body.get("stream") is False:  # one JSON answer, with usage
            return web.json_response({
                "id": "cmpl-stub", "object": "chat.completion" if chat else "text_completion",
                "model": model, "choices": [{"index": 0, "finish_reason": "length", **(
                    {"message": {"role": "assistant", "content": "t0"}} if chat else
                    {"text": "t0"})}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                          "total_tokens": prompt_tokens + n}})
        if mode == "errors":
            status = ERROR_CYCLE[(self.counts[model] - 1) % len(ERROR_CYCLE)]
            if status != 200:
                return web.json_response({"error": {"message": "stub error", "code": status}},
                                         status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "slow":
            await asyncio.sleep(float(args[0]) if args else 60.0)
        count = n - 1 if mode == "few" else n + 1 if mode == "many" else n
        # a client that went away (cancelled at its deadline) needs no answer
        with contextlib.suppress(ConnectionError):
            await self._stream(resp, request, mode, n, count, prompt_tokens, chat, t0, args,
                               nth)
        return resp

    async def _stream(self, resp: web.StreamResponse, request: web.Request, mode: str, n: int,
                      count: int, prompt_tokens: int, chat: bool, t0: float,
                      args: list[str], nth: int = 0) -> None:
        if mode == "instant":  # every chunk in one write
            await resp.write(b"".join(_chunk(i, prompt_tokens, chat) for i in range(count))
                             + b"data: [DONE]\n\n")
            await resp.write_eof()
            return
        timed = mode in ("timed", "slowing")
        ttft_s = float(args[0]) / 1e3 if timed and args else 0.0
        itl_s = float(args[1]) / 1e3 if timed and len(args) > 1 else 0.0
        if mode == "slowing" and nth >= int(args[3]):
            ttft_s, itl_s = ttft_s * float(args[2]), itl_s * float(args[2])
        for i in range(count):
            if timed:
                due = t0 + ttft_s + i * itl_s
                await asyncio.sleep(max(due - time.perf_counter(), 0.0))
            if mode == "cut" and i == n // 2:
                assert request.transport is not None
                request.transport.close()
                return
            if mode == "malformed" and i == 1:
                await resp.write(b"data: {not json\n\n")
                continue
            await resp.write(_chunk(i, prompt_tokens, chat))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()

    async def models(self, request: web.Request) -> web.Response:
        """The model list."""
        return web.json_response({"object": "list", "data": [
            {"id": "instant", "object": "model", "owned_by": "servelab-stub",
             "max_model_len": 4096}]})

    async def metrics(self, request: web.Request) -> web.Response:
        """A vLLM-format metrics page."""
        return web.Response(text=METRICS, content_type="text/plain")

    async def health(self, request: web.Request) -> web.Response:
        """Up."""
        return web.Response(text="")


def app() -> web.Application:
    """The stub's aiohttp application."""
    stub = Stub()
    application = web.Application()
    application.router.add_post("/v1/completions", stub.completions)
    application.router.add_post("/v1/chat/completions", stub.completions)
    application.router.add_get("/v1/models", stub.models)
    application.router.add_get("/metrics", stub.metrics)
    application.router.add_get("/health", stub.health)
    add_v2_routes(application)  # KServe v2 and plain JSON (executor.endpoint.stub_v2)
    return application


def main() -> None:
    """Serve on 127.0.0.1:PORT until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port

    async def serve() -> None:
        runner = web.AppRunner(app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
