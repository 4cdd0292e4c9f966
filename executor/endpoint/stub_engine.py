"""A stand-in LLM server whose engine steps take a roofline step model's time.

An OpenAI-compatible completions endpoint (token-id prompts, streamed, usage on every chunk,
like :mod:`executor.endpoint.stub`) in front of a continuous-batching engine that schedules
as vLLM's v1 scheduler does with chunked prefill: every step first serves the running
sequences (one token each for decodes, the next chunk of a prefill still in progress), then
admits waiting requests first come first served while ``max_num_seqs`` and the step's
``max_num_batched_tokens`` allow, the last one admitted possibly with a partial chunk. A step
lasts :meth:`RooflineStepModel.step_s` of its composition; then every sequence whose prompt
is complete emits a token. A request reaches the engine ``--request-delay-ms`` after the
server has read it (an API and tokenisation cost outside the steps, BLIS's α₀). So a bench
of this server measures a device whose step times and request overhead are known:
``servelab fit --bench`` must recover them (tests/sim/llm/test_fit_bench.py).

Run: ``python -m executor.endpoint.stub_engine --port N --model CONFIG --device cpu
--coefficients PATH [--max-num-seqs 16] [--max-num-batched-tokens 512]
[--request-delay-ms 0]``; prints ``ready``. It answers ``/v1/models``, ``/health``, a
``/metrics`` page in vLLM's format (its KV block count, so bench records the knobs),
``/steps`` (every step's composition, modelled and actual seconds) and ``/requests``
(every request's prompt and output lengths and its wall-clock times: read, queued in the
engine, first token about to be written: no client can have read it earlier).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass, field

from aiohttp import web

from sim.scenario.roofline.hardware import load_device
from sim.scenario.roofline.model import RooflineStepModel, load_coefficients
from sim.scenario.roofline.service import load_shape
from sim.serving.llm.step_model import Composition

BLOCK_SIZE = 16
NUM_BLOCKS = 100_000  # the stand-in never runs out of KV cache


@dataclass
class Seq:
    """One request in the engine."""

    prompt: int
    output: int
    computed: int = 0  # prompt tokens prefilled so far
    emitted: int = 0
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    times: dict[str, float] = field(default_factory=dict)  # wall clock (time.time())

    @property
    def decoding(self) -> bool:
        """Whether the whole prompt is in the cache."""
        return self.computed >= self.prompt


class Engine:
    """vLLM-style chunked-prefill continuous batching on a roofline step time."""

    def __init__(self, model: RooflineStepModel, max_num_seqs: int,
                 max_num_batched_tokens: int) -> None:
        self.model = model
        self.max_num_seqs, self.budget = max_num_seqs, max_num_batched_tokens
        self.waiting: list[Seq] = []
        self.running: list[Seq] = []
        self.wake = asyncio.Event()
        # every step: its composition, modelled and actual seconds (a loaded machine makes
        # the sleeps overshoot: GET /steps shows by how much)
        self.log: list[dict[str, float]] = []

    def submit(self, seq: Seq) -> None:
        """Queue a request."""
        self.waiting.append(seq)
        self.wake.set()

    def plan(self) -> tuple[list[tuple[Seq, int]], Composition]:
        """The next step's entries (sequence, tokens) and its composition."""
        budget, entries = self.budget, []
        for seq in self.running:
            if budget <= 0:
                break
            n = 1 if seq.decoding else min(seq.prompt - seq.computed, budget)
            entries.append((seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.pop(0)
            n = min(seq.prompt, budget)
            self.running.append(seq)
            entries.append((seq, n))
            budget -= n
        pre = dec = kv = ctx = chunks = sq = 0
        for seq, n in entries:
            if seq.decoding:
                dec += 1
                kv += seq.prompt + seq.emitted - 1
            else:
                pre, ctx, chunks, sq = pre + n, ctx + n * seq.computed, chunks + 1, sq + n * n
        return entries, Composition(pre, dec, kv, ctx, chunks, sq)

    async def run(self) -> None:
        """Step forever: plan, wait the step's modelled time, emit the tokens."""
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
            start = time.perf_counter()
            entries, comp = self.plan()
            due = start + self.model.step_s(comp)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            self.log.append({**asdict(comp), "modelled_s": due - start,
                             "actual_s": time.perf_counter() - start})
            for seq, n in entries:
                if not seq.decoding:
                    seq.computed += n
                    if not seq.decoding:
                        continue  # more of the prompt to prefill
                seq.emitted += 1
                seq.tokens.put_nowait(seq.emitted)
                if seq.emitted >= seq.output:
                    seq.tokens.put_nowait(None)
                    self.running.remove(seq)


def _chunk(i: int, prompt_tokens: int) -> bytes:
    body = {"id": "cmpl-stand-in", "object": "text_completion", "model": "stand-in",
            "choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": i,
                      "total_tokens": prompt_tokens + i}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def app(engine: Engine, model_name: str, request_delay_s: float = 0.0) -> web.Application:
    """The HTTP front of ``engine``; a request reaches it ``request_delay_s`` after it was
    read.
    """
    served: list[dict[str, float]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        read_s = time.time()
        prompt = body.get("prompt")
        n = int(body.get("max_tokens") or 16)
        if not isinstance(prompt, list) or not prompt or n < 1:
            return web.json_response({"error": {"message": "prompt: give a non-empty list of "
                                                "token ids; max_tokens >= 1"}}, status=400)
        seq = Seq(len(prompt), n)
        seq.times.update(read_s=read_s, prompt_tokens=len(prompt), max_tokens=n)
        served.append(seq.times)
        if request_delay_s > 0:
            await asyncio.sleep(request_delay_s)
        seq.times["queued_s"] = time.time()
        engine.submit(seq)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            while (i := await seq.tokens.get()) is not None:
                # stamped before the write, so no client reads the token before it: the
                # client's TTFT holds the engine's part (queued to this stamp) exactly
                seq.times.setdefault("first_token_s", time.time())
                await resp.write(_chunk(i, seq.prompt))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        return resp

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": model_name, "object": "model", "owned_by": "servelab-stand-in",
             "max_model_len": 8192}]})

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=(
            "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="
            f'"{BLOCK_SIZE}",enable_prefix_caching="False",num_gpu_blocks="{NUM_BLOCKS}"}} '
            f"1.0\nvllm:num_requests_running{{model_name=\"{model_name}\"}} "
            f"{float(len(engine.running))}\n"), content_type="text/plain")

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    async def steps(_request: web.Request) -> web.Response:
        return web.json_response(engine.log)

    async def requests(_request: web.Request) -> web.Response:
        return web.json_response(served)

    application = web.Application()
    application.router.add_post("/v1/completions", completions)
    application.router.add_get("/v1/models", models)
    application.router.add_get("/metrics", metrics)
    application.router.add_get("/health", health)
    application.router.add_get("/steps", steps)
    application.router.add_get("/requests", requests)
    return application


def main() -> None:
    """Serve on 127.0.0.1:PORT until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True, help="config.json or builtin:NAME")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--coefficients", default="builtin")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--request-delay-ms", type=float, default=0.0,
                        help="each request reaches the engine this long after it is read")
    args = parser.parse_args()
    if not math.isfinite(args.request_delay_ms) or args.request_delay_ms < 0:
        parser.error(f"--request-delay-ms {args.request_delay_ms}: must be a finite "
                     f"number >= 0 (ms)")
    device = load_device(args.device)
    step_model = RooflineStepModel(load_shape(args.model), device, args.tp,
                                   load_coefficients(args.coefficients, device.kind))

    async def serve() -> None:
        engine = Engine(step_model, args.max_num_seqs, args.max_num_batched_tokens)
        runner = web.AppRunner(app(engine, "stand-in", args.request_delay_ms / 1e3),
                               access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024).start()
        print("ready", flush=True)
        await engine.run()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
