"""``bench(scenario, endpoint) -> LlmResult``: measure a server behind an OpenAI-compatible
endpoint on the scenario's own arrival schedule, and write the run directory ``live`` writes.

The requests (arrival times, prompt and output lengths) are
:func:`sim.drivers.llm_simulate.llm_schedule`'s,
the schedule ``simulate`` and ``live`` use. Prompts are token ids (``/v1/completions``) of
exactly the scenario's length, drawn at random per request so the server's prefix cache sees
no accidental sharing, except for a hash-block trace (``workload.kind: hash_trace``), whose
prompts realise the trace's block ids (:mod:`executor.endpoint.hash_prompts`) so the server's
prefix cache sees the trace's sharing; outputs are forced to the scenario's length (``max_tokens``,
``ignore_eos``). The tables and summary are the live engine's
(:func:`sim.metrics.llm.summarize_llm`), with ``driver = bench``; the server's steps are not
visible, so ``steps.parquet`` and ``queue.parquet`` are empty, and ITL is re-computed per
stream chunk as ``vllm bench serve`` computes it (see :mod:`executor.endpoint.client`).
"""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import math
import resource
import secrets
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from executor.endpoint import chat_prompts, server_info
from executor.endpoint.chat_prompts import ChatPrompts
from executor.endpoint.client import APIS, Job, OpenLoop, Outcome, payload
from executor.endpoint.hash_prompts import hash_prompts
from executor.endpoint.server_info import EndpointError
from sim.drivers.llm_simulate import LlmResult, horizon_s, llm_schedule
from sim.metrics.llm import summarize_llm
from sim.metrics.rundir import run_meta
from sim.metrics.summary import _stats_ms
from sim.metrics.window import default_drain_s
from sim.scenario.hash_trace import read_hash_trace
from sim.scenario.llm import HashTraceCfg, LlmScenario, load_llm_scenario

LAG_FLAG_MS = 5.0
STEP_COLUMNS = ("replica", "start_s", "duration_s", "prefill_tokens", "prefill_context",
                "decode_seqs", "kv_tokens", "num_seqs", "kv_blocks_used", "waiting", "preempted")


def make_jobs(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, api: str,
              seed: int, token_ids: tuple[int, int], chat: ChatPrompts | None = None,
              prompts: list[list[int]] | None = None, salt: int = 0) -> list[Job]:
    """One job per request: token-id prompts of exactly the scenario's length, random unless
    ``prompts`` gives them (a hash-block trace's). Chat: a message of ``chat``'s one-token
    units, as many as the length less the chat template's overhead; without ``chat``, that
    many words, whose count the server's tokenizer decides. ``salt`` (0: none) draws other
    random ids from the same seed: a server's prefix cache keeps the prompts of earlier runs,
    so repeats of one scenario must not send the same ones.
    """
    rng = np.random.default_rng([seed, 29, salt] if salt else [seed, 29])
    lo, hi = token_ids
    jobs = []
    for i, (t, p, o) in enumerate(zip(arrival_s, prompt, output, strict=True)):
        ids = prompts[i] if prompts is not None else rng.integers(lo, hi, size=int(p)).tolist()
        if api == "openai-completions":
            text: list[int] | str = ids
        elif chat is not None:
            text = chat.text(int(p), rng)
        else:
            text = " ".join(f"w{v}" for v in ids)
        jobs.append(Job(i, float(t), text, int(p), int(o)))
    return jobs


def trace_prompts(scn: LlmScenario, rows: np.ndarray | None, prompt: np.ndarray,
                  token_ids: tuple[int, int], content_seed: int | None
                  ) -> list[list[int]] | None:
    """A hash-block trace's prompts, realising its block ids (None for other workloads)."""
    cfg = scn.workload
    if not isinstance(cfg, HashTraceCfg) or rows is None:
        return None
    trace = read_hash_trace(cfg.path, cfg.format, cfg.block_size)
    seed = scn.seed if content_seed is None else content_seed
    return hash_prompts([trace.hash_ids[i] for i in rows], prompt, trace.block_size,
                        token_ids, seed)


