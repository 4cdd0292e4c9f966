"""The open-loop streaming client: each request is sent at its scheduled time whatever the
earlier ones are doing (no coordinated omission), in one process on one asyncio loop.

Timing follows ``vllm bench serve`` (vllm-project/vllm,
``vllm/benchmarks/lib/endpoint_request_func.py``, ``async_request_openai_completions``, and
``vllm/benchmarks/serve.py``, ``calculate_metrics``): a request's clock starts just before its
POST (``sent_s``); TTFT is the arrival of the first SSE chunk that carries a choice (its text
may be empty); each later choice chunk adds one inter-token latency (the gap since the
previous one, per chunk, not per token); E2E latency is the last choice chunk's arrival minus
``sent_s``; TPOT is (E2E − TTFT) / (output tokens − 1). ``scheduled_s`` (the arrival the
simulator uses) and the send lag (``sent_s − scheduled_s``) are kept beside it.

Tokens per chunk: the growth of ``usage.completion_tokens`` when the server streams usage on
every chunk (vLLM's ``stream_options.continuous_usage_stats``), else one per choice chunk.
A request is ok only when its stream ended with ``[DONE]`` and it received exactly the
output tokens asked for; otherwise it failed, with one of the causes in :data:`CAUSES`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from executor.endpoint.http1 import ConnectError, CutError, Pool, PoolFullError, Reply
from executor.endpoint.precise_timer import open_timer

APIS = {"openai-completions": "/v1/completions", "openai-chat": "/v1/chat/completions"}
CAUSES = ("refused", "http_NNN", "timeout", "stream_cut", "malformed_sse", "too_few_tokens",
          "too_many_tokens", "stream_error", "client_error",
          "answers_over_budget")  # http_NNN: the status, e.g. http_503
# the answers in flight would hold more than the client's pooled budget
# (executor.endpoint.http1.MAX_POOLED_ANSWER_BYTES): this one was cut
OVER_BUDGET = "answers_over_budget"


@dataclass
class Job:
    """One request to send: when, what prompt, how many output tokens to force."""

    index: int
    scheduled_s: float
    prompt: list[int] | str
    prompt_tokens: int
    output_tokens: int


@dataclass
class Outcome:
    """What the client saw of one request (times in s since the run's start)."""

    index: int
    scheduled_s: float
    started_s: float = float("nan")  # the task ran (send lag = started - scheduled)
    sent_s: float = float("nan")  # just before the POST (after any --max-concurrency wait)
    chunk_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    status: str = "in_flight"  # ok | failed | in_flight
    cause: str = ""
    error: str = ""
    http_status: int = 0
    server_prompt_tokens: int = -1
    server_output_tokens: int = -1

    @property
    def received(self) -> int:
        """Output tokens received."""
        return int(sum(self.chunk_tokens))


def payload(api: str, model: str, job: Job, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The request body: stream, usage on every chunk, output forced to the job's length
    (``max_tokens`` with ``ignore_eos``, the body ``vllm bench serve --ignore-eos`` sends, so
    the two clients load a server alike; ``min_tokens`` would be redundant with
    ``ignore_eos``, and a server that stops early anyway is caught as ``too_few_tokens``).
    """
    body: dict[str, Any] = {
        "model": model, "stream": True, "temperature": 0.0,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": True}
    if api == "openai-chat":
        body["messages"] = [{"role": "user", "content": job.prompt}]
        body["max_completion_tokens"] = job.output_tokens
    else:
        body["prompt"] = job.prompt
        body["max_tokens"] = job.output_tokens
    body.update(extra or {})
    return body


def _one_line(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text[:200]


class StreamError(Exception):
    """A stream that cannot be read as SSE of the expected shape."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


def read_sse(reply: Reply, out: Outcome, t0: float, chat: bool) -> bool:
    """Read the SSE body that has arrived into ``out``; return whether ``[DONE]`` came.

    Every complete line is stamped with the time of the network read that completed it:
    lines that arrived together have one arrival time.

    Raises:
        StreamError: a line is not SSE, its data is not a JSON object, or it is an error.
    """
    state = [0]  # the last cumulative completion_tokens seen
    buffer = b""
    for now, piece in reply.pieces:
        buffer += piece
        if b"\n" not in piece:
            continue
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            if _line(raw.strip(), now - t0, out, chat, state):
                return True
    tail = buffer.strip()
    last = reply.pieces[-1][0] - t0 if reply.pieces else 0.0
    return bool(tail) and _line(tail, last, out, chat, state)


def _line(line: bytes, now: float, out: Outcome, chat: bool, state: list[int]) -> bool:
    """Take one SSE line into ``out``; True at ``[DONE]``.

    Raises:
        StreamError: the line is not SSE, its data is not a JSON object, or it is an error.
    """
    if not line or line.startswith(b":"):
        return False  # event separators and SSE comments (pings)
    if not line.startswith(b"data:"):
        if line.startswith((b"event:", b"id:", b"retry:")):
            return False
        raise StreamError("malformed_sse", f"not an SSE line: {line[:60]!r}")
    data = line[5:].strip()
    if data == b"[DONE]":
        return True
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's stack
        raise StreamError("malformed_sse", f"chunk is not JSON: {data[:60]!r}") from None
    if not isinstance(chunk, dict):
        raise StreamError("malformed_sse", f"chunk is not an object: {data[:60]!r}")
    if "error" in chunk:
        raise StreamError("stream_error", f"error in stream: {str(chunk['error'])[:120]}")
    usage = chunk.get("usage") or {}
    choices = chunk.get("choices")
    # a usage that is not an object, choices that are not a list, or a chat delta that is
    # not an object raised AttributeError/TypeError here, which ended the sender's task
    # (and the bench) with a traceback and kept the answer's bytes in the pool's budget
    if not isinstance(usage, dict) or not isinstance(choices or [], list) or (
            chat and any(not isinstance(c.get("delta", {}), dict)
                         for c in choices or [] if isinstance(c, dict))):
        raise StreamError("malformed_sse", f"chunk's usage, choices or delta has the wrong "
                                           f"type: {data[:60]!r}")
    if choices:
        if chat and not any(c.get("delta", {}).get("content") is not None
                            for c in choices if isinstance(c, dict)):
            return False  # the role-only first delta carries no token
        total = usage.get("completion_tokens")
        n = int(total) - state[0] if isinstance(total, int) else 1
        state[0] = int(total) if isinstance(total, int) else state[0] + 1
        out.chunk_s.append(now)
        out.chunk_tokens.append(n)
    if usage:
        if isinstance(usage.get("prompt_tokens"), int):
            out.server_prompt_tokens = int(usage["prompt_tokens"])
        if isinstance(usage.get("completion_tokens"), int):
            out.server_output_tokens = int(usage["completion_tokens"])
    return False


async def exchange(pool: Pool, request: bytes, reply: Reply, out: Outcome, t0: float,
                   timeout_s: float | None, cut_cause: str) -> bool:
    """POST ``request`` (from ``pool.request``) and wait for the whole answer into ``reply``;
    True for a complete 200 answer, else ``out`` holds the failure (its cause: ``refused``,
    ``timeout``, ``cut_cause``, ``answers_over_budget``, ``http_NNN``). Raises only on
    cancel. The caller releases ``reply`` (:meth:`~executor.endpoint.http1.Reply.release`)
    once done with its body.

    The one response path of both senders: the streaming one (:func:`send`) and the
    request-level one (:func:`executor.endpoint.request_client.send_request`) differ only in
    what they make of a 200 answer's body.
    """
    out.sent_s = time.perf_counter() - t0
    try:
        if timeout_s is None:
            await pool.post(request, reply)
        else:
            async with asyncio.timeout(timeout_s):
                await pool.post(request, reply)
    except TimeoutError:
        out.status, out.cause = "failed", "timeout"
        out.error = f"no complete answer within --request-timeout-s {timeout_s:g}"
        return False
    except ConnectError as exc:
        out.status, out.cause, out.error = "failed", "refused", _one_line(exc)
        return False
    except PoolFullError as exc:
        out.status, out.cause, out.error = "failed", OVER_BUDGET, _one_line(exc)
        return False
    except CutError as exc:
        out.status, out.cause, out.error = "failed", cut_cause, _one_line(exc)
        return False
    finally:
        out.http_status = reply.status
    if reply.status != 200:
        text = " ".join(reply.body()[:120].decode(errors="replace").split())
        out.status, out.cause = "failed", f"http_{reply.status}"
        out.error = f"HTTP {reply.status} {reply.reason}: {text}"
        return False
    return True


async def send(pool: Pool, request: bytes, job: Job, out: Outcome, t0: float, chat: bool,
               timeout_s: float | None) -> None:
    """POST one request and record its stream into ``out`` (never raises but on cancel; a
    request cancelled mid-stream keeps the chunks that had come).
    """
    reply = Reply()
    complete = False
    try:
        complete = await exchange(pool, request, reply, out, t0, timeout_s, "stream_cut")
    finally:  # also on cancel: what came is kept
        done = False
        try:
            if reply.status == 200:
                done = read_sse(reply, out, t0, chat)
        except StreamError as exc:
            if complete:  # a cut answer keeps its cause: its last line may be cut too
                out.status, out.cause, out.error = "failed", exc.cause, str(exc)
            complete = False
        finally:  # whatever the parse raised, the pool's budget gets the bytes back
            reply.release()
    if not complete:  # exchange or the stream's parse set the cause
        return
    got, want = out.received, job.output_tokens
    if not done:
        out.status, out.cause = "failed", "stream_cut"
        out.error = f"stream ended without [DONE] after {got} of {want} tokens"
    elif got < want:
        out.status, out.cause = "failed", "too_few_tokens"
        out.error = f"received {got} of {want} output tokens"
    elif got > want:
        out.status, out.cause = "failed", "too_many_tokens"
        out.error = f"received {got} output tokens, asked for {want}"
    else:
        out.status = "ok"


@dataclass
class OpenLoop:
    """Sends ``jobs`` at their scheduled times and collects :class:`Outcome` s.

    Args:
        url: The endpoint's full URL (base + the API's path).
        api: ``openai-completions`` or ``openai-chat``.
        model: The model name sent with each request.
        jobs: In schedule order.
        deadline_s: Stop at this time since the start; what is unfinished stays in flight.
        max_concurrency: At most this many requests in flight (None: no limit; a request
            waiting for a slot still counts its wait in its send lag's twin ``client_wait``).
        request_timeout_s: A request without a complete answer after this long fails
            (``timeout``); None: only the deadline ends it.
        extra_body: Fields added to every request body.
        on_done: Called after each request finishes (the progress bar).
        make_body: The JSON-encoded body of a job (default: :func:`payload`'s LLM body);
            every body is built and encoded before the first request is sent.
        sender: Sends one request, ``sender(pool, request, job, out, t0, chat, timeout_s)``
            (default: :func:`send`, SSE streams; request-level APIs wrap
            :func:`executor.endpoint.request_client.send_request`).
        spin_s: How long before a send the client stops sleeping and yields in a busy loop
            instead. Default 0: never spin. A busy core is preempted by whatever else runs
            (the client benchmark of commit a41b9e9, before the precise timer: p99 added
            2.2 ms with a 1 ms spin against 0.7 ms without, at 2,000 streamed req/s).
        precise_timer: Wake at each send time from a ``timerfd``
            (:mod:`executor.endpoint.precise_timer`; Linux) instead of the loop's 1 ms
            timers, so sends leave on time rather than in bursts; False, or no
            ``timerfd``: the loop's timers (sends up to 1 ms late, recorded as send lag).
    """

    url: str
    api: str
    model: str
    jobs: Sequence[Job]
    deadline_s: float
    max_concurrency: int | None = None
    request_timeout_s: float | None = None
    extra_body: dict[str, Any] | None = None
    on_done: Callable[[Outcome], None] | None = None
    make_body: Callable[[Job], bytes] | None = None
    sender: Callable[..., Awaitable[None]] | None = None
    spin_s: float = 0.0
    precise_timer: bool = True
    outcomes: list[Outcome] = field(default_factory=list)
    stopped_at_s: float | None = None
    end_s: float = 0.0
    t0: float = 0.0
    wall_s: float = 0.0
    cpu_share: float = float("nan")

    def stop(self) -> None:
        """Stop sending; cancel what is in flight (kept as in flight). Before the run has
        started, the run stops at once.
        """
        if self.stopped_at_s is None:
            self.stopped_at_s = time.perf_counter() - self.t0 if self.t0 else 0.0
            stop = getattr(self, "_stop", None)
            if stop is not None:
                stop.set()

    async def run(self) -> list[Outcome]:
        """Send every job on time (or until stopped or the deadline); return the outcomes of
        the jobs that were sent.
        """
        self._stop = asyncio.Event()
        if self.stopped_at_s is not None:  # stopped before it started
            self._stop.set()
        limit = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        chat = self.api == "openai-chat"
        tasks: set[asyncio.Task[None]] = set()
        pool = Pool(self.url)
        timer = open_timer(precise=self.precise_timer)
        try:
            make = self.make_body or (lambda j: json.dumps(
                payload(self.api, self.model, j, self.extra_body)).encode())
            bodies = [pool.request(make(j)) for j in self.jobs]
            post = self.sender if self.sender is not None else send
            spin = self.spin_s
            self.t0 = t0 = time.perf_counter()

            async def one(job: Job, body: bytes, out: Outcome) -> None:
                out.started_s = time.perf_counter() - t0
                if limit is None:
                    await post(pool, body, job, out, t0, chat, self.request_timeout_s)
                else:
                    async with limit:
                        await post(pool, body, job, out, t0, chat, self.request_timeout_s)
                if self.on_done is not None:
                    self.on_done(out)

            for job, body in zip(self.jobs, bodies, strict=True):
                if job.scheduled_s >= self.deadline_s:
                    break
                # a timerfd wakes the loop at the send time (the loop's own timers have a
                # 1 ms grain: sends would leave in bursts); with spin_s, it wakes spin_s
                # before and yields to the other tasks until the time comes
                due = t0 + job.scheduled_s
                while not self._stop.is_set():  # naps of at most 0.1 s: a stop is seen
                    now = time.perf_counter()
                    if now >= due:
                        break
                    if due - now > spin:
                        await timer.sleep_until(min(due - spin, now + 0.1))
                    else:
                        await asyncio.sleep(0)
                if self._stop.is_set():
                    break
                out = Outcome(job.index, job.scheduled_s)
                self.outcomes.append(out)
                task = asyncio.get_running_loop().create_task(one(job, body, out))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks and not self._stop.is_set():
                left = self.deadline_s - (time.perf_counter() - t0)
                stopper = asyncio.ensure_future(self._stop.wait())
                await self._drain(tasks, stopper, left)
                stopper.cancel()
            self.end_s = time.perf_counter() - t0
            for task in list(tasks):  # past the deadline or stopped: censored
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            timer.close()
            pool.close()
        return self.outcomes

    async def _drain(self, tasks: set[asyncio.Task[None]], stopper: asyncio.Future[Any],
                     left_s: float) -> None:
        """Wait until every task is done, the stop is asked for, or ``left_s`` passes."""
        end = time.perf_counter() + max(left_s, 0.0)
        while tasks and not stopper.done():
            remaining = end - time.perf_counter()
            if remaining <= 0:
                return
            await asyncio.wait([*tasks, stopper], timeout=min(remaining, 60.0),  # inf: no cap
                               return_when=asyncio.FIRST_COMPLETED)
