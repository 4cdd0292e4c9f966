"""``calibrate_endpoint``: the batched latency curve of whatever serves a request-level
endpoint, from bursts of exactly N simultaneous requests, written as the
:class:`calibration.profile.LatencyProfile` that ``calibrate --model`` writes.

The plan: one untimed burst per size (warm-up, and the size's latency, which sets the gap
between bursts), then ``reps`` timed bursts per size in a shuffled order (as
``calibrate --model`` shuffles: small batches run colder among big ones), each burst
``gap`` after the previous one, all sent by the shared open-loop client (one connection pool, so
connections are reused). A burst's sample is the mean latency of its N requests, minus the
server's batching window when the user gives it and N is below the server's largest batch (a
batcher that fills up dispatches at once; one that does not waits the window).

Assumptions (checked where possible): a burst becomes one batch only when the batcher can
hold N (``--server-max-batch-size`` at least N) and its window is longer than the burst's
spread (the time between its first and its last send, reported per size); the requests of a
burst that became one batch finish together, so the command also reports the spread of
their latencies, and flags sizes whose spread exceeds half their median latency (the burst
was probably split). The samples include the per-request path outside the model (HTTP,
proxy, routing): the endpoint adds it to every request, so a prediction built on the profile
does too. The single-request overhead on its own is ``samples[1]`` minus the model's time
at batch 1, which a black box cannot separate; it is reported as the single-request latency
(``meta.endpoint.single_request_ms``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from calibration.model_runners import load_corpus
from calibration.profile import LatencyProfile
from executor.endpoint import server_info
from executor.endpoint.client import Job, OpenLoop, Outcome
from executor.endpoint.probes import ProbingStopped, Stopper, run_probe
from executor.endpoint.request_bench import preflight
from executor.endpoint.request_client import (
    REQUEST_APIS,
    check_bodies,
    json_body,
    kserve_body,
    request_path,
    request_sender,
)
from executor.endpoint.server_info import EndpointError
from sim.metrics.rundir import versions
from sim.scenario.payload import PayloadCfg

SPLIT_FLAG = 0.5  # a burst's latency spread above this share of its median: probably split
CLAMP_SHARE = 0.9  # the most of a size's median taken as outside time (the rest is busy)


def _bursts(url: str, api: str, payload: PayloadCfg, plan: Sequence[tuple[float, int]],
            seed: int, timeout_s: float, stopper: Stopper,
            contents: Sequence[int] | None = None) -> list[list[Outcome]]:
    """Send each ``(time_s, n)`` of ``plan`` as n simultaneous requests; the outcomes of each
    burst, in plan order. ``contents``: a key per burst; bursts with the same key send the
    same inputs (each its own request ids), so their batches do the same work.

    Raises:
        ProbingStopped: a stop signal came; its ``outcomes`` hold the bursts completed
            before it (a list per burst, in plan order).
    """
    jobs, owner, bodies = burst_bodies(api, payload, plan, seed, contents)
    make_body, sender = request_sender(dict(enumerate(bodies)), api == "kserve-v2")
    end = (plan[-1][0] if plan else 0.0) + timeout_s
    client = OpenLoop(url, api, payload.model or "", jobs, deadline_s=end,
                      request_timeout_s=timeout_s, make_body=make_body, sender=sender)
    try:
        outs = run_probe(client, stopper)
    except ProbingStopped as stop:
        grouped = _group(stop.outcomes, owner, len(plan))
        whole = [g for k, g in enumerate(grouped)
                 if len(g) == plan[k][1] and all(o.status == "ok" for o in g)]
        stop.bursts = whole
        raise
    grouped = _group(outs, owner, len(plan))
    for k, group in enumerate(grouped):
        bad = [o for o in group if o.status != "ok"]
        if bad:
            raise EndpointError(f"burst of {plan[k][1]}: {len(bad)} requests failed "
                                f"({bad[0].cause}: {bad[0].error})")
    return grouped


def burst_bodies(api: str, payload: PayloadCfg, plan: Sequence[tuple[float, int]], seed: int,
                 contents: Sequence[int] | None = None
                 ) -> tuple[list[Job], list[int], list[dict[str, Any]]]:
    """The jobs of a burst plan, the burst of each, and their request bodies (see
    :func:`_bursts` for ``contents``).
    """
    corpus = load_corpus()
    jobs: list[Job] = []
    owner: list[int] = []
    for k, (t, n) in enumerate(plan):
        for _ in range(n):
            jobs.append(Job(len(jobs), t, "", 1, 0))
            owner.append(k)
    body = kserve_body if api == "kserve-v2" else json_body
    if contents is None:
        rng = np.random.default_rng([seed, 31])
        return jobs, owner, [body(payload, j, rng, corpus) for j in jobs]
    # one generator per key: the bursts that share it draw the same inputs
    keyed = [np.random.default_rng([seed, 31, int(key)]) for key in contents]
    return jobs, owner, [body(payload, j, keyed[k], corpus)
                         for j, k in zip(jobs, owner, strict=True)]


def _group(outs: list[Outcome], owner: list[int], bursts: int) -> list[list[Outcome]]:
    grouped: list[list[Outcome]] = [[] for _ in range(bursts)]
    for out in outs:
        grouped[owner[out.index]].append(out)
    return grouped


def _burst_stats(group: list[Outcome]) -> tuple[float, float, float]:
    """(mean latency, send spread, latency spread) of one burst, in seconds."""
    sent = np.array([o.sent_s for o in group])
    latency = np.array([o.chunk_s[-1] - o.sent_s for o in group])
    return float(latency.mean()), float(sent.max() - sent.min()), float(
        latency.max() - latency.min())


def calibrate_endpoint(endpoint: str, *, api: str, sizes: Sequence[int], reps: int = 20,
                       model: str | None = None, payload: PayloadCfg | None = None,
                       window_ms: float | None = None, server_max_batch: int | None = None,
                       seed: int = 0, timeout_s: float = 30.0,
                       same_pair_inputs: bool = False,
                       say: Callable[[str], None] = print) -> LatencyProfile:
    """Measure the endpoint's batched latency curve (see the module docstring).

    Args:
        endpoint: The server's base URL.
        api: ``kserve-v2`` or ``http-json``.
        sizes: Burst sizes N (each becomes a profile batch size).
        reps: Timed bursts per size.
        model: KServe v2 model name (default: ``payload.model``).
        payload: What each request sends (default: one BYTES input of one sentence).
        window_ms: The server's batching window (Ray Serve's ``batch_wait_timeout_s``),
            subtracted from bursts smaller than ``server_max_batch``.
        server_max_batch: The server's largest batch (Ray Serve's ``max_batch_size``).
        seed: Seeds the payloads and the shuffled order.
        timeout_s: A request not answered after this long fails the calibration.
        same_pair_inputs: The two bursts of each overhead pair send the same inputs
            (:func:`request_overhead`; off by default).
        say: Where the plan and the per-size lines go.

    Raises:
        EndpointError: a bad flag, an unreachable endpoint, or a failed request.
    """
    if api not in REQUEST_APIS:
        raise EndpointError(f"--api {api!r}: allowed: {', '.join(REQUEST_APIS)}")
    if not sizes or any(int(n) < 1 for n in sizes):
        raise EndpointError(f"--batch-sizes {list(sizes)}: need sizes >= 1")
    if reps < 2:
        raise EndpointError(f"--reps {reps}: need at least 2 bursts per size")
    if window_ms is not None and not (math.isfinite(window_ms) and window_ms >= 0):
        raise EndpointError(f"--window-ms {window_ms:g}: must be >= 0")
    if server_max_batch is not None and server_max_batch < max(sizes):
        raise EndpointError(f"--server-max-batch-size {server_max_batch}: below the burst "
                            f"size {max(sizes)}, which the server would split")
    payload = payload or PayloadCfg(model=model)
    name = model or payload.model
    if api == "kserve-v2" and not name:
        raise EndpointError("--api kserve-v2 needs the model's name: pass --model NAME")
    payload = payload.model_copy(update={"model": name})
    base = server_info.base_url(endpoint)
    order = sorted({int(n) for n in sizes})
    # the timed bursts' bodies are built at once (one item each; the warm-up's and the
    # overhead pairs' are fewer, and built after them)
    check_bodies(api, payload, {1: reps * sum(order) + 1},
                 f"--reps {reps} bursts of each of --batch-sizes {order}")
    corpus = load_corpus()
    probe = (kserve_body if api == "kserve-v2" else json_body)(
        payload, Job(-1, 0.0, "", 1, 0), np.random.default_rng(0), corpus)
    metadata = preflight(base, api, name, {**probe, "__path": payload.path})
    url = base + request_path(api, payload, name)
    stopper = Stopper()
    with stopper.installed():
        return _measure(url, api, payload, order, reps, seed, timeout_s, window_ms,
                        server_max_batch, base, name, metadata, stopper, say,
                        same_pair_inputs)


def _measure(url: str, api: str, payload: PayloadCfg, order: list[int], reps: int, seed: int,
             timeout_s: float, window_ms: float | None, server_max_batch: int | None,
             base: str, name: str | None, metadata: dict[str, Any] | None, stopper: Stopper,
             say: Callable[[str], None], same_pair_inputs: bool = False) -> LatencyProfile:
    """The warm-up and the timed bursts, and the profile of what they measured (after a stop
    signal: of the bursts completed before it, marked ``meta.partial``).
    """
    try:
        warm = _bursts(url, api, payload, [(0.5 * k, n) for k, n in enumerate(order)], seed,
                       timeout_s, stopper)
    except ProbingStopped as stop:
        raise EndpointError(f"stopped by {stop.signame} during the warm-up bursts, before "
                            "any timed one: nothing written") from None
    slowest = max(_burst_stats(g)[0] for g in warm)
    gap = 2.0 * slowest + 0.02
    rng = np.random.default_rng(seed)
    sequence = [n for n in order for _ in range(reps)]
    rng.shuffle(sequence)
    say(f"calibrating {url}: bursts of {order}, {reps} each, shuffled, {gap * 1e3:.0f} ms "
        f"apart (about {len(sequence) * gap:.0f} s; Ctrl-C or SIGTERM keeps the bursts done)")
    partial = None
    try:
        groups = _bursts(url, api, payload, [(0.05 + k * gap, n)
                                             for k, n in enumerate(sequence)],
                         seed + 1, timeout_s, stopper)
    except ProbingStopped as stop:
        groups = stop.bursts
        done = {n: sum(1 for g in groups if len(g) == n) for n in order}
        partial = {"stopped_by": stop.signame, "bursts_done": len(groups),
                   "bursts_planned": len(sequence), "per_size": done}
        order = [n for n in order if done[n]]
        if not order:
            raise EndpointError(f"stopped by {stop.signame} before any timed burst "
                                "completed: nothing written") from None
        say(f"stopped by {stop.signame}: {len(groups)} of {len(sequence)} bursts done; "
            "partial profile of them")
        sequence = [len(g) for g in groups]
    window_s = (window_ms or 0.0) / 1e3
    samples: dict[int, list[float]] = {n: [] for n in order}
    spread: dict[int, list[float]] = {n: [] for n in order}
    lat_spread: dict[int, list[float]] = {n: [] for n in order}
    for n, group in zip(sequence, groups, strict=True):
        mean_s, send_spread_s, latency_spread_s = _burst_stats(group)
        waits = window_ms is not None and (server_max_batch is None or n < server_max_batch)
        samples[n].append(max(mean_s - (window_s if waits else 0.0), 1e-6))
        spread[n].append(send_spread_s)
        lat_spread[n].append(latency_spread_s)
    checks: dict[str, Any] = {}
    for n in order:
        med = float(np.median(samples[n]))
        send_ms = float(np.median(spread[n])) * 1e3
        split = float(np.median(lat_spread[n])) > SPLIT_FLAG * med and n > 1
        narrow = window_ms is not None and send_ms >= window_ms and n > 1
        checks[str(n)] = {"median_ms": med * 1e3, "send_spread_ms": send_ms,
                          "send_spread_max_ms": float(np.max(spread[n])) * 1e3,
                          "latency_spread_ms": float(np.median(lat_spread[n])) * 1e3,
                          "probably_split": split, "spread_exceeds_window": narrow}
        flag = ("  [burst probably split: latency spread above half the median]" if split
                else "") + ("  [send spread >= the window]" if narrow else "")
        say(f"  N={n:>3}: median {med * 1e3:7.2f} ms, send spread {send_ms:.2f} ms{flag}")
    single_ms = float(np.median(samples[order[0]])) * 1e3 if order[0] == 1 else math.nan
    overhead: dict[str, Any] = {"request_ms": 0.0, "method": "none: give "
                                "--server-max-batch-size to separate it"}
    if server_max_batch is not None and partial is None:
        medians = {n: float(np.median(v)) for n, v in samples.items()}
        try:
            overhead = request_overhead(url, api, payload, medians, server_max_batch,
                                        window_s, reps, seed + 2, timeout_s, stopper,
                                        same_pair_inputs)
        except ProbingStopped as stop:  # the timed bursts are kept, uncorrected
            partial = {"stopped_by": stop.signame, "stage": "request overhead",
                       "bursts_done": len(groups), "bursts_planned": len(sequence)}
            say(f"stopped by {stop.signame} while separating the request overhead: the "
                "profile keeps the bursts' latencies uncorrected")
    smallest = order[0]
    if ("sizes" in overhead and str(smallest) not in overhead["sizes"]
            and overhead["request_ms"] / 1e3 > CLAMP_SHARE * medians[smallest]):
        # the outside time of a full burst would leave a lone request almost no busy time:
        # it is not a lone request's, and applied to every request it would overstate each
        # latency by the difference; keep the outside path in the busy times instead
        say(f"  warning: the outside time measured on bursts of {overhead['from_size']} "
            f"({overhead['request_ms']:.1f} ms) exceeds {CLAMP_SHARE:.0%} of a burst of "
            f"{smallest}'s latency ({medians[smallest] * 1e3:.1f} ms); not separated: the "
            "profile keeps the path outside the replica as busy time")
        overhead = {"request_ms": 0.0, "refused": overhead,
                    "method": f"none: the outside time of bursts of {overhead['from_size']} "
                              f"exceeds {CLAMP_SHARE:.0%} of size {smallest}'s latency"}
    if "sizes" in overhead:  # measured (not skipped, not stopped)
        clamped = []
        for n in order:  # each size's samples shifted to its measured busy time
            busy = overhead["sizes"].get(str(n))
            shift_s = (medians[n] - busy["busy_ms"] / 1e3 if busy else
                       overhead["request_ms"] / 1e3)
            if shift_s > CLAMP_SHARE * medians[n]:
                clamped.append(n)
            shift_s = min(max(shift_s, 0.0), CLAMP_SHARE * medians[n])
            samples[n] = [max(x - shift_s, 1e-6) for x in samples[n]]
        overhead["clamped_sizes"] = clamped
        if clamped:
            say(f"  warning: the outside time exceeds {CLAMP_SHARE:.0%} of the latency at "
                f"sizes {clamped}; their busy time is set to {1 - CLAMP_SHARE:.0%} of it, "
                "a guess: the outside path of a full burst is not a lone request's (a "
                "busy machine); use single_request_ms for a lone request's latency")
        say(f"  request overhead outside the replica: {overhead['request_ms']:.2f} ms "
            f"(paired bursts of {overhead['from_size']}); busy ms by size: " + ", ".join(
                f"{n}: {v['busy_ms']:.1f} ({v['queued_pairs']}/{reps} pairs queued)"
                for n, v in overhead["sizes"].items())
            + "".join(f"; {n}: median less the overhead (its window outlasts its batch)"
                      for n in overhead["not_paired"]))
    return LatencyProfile(
        samples_s={n: np.asarray(v) for n, v in samples.items()},
        model={"name": f"endpoint:{name or payload.path}", "api": api},
        device={"kind": "endpoint", "url": base},
        meta={"endpoint": {"url": url, "api": api, "window_ms": window_ms,
                           "server_max_batch_size": server_max_batch, "reps": reps,
                           "gap_ms": gap * 1e3, "bursts": checks,
                           "single_request_ms": single_ms, "server_metadata": metadata,
                           "partial": partial,
                           "request_overhead": overhead,
                           "includes": "the replica's busy time only; the per-request path "
                                       "outside it (HTTP, proxy, routing) is "
                                       "request_overhead.request_ms" if overhead["request_ms"]
                           else "the per-request path outside the model (HTTP, proxy, "
                                "routing)"},
              "threads": None, "seed": seed, "versions": versions()})


def pairs_queue(size: int, median_s: float, server_max: int, window_s: float) -> bool:
    """Whether a pair of bursts of ``size`` can queue, the second behind the first.

    A burst that fills the server's batch is dispatched at once, so the second of a pair
    reaches a batcher whose first batch still runs. One below the largest batch waits the
    whole window from its first request even while the replica is idle (Ray Serve's
    ``wait_for_batch`` starts the timer when it takes that request off the queue:
    ``ray/serve/batching.py``), so the second burst, sent after the first batch left its
    window, queues only if the first batch runs longer than the window and the send offset
    together; its busy time is under its median, so a window of half the median or more
    leaves nothing to measure.
    """
    return size >= server_max or window_s < 0.5 * median_s


def request_overhead(url: str, api: str, payload: PayloadCfg, medians_s: dict[int, float],
                     server_max: int, window_s: float, pairs: int, seed: int,
                     timeout_s: float, stopper: Stopper, same_pair_inputs: bool = False
                     ) -> dict[str, Any]:
    """The replica's busy time per burst size and the per-request time outside it, from
    ``pairs`` pairs of bursts of each size that can queue (:func:`pairs_queue`) (with
    ``same_pair_inputs`` the two bursts of a pair send the same inputs: tried for Ray
    Serve's 16/10 ms setting, where it queued more pairs, but with a 100 ms window it read
    MiniLM's batch-1 busy time at 2.8 ms against about 20, so it is off by default): the second
    burst of a pair is sent a quarter of a burst's latency after the first batch was
    dispatched (after the window, for a burst below the server's largest batch), reaches
    the replica while the first batch runs, and waits for it (Ray Serve's batcher closes
    the next batch while one runs and starts it when the running one ends:
    ``ray/serve/batching.py``, ``_process_batches`` and its semaphore). The gap between the
    two bursts' finishes is then one batch's busy time, and the first burst's mean latency
    less that gap and the window is what the path outside the replica added (HTTP, proxy,
    router, the hop back). A pair whose second burst did not wait (its latency not above
    the first's by a tenth of the gap) is left out.

    The outside time comes from the smallest size whose pairs queued; a size that cannot
    queue (its window outlasts its batch) or whose pairs did not gets no row, and the
    caller takes its busy time as its median less that outside time.

    Args:
        url: The inference URL.
        api: ``kserve-v2`` or ``http-json``.
        payload: What each request sends.
        medians_s: The calibrated median latency per size (window already subtracted).
        server_max: The server's largest batch (a full burst does not wait the window).
        window_s: The server's batching window.
        pairs: Pairs of bursts per size.
        seed: Seeds the payloads.
        timeout_s: A request not answered after this long fails the calibration.
        stopper: A stop signal ends the measurement (:class:`ProbingStopped`).
        same_pair_inputs: The two bursts of a pair send the same inputs.

    Raises:
        EndpointError: a request failed, or no pair queued at any size.
    """
    paired = {n: m for n, m in sorted(medians_s.items())
              if pairs_queue(n, m, server_max, window_s)}
    skipped = sorted(set(medians_s) - set(paired))
    if not paired:
        raise EndpointError(f"request overhead: no burst size can queue behind another "
                            f"(sizes {sorted(medians_s)} all wait a {window_s * 1e3:g} ms "
                            f"window longer than half their latency); add a size of "
                            f"--server-max-batch-size ({server_max}) to --batch-sizes")
    plan: list[tuple[float, int]] = []
    t = 0.05
    for size, median_s in paired.items():
        wait_s = window_s if size < server_max else 0.0
        offset_s = wait_s + 0.25 * median_s
        for _ in range(pairs):
            plan += [(t, size), (t + offset_s, size)]
            t += 3.0 * (wait_s + median_s) + 0.05
    # same_pair_inputs: the two bursts of a pair send the same inputs, meant to make the gap
    # between their finishes the first's busy time, not that plus a text's luck
    groups = _bursts(url, api, payload, plan, seed, timeout_s, stopper,
                     contents=[k // 2 for k in range(len(plan))] if same_pair_inputs
                     else None)
    by_size: dict[int, dict[str, list[float]]] = {}
    for k in range(0, len(plan), 2):
        size = plan[k][1]
        first, second = groups[k], groups[k + 1]
        gap_s = (float(np.median([o.chunk_s[-1] for o in second]))
                 - float(np.median([o.chunk_s[-1] for o in first])))
        lat_a, lat_b = _burst_stats(first)[0], _burst_stats(second)[0]
        row = by_size.setdefault(size, {"busy": [], "outside": []})
        if gap_s > 0 and lat_b > lat_a + 0.1 * gap_s:
            wait_s = window_s if size < server_max else 0.0
            row["busy"].append(gap_s)
            row["outside"].append(lat_a - gap_s - wait_s)
    # each queued pair's own busy and outside time (ms) beside their medians: their spread
    sizes: dict[str, dict[str, Any]] = {
        str(n): {"busy_ms": float(np.median(v["busy"])) * 1e3,
                 "outside_ms": float(np.median(v["outside"])) * 1e3,
                 "queued_pairs": len(v["busy"]),
                 "busy_samples_ms": [x * 1e3 for x in v["busy"]],
                 "outside_samples_ms": [x * 1e3 for x in v["outside"]]}
        for n, v in sorted(by_size.items()) if v["busy"]}
    if not sizes:
        raise EndpointError("request overhead: in no pair of bursts did the second wait for "
                            "the first; are --window-ms and --server-max-batch-size the "
                            "server's?")
    smallest = min(sizes, key=int)
    return {"request_ms": max(sizes[smallest]["outside_ms"], 0.0), "from_size": int(smallest),
            "sizes": sizes, "pairs": pairs, "not_paired": skipped,
            "method": "paired bursts at each size that can queue: the first burst's latency "
                      "minus the gap between the two bursts' finishes (the busy time) and "
                      "the window; sizes whose window outlasts their batch (not_paired): "
                      "their median less request_ms"}


def profile_service(profile: LatencyProfile, path: str) -> dict[str, Any]:
    """The scenario's ``service`` for a profile this module measured (saved at ``path``):
    the profile, with the request overhead it separated as ``service.overheads``.
    """
    over = ((profile.meta.get("endpoint") or {}).get("request_overhead") or {})
    service: dict[str, Any] = {"kind": "profile", "path": path}
    if over.get("request_ms"):
        service["overheads"] = {"request_ms": float(over["request_ms"])}
    return service