def preflight(url: str, api: str, model: str, finish: bool = False) -> None:
    """One tiny request before the run: a wrong path or a refused body is one clear error
    instead of a run of failures.

    By default it hangs up once it has the status: the stream itself (slow, broken) is the
    run's to measure. The server then aborts the request, and whether its engine admitted it
    first is a race: vLLM counts an admitted request's prompt in
    ``vllm:prefix_cache_queries_total``, an aborted waiting one in nothing. ``finish`` reads
    the stream to its end instead, so the request is done, and counted, when this returns.

    Raises:
        EndpointError: not reachable, 404, or the server refuses the request's fields;
            with ``finish``, a stream that breaks.
    """
    body = payload(api, model, Job(-1, 0.0, [11] if api == "openai-completions" else "hi",
                                   1, 1), None)
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        # 60 s per socket read is a hang guard: a 1-token request takes well under a second
        with urllib.request.urlopen(req, timeout=60) as resp:
            if finish:
                _read_to_end(resp, url)
    except urllib.error.HTTPError as exc:
        detail = " ".join(exc.read(160).decode(errors="replace").split())[:160]
        if exc.code == 404:
            raise EndpointError(f"POST {url}: 404 Not Found — is --endpoint the server's base "
                                "URL (http://HOST:PORT) and --api "
                                f"({', '.join(APIS)}) the one it serves? {detail}") from None
        raise EndpointError(f"POST {url}: HTTP {exc.code} for a 1-token test request "
                            f"(model {model!r}): {detail}") from None
    except server_info.HTTP_ERRORS as exc:
        raise EndpointError(server_info.unreachable(url, exc)) from None


def _read_to_end(resp: http.client.HTTPResponse, url: str) -> None:
    """Read a response's body to its end.

    Raises:
        EndpointError: the stream broke before its end.
    """
    try:
        server_info.read_capped(resp, f"POST {url}")
    except (OSError, http.client.HTTPException) as exc:
        raise EndpointError(f"POST {url}: the 1-token test request's stream broke: "
                            f"{server_info._reason(exc)}") from None


def _outcome_tables(outs: list[Outcome], jobs: list[Job], priority: np.ndarray,
                    ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, pd.DataFrame]:
    """Requests (live's columns + the client's), token_s, token_offset, tokens."""
    n = len(outs)
    want = np.array([jobs[o.index].output_tokens for o in outs], dtype=np.int64)
    offset = np.concatenate(([0], np.cumsum(want))).astype(np.int64)
    token_s = np.full(int(offset[-1]), np.nan)
    ids, index, times, chunk = [], [], [], []
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    for k, o in enumerate(outs):
        j = 0
        for c, (t, m) in enumerate(zip(o.chunk_s, o.chunk_tokens, strict=True)):
            for _ in range(m):
                if j < want[k]:
                    token_s[offset[k] + j] = t
                ids.append(k)
                index.append(j)
                times.append(t)
                chunk.append(c)
                j += 1
        if o.chunk_s:
            first[k] = o.chunk_s[0]
            if o.status == "ok":
                finish[k] = o.chunk_s[-1]
    sent = np.array([o.sent_s for o in outs])
    started = np.array([o.started_s for o in outs])
    requests = pd.DataFrame({
        "id": np.array([o.index for o in outs], dtype=np.int64),
        "replica": np.zeros(n, dtype=np.int16),
        "priority": priority[[o.index for o in outs]] if n else np.zeros(0, dtype=np.int8),
        # vllm bench serve's clock start; a request still waiting for a --max-concurrency
        # slot when the run ended counts from when its turn came
        "arrival_s": np.where(np.isfinite(sent), sent, started),
        "prompt_tokens": [jobs[o.index].prompt_tokens for o in outs],
        "output_tokens": want, "first_token_s": first, "finish_s": finish,
        "status": pd.Categorical([o.status for o in outs]),
        "reason": [o.cause for o in outs], "preemptions": np.zeros(n, dtype=np.int64),
        "work_tokens": [jobs[o.index].prompt_tokens + int(w) - 1 for o, w in zip(
            outs, want, strict=True)],
        "scheduled_s": [o.scheduled_s for o in outs], "send_lag_s": started - np.array(
            [o.scheduled_s for o in outs]), "client_wait_s": sent - started,
        "received_tokens": [o.received for o in outs],
        "server_prompt_tokens": [o.server_prompt_tokens for o in outs],
        "http_status": np.array([o.http_status for o in outs], dtype=np.int16),
        "error": [o.error for o in outs]})
    tokens = pd.DataFrame({"id": np.array(ids, dtype=np.int32),
                           "index": np.array(index, dtype=np.int32),
                           "time_s": np.array(times, dtype=float),
                           "chunk": np.array(chunk, dtype=np.int32)})
    return requests, token_s, offset, tokens


def chunk_itl_s(outs: list[Outcome], lo_s: float) -> np.ndarray:
    """Gaps between consecutive choice chunks of the ok requests sent at or after ``lo_s``
    (``vllm bench serve``'s ITL: per chunk).
    """
    gaps = [np.diff(o.chunk_s) for o in outs if o.status == "ok" and o.sent_s >= lo_s]
    return np.concatenate(gaps) if gaps else np.empty(0)


