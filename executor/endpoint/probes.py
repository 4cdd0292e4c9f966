"""Black-box probes of a server's step times, sent with the open-loop client
(:mod:`executor.endpoint.client`): what a client can see of the engine's steps.

* :func:`prefill_ttft_s`: one request at a time with one output token; its TTFT is the
  per-request overhead plus one prefill-only step of that prompt.
* :func:`decode_itl_s`: ``D`` requests at once, with long outputs and with a quarter of
  that; the E2E difference per extra token is one decode step of ``D`` sequences.
* :func:`mixed_step_s`: one-token requests of ``P`` prompt tokens sent among ``D`` running
  decodes; the decode streams' gap that ends with the newcomer's first token is the step
  that held its prefill and the ``D`` decodes (where the server streams each step as it
  ends; bursts blur it, so it serves as a check).
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

import numpy as np

from executor.endpoint.bench import _run, new_loop
from executor.endpoint.client import Job, OpenLoop, Outcome
from executor.endpoint.server_info import EndpointError

MAX_EXTRA_TOKENS = 512  # the most a decode probe's long batch adds for overlapping prefills
# first tokens spread over more than this share of a stream's decode span: prefills overlap
# decodes (client jitter on a loaded machine stays well below; 16 long prompts under a
# 256-token budget spread over several spans)
OVERLAP = 0.5
# Decode batches this small are timed from their chunks' arrival times (decode_itl_s)
SMALL_BATCH = 4
# ... unless a stream came in bursts: fewer chunks than this share of its tokens
MIN_CHUNK_SHARE = 0.8


class ProbingStopped(Exception):  # noqa: N818 - a stop asked for, not an error
    """SIGINT or SIGTERM came while probing: what was measured before it is kept."""

    def __init__(self, signame: str, outcomes: list[Outcome] | None = None) -> None:
        super().__init__(f"stopped by {signame}")
        self.signame = signame
        self.outcomes = outcomes or []  # of the probe the signal cut short
        self.bursts: list[list[Outcome]] = []  # request-level: the bursts completed


@dataclass
class Stopper:
    """Turns SIGINT and SIGTERM during a calibration into :class:`ProbingStopped`: the probe
    in flight is stopped (its client's :meth:`OpenLoop.stop`, from the loop's own thread) and
    the next :func:`run_probe` raises, so the caller can keep the points measured so far.
    """

    signame: str | None = None
    client: OpenLoop | None = None
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    @contextmanager
    def installed(self) -> Iterator[Stopper]:
        """Within the block, SIGINT and SIGTERM stop the probing (main thread only; the
        previous handlers come back after it).
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.signame = self.signame or signal.Signals(signum).name
            client, loop = self.client, self.loop
            if client is not None and loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(client.stop)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT,
                                                                    signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def check(self, outcomes: list[Outcome] | None = None) -> None:
        """Raise :class:`ProbingStopped` (with ``outcomes``) when a signal came."""
        if self.signame is not None:
            raise ProbingStopped(self.signame, outcomes)


def run_probe(client: OpenLoop, stopper: Stopper | None) -> list[Outcome]:
    """Run ``client`` as a probe; a stop signal (through ``stopper``) ends it early.

    Raises:
        ProbingStopped: a signal came before or during the probe.
    """
    if stopper is None:
        return _run(client, handle_signals=False)
    stopper.check()
    loop = new_loop()
    stopper.client, stopper.loop = client, loop
    try:
        outs = _run(client, handle_signals=False, loop=loop)
    finally:
        stopper.client = stopper.loop = None
    stopper.check(outs)
    return outs


@dataclass
class Target:
    """Where probes go: the completions URL, the model name, a seeded id stream."""

    url: str
    model: str
    rng: np.random.Generator
    token_ids: tuple[int, int] = (10, 250)
    timeout_s: float = 60.0
    stopper: Stopper | None = None
    max_model_len: int | None = None  # caps prompt + output of a probe request

    def prompt(self, n: int) -> list[int]:
        """``n`` fresh random token ids (no prefix shared with earlier probes)."""
        lo, hi = self.token_ids
        return [int(v) for v in self.rng.integers(lo, hi, size=n)]


