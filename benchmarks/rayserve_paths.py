"""What Ray Serve's path outside the batcher does, from the raw per-request logs that
``benchmarks/fidelity_rayserve.py`` keeps (``raw`` in its JSON): the client's send and
answer times and the replica's own (user code entered, body read back from the proxy,
batch result back), Ray's batches.

* :func:`rule_check`: servelab's ``timer: arrival`` policy object, fed the times the
  requests reached Ray's batcher (the replica's ``parsed`` stamps), against Ray's logged
  batch sizes: is the batching rule exact once the arrivals at the batcher are known?
* :func:`fit_stage`: the proxy as a single-server FIFO stage with a fixed cost per request
  (:mod:`sim.drivers.proxy_stage`): the cost whose Lindley departures leave the steadiest
  residual delay (least variance), inbound (client send -> batcher) and outbound (replica
  answer -> client).

    python benchmarks/rayserve_paths.py [fidelity_rayserve-TAG]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.drivers.proxy_stage import fifo_departures  # noqa: E402
from sim.serving.policies import DynamicBatching  # noqa: E402
from sim.serving.queues import make_queue  # noqa: E402
from sim.serving.records import RequestTable  # noqa: E402
from sim.serving.types import RUNNING, ReplicaView  # noqa: E402

COSTS_MS = np.round(np.arange(0.0, 6.001, 0.05), 3)


def joined(run: dict[str, Any]) -> dict[str, np.ndarray]:
    """The run's requests answered by both sides, in send order: sent, entered, parsed,
    replica answered, client answered (unix s).
    """
    replica = {str(r[0]): r[1:] for r in run["replica"]}
    rows = [(c[2], *replica[str(c[0])], c[3]) for c in run["client"]
            if c[3] is not None and str(c[0]) in replica]
    a = np.array(sorted(rows), dtype=float).reshape(-1, 5)
    return {k: a[:, i] for i, k in enumerate(("sent", "entered", "parsed", "answered",
                                               "received"))}


def _parsed(run: dict[str, Any]) -> np.ndarray:
    """When each request the replica answered during the run reached the batcher (the
    bench's one preflight request included: Ray batched it too).
    """
    return np.array([r[2] for r in run["replica"] if r[2] is not None], dtype=float)


def batches_by_rule(arrival_s: np.ndarray, max_batch: int, window_ms: float) -> list[int]:
    """Batch sizes that servelab's ``DynamicBatching(timer="arrival")`` forms from these
    arrivals at the batcher. With that timer a batch is fixed by arrivals alone (never by
    when the replica frees), so the policy is asked with every arrival queued and a clock
    past them all.
    """
    order = np.sort(np.asarray(arrival_s, float))
    table = RequestTable(order, np.ones(order.size, np.int64), np.zeros(order.size, np.int8),
                         np.full(order.size, np.inf))
    queue = make_queue("fifo", table, 0)
    for rid in range(order.size):
        queue.push(rid)
    policy = DynamicBatching(max_batch_size=max_batch, max_wait_ms=window_ms, timer="arrival")
    sizes = []
    now = float(order[-1]) + 1e6 if order.size else 0.0
    while len(queue.view):
        ids = policy.decide(now, queue.view, ReplicaView(0)).dispatch
        for rid in ids:
            table.status[rid] = RUNNING
            queue.forget(rid)
        sizes.append(len(ids))
    return sizes


def rule_check(run: dict[str, Any], max_batch: int, window_ms: float) -> dict[str, Any]:
    """Ray's logged batch sizes against the rule on the batcher's own arrival times."""
    ray = [int(b[0]) for b in run["batches"]]
    rule = batches_by_rule(_parsed(run), max_batch, window_ms)
    same = sum(a == b for a, b in zip(ray, rule, strict=False))
    return {"ray_batches": len(ray), "rule_batches": len(rule),
            "same_size_in_order": same, "ray_mean": float(np.mean(ray)) if ray else None,
            "rule_mean": float(np.mean(rule)) if rule else None}


def rule_check_runs(runs: list[dict[str, Any]], max_batch: int, window_ms: float
                    ) -> dict[str, Any]:
    """:func:`rule_check` summed over the runs of one load."""
    checks = [rule_check(r, max_batch, window_ms) for r in runs]
    ray = [int(b[0]) for r in runs for b in r["batches"]]
    rule = [n for r in runs for n in batches_by_rule(_parsed(r), max_batch, window_ms)]
    return {"rho": runs[0]["rho"], "ray_batches": len(ray), "rule_batches": len(rule),
            "same_size_in_order": sum(c["same_size_in_order"] for c in checks),
            "ray_mean": float(np.mean(ray)), "rule_mean": float(np.mean(rule))}


def timer_lateness_ms(runs: list[dict[str, Any]], max_batch: int, window_ms: float
                      ) -> dict[str, float]:
    """How late Ray's batch timer fires: for each batch that was not full and whose first
    request reached the batcher while the replica was idle (so the batch started as soon as
    it closed), its start less that arrival less the window; quantiles in ms.
    """
    late = []
    for run in runs:
        arrivals = np.sort(_parsed(run))
        k, prev_finish = 0, -np.inf
        for size, start, finish in run["batches"]:
            if k >= arrivals.size:
                break
            if arrivals[k] > prev_finish and int(size) < max_batch:
                late.append((start - arrivals[k]) * 1e3 - window_ms)
            k += int(size)
            prev_finish = finish
    q = np.percentile(late, [10, 50, 90]) if late else [np.nan] * 3
    return {"n": len(late), "p10": float(q[0]), "p50": float(q[1]), "p90": float(q[2])}


def batching_lateness_ms(runs: list[dict[str, Any]], max_batch: int, window_ms: float
                         ) -> dict[str, float]:
    """The lateness (ms, on a 0.25 ms grid up to 5 ms) that, added to the window, makes
    servelab's ``timer: arrival`` fed the batcher's own arrival stamps form the most of
    Ray's batches size for size, in order. Ray's timer is late by more than on an idle
    replica (:func:`timer_lateness_ms`) while the model thread holds the interpreter, and a
    request joins the batcher's queue a little after its body was read: this is the one
    window that takes both in.
    """
    best: dict[str, float] = {}
    for late in np.arange(0.0, 5.001, 0.25):
        same = ray_n = 0
        ray_items = rule_items = 0
        for run in runs:
            ray = [int(b[0]) for b in run["batches"]]
            rule = batches_by_rule(_parsed(run), max_batch, window_ms + float(late))
            same += sum(a == b for a, b in zip(ray, rule, strict=False))
            ray_n, ray_items = ray_n + len(ray), ray_items + sum(ray)
            rule_items += len(rule)
        if not best or same > best["same_size_in_order"]:
            best = {"late_ms": float(late), "same_size_in_order": float(same),
                    "ray_batches": float(ray_n),
                    "rule_batches": float(rule_items)}
    return best


def handover_ms(runs: list[dict[str, Any]], window_ms: float) -> dict[str, float]:
    """The replica's time between batches when the next one was already waiting (its first
    request reached the batcher more than a window plus 2 ms before the previous batch
    ended): Ray's semaphore hand-over, the result futures, the next model call's start;
    time the replica is taken that its batch log does not show. Quantiles and mean, ms.
    """
    gaps = []
    for run in runs:
        arrivals = np.sort(_parsed(run))
        k, prev_finish = 0, None
        for size, start, finish in run["batches"]:
            if k >= arrivals.size:
                break
            if prev_finish is not None and arrivals[k] + window_ms / 1e3 < prev_finish - 0.002:
                gaps.append((start - prev_finish) * 1e3)
            k += int(size)
            prev_finish = finish
    q = np.percentile(gaps, [10, 50, 90]) if gaps else [np.nan] * 3
    return {"n": len(gaps), "p10": float(q[0]), "p50": float(q[1]), "p90": float(q[2]),
            "mean": float(np.mean(gaps)) if gaps else float("nan")}


def contention_ms(runs: list[dict[str, Any]], early_ms: float = 14.0) -> dict[str, float]:
    """How much the replica's front end lengthens a running batch (ms): per request sent
    while it runs, and per answer of the batch before it when it followed that one at once
    (within 4 ms, the hand-over's 90th percentile). Fitted on batches of one request that
    ran at least ``early_ms``: their time past ``early_ms`` against the sends in their first
    ``early_ms`` and the previous batch's answers, by least squares. Counting the sends over
    a fixed early stretch keeps the fit from reading "longer batches see more sends" as the
    sends' cost (over the whole batch the count grows with the batch's own length).
    """
    rows, target = [], []
    for run in runs:
        sent = np.sort([c[2] for c in run["client"] if c[2] is not None])
        prev: list[float] | None = None
        for size, start, finish in run["batches"]:
            if int(size) == 1 and (finish - start) * 1e3 >= early_ms:
                early = int(np.searchsorted(sent, start + early_ms / 1e3)
                            - np.searchsorted(sent, start))
                answers = prev[0] if prev is not None and start - prev[2] < 0.004 else 0.0
                rows.append([1.0, early, answers])
                target.append((finish - start) * 1e3 - early_ms)
            prev = [float(size), start, finish]
    a, y = np.array(rows), np.array(target)
    coef = np.linalg.lstsq(a, y, rcond=None)[0]
    resid = y - a @ coef
    se = np.sqrt(np.diag(resid @ resid / (len(y) - 3) * np.linalg.inv(a.T @ a)))
    return {"n": len(y), "arrival_busy_ms": float(coef[1]), "arrival_se_ms": float(se[1]),
            "answer_busy_ms": float(coef[2]), "answer_se_ms": float(se[2])}


def stage_overheads(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``service.overheads`` for these runs: the fitted inbound and outbound FIFO costs and
    the pure delay beside them (the two residual medians), with the fit itself.
    """
    split = path_split(runs)
    inbound, outbound = split["inbound"], split["outbound"]
    return {"overheads": {"proxy_in_ms": inbound["cost_ms"],
                          "proxy_out_ms": outbound["cost_ms"],
                          "request_ms": round(max(0.0, inbound["delay_ms"])
                                              + max(0.0, outbound["delay_ms"]), 3)},
            "fit": split}