def _mismatches(requests: pd.DataFrame) -> int:
    """Requests whose server-reported prompt tokens differ from the scenario's (where the
    server reported them).
    """
    told = requests["server_prompt_tokens"].to_numpy(np.int64) if len(requests) else \
        np.empty(0, np.int64)
    want = requests["prompt_tokens"].to_numpy(np.int64) if len(requests) else told
    return int(((told >= 0) & (told != want)).sum())


def bench_summary(requests: pd.DataFrame, token_s: np.ndarray, offset: np.ndarray,
                  outs: list[Outcome], *, warmup_s: float, window_end_s: float, end_s: float,
                  ttft_slo_ms: float | None, tpot_slo_ms: float | None,
                  cpu_share: float) -> dict[str, Any]:
    """Live's summary of the measured requests, plus the client's own health."""
    steps = pd.DataFrame({c: np.empty(0) for c in STEP_COLUMNS})
    queue = pd.DataFrame({"time_s": np.empty(0), "queue": np.empty(0, dtype=np.int32),
                          "length": np.empty(0, dtype=np.int64)})
    summary = summarize_llm(requests, token_s, offset, steps, queue, warmup_s=warmup_s,
                            horizon_s=window_end_s, end_s=end_s, num_blocks=None,
                            ttft_slo_ms=ttft_slo_ms, tpot_slo_ms=tpot_slo_ms, driver="bench")
    summary["itl_ms"] = _stats_ms(chunk_itl_s(outs, warmup_s))
    summary["utilization"] = None  # the server's busy time is not visible from outside
    lag = requests["send_lag_s"].to_numpy(float)
    lag = lag[np.isfinite(lag)]
    lag_ms = _stats_ms(lag)
    failed = requests[requests["status"].astype(str) == "failed"]
    causes = failed["reason"].value_counts().to_dict()
    p99 = lag_ms.get("p99")
    summary["client"] = {
        "send_lag_ms": lag_ms,
        "send_lag_flagged": bool(p99 is not None and math.isfinite(p99) and p99 > LAG_FLAG_MS),
        "send_lag_limit_ms": LAG_FLAG_MS,
        "cpu_share": cpu_share,
        "errors_by_cause": {str(c): int(v) for c, v in sorted(causes.items()) if v},
        "tokens_received": int(requests["received_tokens"].sum()) if len(requests) else 0,
        "prompt_token_mismatches": _mismatches(requests),
    }
    return summary


# What a bench holds per request and per token (measured on this client: a Job, an Outcome
# and their table rows ~2 KiB; a planned output token's time slot and its chunk time ~48 B; a
# prompt token's id in the job's list and in the encoded body ~16 B)
BENCH_BYTES_PER_REQUEST = 2048.0
BENCH_BYTES_PER_OUTPUT_TOKEN = 48.0
BENCH_BYTES_PER_PROMPT_TOKEN = 16.0


def check_model_name(model: str | None) -> None:
    """``--model``: None (the server's first) or a name.

    Raises:
        EndpointError: an empty or blank name (a server would answer 404, or some stand-in
            its default model, and the run would measure that).
    """
    if model is not None and not model.strip():
        raise EndpointError(f"--model {model!r}: give the served model's name, or leave "
                            "--model out (the first the server lists, or payload.model)")


def check_request_timeout(request_timeout_s: float | None) -> None:
    """``--request-timeout-s``: None (no limit) or a number > 0.

    Raises:
        EndpointError: 0, negative or nan (every request would fail, or none time out).
    """
    if request_timeout_s is not None and not request_timeout_s > 0:
        raise EndpointError(f"--request-timeout-s {request_timeout_s:g}: must be > 0")