def send(target: Target, jobs: list[Job], one_at_a_time: bool = False) -> list[Outcome]:
    """Send ``jobs`` at their times (``one_at_a_time``: each when the one before has
    finished, on the same kept-alive connection); every one must come back complete.

    Raises:
        EndpointError: a probe request failed (its cause and message).
    """
    last = max(j.scheduled_s for j in jobs)
    deadline = last + target.timeout_s * (len(jobs) if one_at_a_time else 1)
    client = OpenLoop(target.url, "openai-completions", target.model, jobs,
                      deadline_s=deadline, request_timeout_s=target.timeout_s,
                      max_concurrency=1 if one_at_a_time else None)
    outs = run_probe(client, target.stopper)
    for out in outs:
        if out.status != "ok":
            raise EndpointError(f"probe request failed ({out.cause or 'unfinished'}): "
                                f"{out.error or 'no complete answer in time'}")
    if len(outs) < len(jobs):
        raise EndpointError("probe requests were not all sent in time")
    return outs


def prefill_ttft_s(target: Target, prompt_tokens: int, reps: int) -> list[float]:
    """TTFT of ``reps`` one-token requests of ``prompt_tokens``, one after another on one
    connection (a first, untimed one opens it: bench's requests find theirs open).
    """
    jobs = [Job(k, 0.0, target.prompt(prompt_tokens), prompt_tokens, 1)
            for k in range(reps + 1)]
    outs = sorted(send(target, jobs, one_at_a_time=True), key=lambda o: o.sent_s)
    return [o.chunk_s[0] - o.sent_s for o in outs[1:]]


def _e2e_s(outs: list[Outcome]) -> list[float]:
    return [o.chunk_s[-1] - o.sent_s for o in outs]


