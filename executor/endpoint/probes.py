"""Black-box probes of a server's step times, sent with the open-loop client
(:mod:`executor.endpoint.client`): what a client can see of the engine's steps.

* :func:`prefill_ttft_s`: one request at a time with one output token; its TTFT is the
  per-request overhead plus one prefill-only step of that prompt.
* :func:`decode_itl_s`: ``D`` requests at once with long outputs; once all of them stream
  and before any ends, every gap between two chunks of a stream, over the tokens the later
  chunk carries (a busy API server sends several in one), is one decode step of ``D``
  sequences (steady-state ITL).
* :func:`mixed_step_s`: one-token requests of ``P`` prompt tokens sent among ``D`` running
  decodes; the decode streams' gap that ends with the newcomer's first token is the step
  that held its prefill and the ``D`` decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from executor.endpoint.bench import _run
from executor.endpoint.client import Job, OpenLoop, Outcome
from executor.endpoint.server_info import EndpointError


@dataclass
class Target:
    """Where probes go: the completions URL, the model name, a seeded id stream."""

    url: str
    model: str
    rng: np.random.Generator
    token_ids: tuple[int, int] = (10, 250)
    timeout_s: float = 60.0

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
    outs = _run(client, handle_signals=False)
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


def _steady_gaps(outs: list[Outcome]) -> np.ndarray:
    """Chunk gaps while every stream runs (after the last first token, before the first
    stream's last chunk).
    """
    lo = max(o.chunk_s[0] for o in outs)
    hi = min(o.chunk_s[-1] for o in outs)
    gaps = []
    for o in outs:
        t = np.asarray(o.chunk_s)
        per = np.diff(t) / np.maximum(np.asarray(o.chunk_tokens[1:], float), 1.0)
        keep = (t[:-1] >= lo) & (t[1:] <= hi)
        gaps.append(per[keep])
    return np.concatenate(gaps) if gaps else np.empty(0)


def decode_itl_s(target: Target, seqs: int, prompt_tokens: int, output_tokens: int
                 ) -> list[float]:
    """Steady-state chunk gaps of ``seqs`` concurrent requests (one sample per gap)."""
    jobs = [Job(i, 0.0, target.prompt(prompt_tokens), prompt_tokens, output_tokens)
            for i in range(seqs)]
    gaps = _steady_gaps(send(target, jobs))
    return [float(g) for g in gaps if g > 0]


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