def check_bench_memory(scn: Any, prompt: np.ndarray | None = None,
                       output: np.ndarray | None = None) -> None:
    """Refuse a bench whose plan alone would take more than the commands' memory budget
    (:data:`sim.experiments.preflight.BUDGET`, 4 GiB): before the schedule is drawn, by the
    simulator's estimate of the scenario (``n_requests: 1e9`` is refused before 7 GiB of
    arrival times are); with the drawn ``prompt`` and ``output`` token counts, by this
    client's own costs. The time is not checked: a bench lasts its schedule's real span.

    Raises:
        EndpointError: over the budget; the line names the field that drives the cost.
    """
    from sim.experiments.preflight import BUDGET, _bytes, estimate_run

    if prompt is None or output is None:
        est = estimate_run(scn)
        memory, driver, detail = est.memory_bytes, est.driver, est.detail
    else:
        n, p_tok, o_tok = len(prompt), float(np.sum(prompt)), float(np.sum(output))
        parts = {"workload.n_requests": n * BENCH_BYTES_PER_REQUEST,
                 "workload.prompt_tokens": p_tok * BENCH_BYTES_PER_PROMPT_TOKEN,
                 "workload.output_tokens": o_tok * BENCH_BYTES_PER_OUTPUT_TOKEN}
        memory = sum(parts.values())
        driver = max(parts, key=lambda k: parts[k])
        detail = f"{n} requests, {p_tok:.3g} prompt and {o_tok:.3g} output tokens"
    if memory > BUDGET.memory_bytes:
        raise EndpointError(f"{driver}: this bench would hold about {_bytes(memory)} in "
                            f"memory ({detail}), beyond the budget of "
                            f"{_bytes(BUDGET.memory_bytes)}; lower {driver}")