def fit_stage(start_s: np.ndarray, end_s: np.ndarray) -> dict[str, float]:
    """The FIFO cost (ms) whose departures from ``start_s`` (served in time order) leave
    the least-variance residual ``end_s - departure``, and that residual's median (the pure
    delay beside the stage).
    """
    order = np.argsort(start_s, kind="stable")
    s, e = start_s[order], end_s[order]
    var = [float(np.var(e - fifo_departures(s, c / 1e3))) for c in COSTS_MS]
    best = float(COSTS_MS[int(np.argmin(var))])
    resid = e - fifo_departures(s, best / 1e3)
    return {"cost_ms": best, "delay_ms": float(np.median(resid) * 1e3),
            "resid_sd_ms": float(np.std(resid) * 1e3),
            "resid_sd_no_stage_ms": float(np.std(e - s) * 1e3)}


def path_split(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median path times (ms) and the fitted stages over a list of runs (stacked, each
    run's times kept apart by a gap so no stage carries over).
    """
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("sent", "entered", "parsed",
                                                         "answered", "received")}
    offset = 0.0
    for run in runs:
        j = joined(run)
        base = j["sent"][0]
        for k, v in j.items():
            parts[k].append(v - base + offset)
        offset += float(j["received"].max() - base) + 10.0
    a = {k: np.concatenate(v) for k, v in parts.items()}
    outside = (a["parsed"] - a["sent"]) + (a["received"] - a["answered"])
    return {"n": int(a["sent"].size),
            "outside_ms_p50": float(np.median(outside) * 1e3),
            "in_ms_p50": float(np.median(a["entered"] - a["sent"]) * 1e3),
            "body_ms_p50": float(np.median(a["parsed"] - a["entered"]) * 1e3),
            "out_ms_p50": float(np.median(a["received"] - a["answered"]) * 1e3),
            "inbound": fit_stage(a["sent"], a["parsed"]),
            "outbound": fit_stage(a["answered"], a["received"])}


def main() -> None:
    """Print the path split and the rule check of a results file (default: the committed
    ``fidelity_rayserve-proxy``; pass another stem, e.g. ``fidelity_rayserve-TAG``).
    """
    from benchmarks.fidelity_rayserve import _load  # (that module imports this one)

    out = _load(sys.argv[1] if len(sys.argv) > 1 else "fidelity_rayserve-proxy")
    for st in out["settings"]:
        print(f"== {st['setting']}")
        for rho in sorted({r["rho"] for r in st.get("raw", [])}):
            runs = [r for r in st["raw"] if r["rho"] == rho]
            print(f"rho {rho}: split {json.dumps(path_split(runs))}")
            print(f"rho {rho}: rule {rule_check_runs(runs, st['max_batch_size'], st['window_ms'])}")


if __name__ == "__main__":
    main()