def decode_itl_s(target: Target, seqs: int, prompt_tokens: int, output_tokens: int,
                 runs: int = 1) -> list[float]:
    """Seconds per decode step of ``seqs`` concurrent requests.

    Small batches (``seqs`` up to :data:`SMALL_BATCH`): each stream's time per token while
    all of them decode, read from the chunks' own arrival times (:func:`_after_prefills_s`);
    a lone stream needs no second batch then. The streams' TTFTs stay out of it: by
    difference (below) one sequence's samples at contexts 64-1,120 scattered by up to 40%
    (the tiny vLLM: 3.1-5.9 ms, non-monotonic in context) against 3.0-3.5 ms that lone
    requests decoded at in the fidelity runs.

    Larger batches, or a small one whose streams came in bursts: by difference, each
    stream's E2E at ``output_tokens`` less the median E2E of the same batch at a quarter of
    that length, over the tokens between. Start-up (prefills, connection) cancels, and so do
    the bursts a busy API server streams in after a stall (single gaps, or the span between a
    stream's chunks, mislead then: a whole stream can arrive in one read). One sample per
    stream and run (up to two more runs where noise left no positive one).

    Where the streams' prefills overlap their decodes (long prompts under a small token
    budget: the first token of the batch's last stream comes more than half a stream's decode
    span after the first one's), the difference would count the steps that carried
    other streams' prefill chunks; the long batch then asks for more tokens
    (:func:`_overlap_tokens`) and each stream's time per token while all of them decode is
    taken instead (:func:`_after_prefills_s`), where that window holds enough tokens.
    """
    short = max(2, output_tokens // 4)
    small = seqs <= SMALL_BATCH
    samples: list[float] = []
    for k in range(runs + 2):
        if k >= runs and any(v > 0 for v in samples):
            break  # two more tries where a stall on the short batch hid every difference
        base_s, long = None, output_tokens
        if seqs > 1:  # the short batch shows whether the prefills overlap the decodes
            base_s, long = _short_batch(target, seqs, prompt_tokens, short, output_tokens)
        batch = [Job(i, 0.0, target.prompt(prompt_tokens), prompt_tokens, long)
                 for i in range(seqs)]
        outs = send(target, batch)
        after = _after_prefills_s(outs, (output_tokens - short) // 2, always=small)
        if after is None and base_s is None:  # a lone stream that came in bursts
            base_s, _ = _short_batch(target, seqs, prompt_tokens, short, output_tokens)
        samples += after if after is not None else \
            [(e - float(base_s or 0.0)) / (long - short) for e in _e2e_s(outs)]
    return [v for v in samples if v > 0]


def _short_batch(target: Target, seqs: int, prompt_tokens: int, short: int,
                 output_tokens: int) -> tuple[float, int]:
    """The short batch's median E2E, and the long batch's output tokens."""
    batch = [Job(i, 0.0, target.prompt(prompt_tokens), prompt_tokens, short)
             for i in range(seqs)]
    outs = send(target, batch)
    long = output_tokens + _overlap_tokens(outs, short)
    if target.max_model_len is not None:
        long = max(output_tokens, min(long, target.max_model_len - prompt_tokens))
    return float(np.median(_e2e_s(outs))), long


def _overlap_tokens(outs: list[Outcome], tokens: int) -> int:
    """Extra output tokens for the long batch where the short one's first tokens spread
    (prefills overlapping decodes): twice the tokens a stream got per that spread, so that
    all the long batch's streams still decode together after the last prefill.
    """
    firsts = [o.chunk_s[0] for o in outs]
    per_token = float(np.median([(o.chunk_s[-1] - o.chunk_s[0]) / max(tokens - 1, 1)
                                 for o in outs]))
    spread = max(firsts) - min(firsts)
    if per_token <= 0 or spread <= OVERLAP * per_token * (tokens - 1):
        return 0
    return int(min(math.ceil(2 * spread / per_token), MAX_EXTRA_TOKENS))


def _after_prefills_s(outs: list[Outcome], min_tokens: int, always: bool = False
                      ) -> list[float] | None:
    """Seconds per token of each stream while all of them decode (after the batch's last
    first token, before its first last token), where the first tokens spread over more than
    half the streams' median decode span, or ``always`` (None: they do not, fewer than
    ``min_tokens`` came in that window, or, with ``always``, a stream came in bursts: fewer
    chunks than :data:`MIN_CHUNK_SHARE` of its tokens in the window).
    """
    firsts = [o.chunk_s[0] for o in outs]
    spans = [o.chunk_s[-1] - o.chunk_s[0] for o in outs]
    t0, t1 = max(firsts), min(o.chunk_s[-1] for o in outs)
    if not always and t0 - min(firsts) <= OVERLAP * float(np.median(spans)):
        return None
    samples = []
    for o in outs:
        t, n = np.asarray(o.chunk_s), np.cumsum(o.chunk_tokens)
        a, b = int(np.searchsorted(t, t0)), int(np.searchsorted(t, t1, side="right")) - 1
        if b <= a or n[b] - n[a] < min_tokens:
            return None
        if always and b - a < MIN_CHUNK_SHARE * (n[b] - n[a]):
            return None
        samples.append(float((t[b] - t[a]) / (n[b] - n[a])))
    return samples


def mixed_step_s(target: Target, seqs: int, prompt_tokens: int, output_tokens: int,
                 chunk_tokens: int, reps: int, est_itl_s: float) -> list[float]:
    """Times of steps holding one ``chunk_tokens`` prefill among ``seqs`` decodes: ``reps``
    one-token requests sent, spaced apart, while the decodes run.
    """
    decodes = [Job(i, 0.0, target.prompt(prompt_tokens), prompt_tokens, output_tokens)
               for i in range(seqs)]
    span = output_tokens * est_itl_s
    start = 0.3 * span
    spacing = 0.5 * span / max(reps, 1)
    newcomers = [Job(seqs + k, start + k * spacing, target.prompt(chunk_tokens), chunk_tokens,
                     1) for k in range(reps)]
    outs = send(target, decodes + newcomers)
    streams = [o for o in outs if o.index < seqs]
    lo = max(o.chunk_s[0] for o in streams)
    hi = min(o.chunk_s[-1] for o in streams)
    samples = []
    for new in (o for o in outs if o.index >= seqs):
        first = new.chunk_s[0]
        if not lo < first <= hi:
            continue
        gaps = []
        for o in streams:
            t = np.asarray(o.chunk_s)
            k = int(np.argmin(np.abs(t - first)))
            if k > 0:
                gaps.append(t[k] - t[k - 1])
        if gaps:
            samples.append(float(np.median(gaps)))
    return samples