def bench(scenario: Any, endpoint: str, *, api: str = "openai-completions",
          model: str | None = None, overrides: list[str] | dict[str, Any] | None = None,
          max_concurrency: int | None = None, drain_timeout_s: float | None = None,
          request_timeout_s: float | None = None, token_ids: tuple[int, int] = (10, 250),
          content_seed: int | None = None, prompt_salt: int | None = None,
          handle_signals: bool = False, spin_s: float = 0.0, finish_preflight: bool = False,
          on_done: Callable[[Outcome], None] | None = None,
          on_client: Callable[[OpenLoop], None] | None = None) -> LlmResult:
    """Measure ``endpoint`` on an LLM scenario's schedule.

    Args:
        scenario: An LLM scenario (object, dict, path or ``builtin:NAME``).
        endpoint: The server's base URL (``http://HOST:PORT``).
        api: ``openai-completions`` (token-id prompts, exact lengths) or ``openai-chat``.
        model: The model name to send; default: the first of ``/v1/models``.
        overrides: Dotted-key scenario overrides.
        max_concurrency: At most this many requests in flight (None: open loop).
        drain_timeout_s: Stop this long after the horizon; the rest stays in flight.
            Default: live's (the window's length, else 60 s).
        request_timeout_s: Fail a request not complete after this long (cause ``timeout``).
        token_ids: Prompt token ids are drawn from ``[lo, hi)``.
        content_seed: A hash-block trace's block contents are seeded by this (default: the
            scenario's seed); a new value makes every block new to the server's cache.
        prompt_salt: Varies the random prompts' ids (:func:`make_jobs`); None: a fresh one
            per run (recorded in ``meta.json``), so that no run finds the prompts of an
            earlier one in the server's prefix cache; 0: the seed's own ids.
        handle_signals: SIGINT and SIGTERM stop the run; what was measured is kept.
        spin_s: The client's busy wait before each send (:class:`OpenLoop`'s ``spin_s``).
        finish_preflight: The preflight request runs to its end (:func:`preflight`'s
            ``finish``), so the server counts it, settled, before the run: for a caller
            that takes counter deltas across the whole call.
        on_done: Called after each request (the progress bar).
        on_client: Called with the client before it starts (tests stop runs with it).

    Raises:
        EndpointError: the endpoint is unreachable, answers 404 or refuses the request.
        UserError: a bad scenario or flag.
    """
    if api not in APIS:
        raise EndpointError(f"--api {api!r}: allowed: {', '.join(APIS)}")
    if max_concurrency is not None and max_concurrency < 1:
        raise EndpointError(f"--max-concurrency {max_concurrency}: must be >= 1")
    lo, hi = token_ids
    if not 0 <= lo < hi <= 2**31:  # ids are drawn as int64; vocabularies are far smaller
        raise EndpointError(f"--token-ids {lo}:{hi}: need 0 <= LO < HI <= {2**31}")
    check_model_name(model)
    scn = load_llm_scenario(scenario, overrides)
    drain = default_drain_s(scn) if drain_timeout_s is None else drain_timeout_s
    if not drain > 0:  # nan too: a deadline of nan never ends the drain
        raise EndpointError(f"--drain-timeout-s {drain:g}: must be > 0")
    check_request_timeout(request_timeout_s)
    check_bench_memory(scn)
    base = server_info.base_url(endpoint)
    listed = server_info.models(base)
    names = [str(m.get("id")) for m in (listed or {}).get("data", []) if isinstance(m, dict)]
    if model is None:
        if not names:
            raise EndpointError(f"{base}/v1/models lists no model: pass --model NAME")
        model = names[0]
    url = base + APIS[api]
    preflight(url, api, model, finish=finish_preflight)
    chat = chat_prompts.measure(url, model) if api == "openai-chat" else None
    before = server_info.metrics(base)  # after the set-up requests: the run's own counts
    schedule, prompt, output = llm_schedule(scn)
    check_bench_memory(scn, prompt, output)
    salt = secrets.randbits(31) if prompt_salt is None else int(prompt_salt)
    jobs = make_jobs(schedule.arrival_s, prompt, output, api, scn.seed, (lo, hi), chat,
                     trace_prompts(scn, schedule.rows, prompt, (lo, hi), content_seed), salt)
    horizon = horizon_s(scn, schedule.arrival_s)
    client = OpenLoop(url, api, model, jobs, deadline_s=horizon + drain,
                      max_concurrency=max_concurrency, request_timeout_s=request_timeout_s,
                      on_done=on_done, spin_s=spin_s)
    if on_client is not None:
        on_client(client)
    outs = _run(client, handle_signals)
    after = server_info.metrics(base)
    requests, token_s, offset, tokens = _outcome_tables(outs, jobs, schedule.priority)
    window_end = horizon if client.stopped_at_s is None else min(horizon, client.stopped_at_s)
    summary = bench_summary(requests, token_s, offset, outs, warmup_s=scn.warmup_s,
                            window_end_s=window_end, end_s=client.end_s,
                            ttft_slo_ms=scn.slo.ttft_ms, tpot_slo_ms=scn.slo.tpot_ms,
                            cpu_share=client.cpu_share)
    counts = requests["status"].astype(str).value_counts().to_dict()
    drain_timed_out = client.stopped_at_s is None and bool(
        (requests["status"].astype(str) == "in_flight").any())
    device = {"kind": "endpoint", "url": base, "api": api, "model": model}
    meta = run_meta(scn, driver="bench", device=device,  # type: ignore[arg-type]
                    extra={"kind": "llm", "end_s": client.end_s, "wall_s": client.wall_s,
                           "status_counts": {k: int(v) for k, v in counts.items()},
                           "stopped_early": client.stopped_at_s is not None,
                           "stopped_s": client.stopped_at_s, "drain_timeout_s": drain,
                           "drain_timed_out": drain_timed_out, "step_errors": [],
                           "server_models": listed,
                           "server_config": server_info.scheduling_config(before),
                           "server_metrics_before": before, "server_metrics_after": after,
                           "client_cpu_share": client.cpu_share,
                           "max_concurrency": max_concurrency, "prompt_salt": salt,
                           "request_timeout_s": request_timeout_s,
                           "prompt_token_ids": [lo, hi], "requests_planned": len(jobs),
                           "chat_template_tokens": chat.overhead_tokens if chat else None,
                           "chat_units": list(chat.units) if chat else None,
                           "hash_prompts": isinstance(scn.workload, HashTraceCfg),
                           "content_seed": content_seed,
                           "requests_sent": len(outs),
                           "planned_horizon_s": horizon if math.isfinite(horizon) else None})
    empty_steps = pd.DataFrame({c: np.empty(0) for c in STEP_COLUMNS})
    queue = pd.DataFrame({"time_s": np.empty(0), "queue": np.empty(0, dtype=np.int32),
                          "length": np.empty(0, dtype=np.int64)})
    return LlmResult(scn, summary, requests, empty_steps, tokens, queue, meta)


def new_loop() -> asyncio.AbstractEventLoop:
    """A fresh event loop: uvloop's when it is installed (``pip install servelab[fast]``:
    less CPU per request, so a higher rate before the client limits it), else asyncio's.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _run(client: OpenLoop, handle_signals: bool,
         loop: asyncio.AbstractEventLoop | None = None) -> list[Outcome]:
    """Run the client on ``loop`` (default: a fresh one; closed after), SIGINT/SIGTERM
    stopping it when asked; set its wall time and CPU share (its process's CPU seconds /
    wall seconds).
    """
    loop = loop or new_loop()
    main = threading.current_thread() is threading.main_thread()
    handled = []
    if handle_signals and main:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, client.stop)
            handled.append(sig)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    # no garbage collection while measuring: a full collection over a run's records stops
    # the loop for tens of ms, which every request in flight would carry as latency; the
    # cycles made meanwhile (few: failed requests' tracebacks) are collected after the run
    was_enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        outs = loop.run_until_complete(client.run())
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()
        for sig in handled:
            loop.remove_signal_handler(sig)
        loop.close()
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    client.wall_s = wall
    client.cpu_share = cpu / wall if wall > 0 else math.nan
    return outs

