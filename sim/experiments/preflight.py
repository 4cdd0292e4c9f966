"""Pre-flight estimates: how much memory and time a run, a sweep or a capacity search will
take, known from the scenario before anything is simulated.

A small input can ask for a great deal (``n_requests: 1e9``, ``control_period_s: 1e-9``, a
three-row trace at ``rate_scale: 1e9``). The CLI estimates the work first and refuses beyond
:data:`BUDGET` unless given ``--yes``. The estimate is deliberately simple and on the safe
side: it counts what drives the cost (requests, generated tokens, control ticks, MMPP state
changes) and prices each with rates measured on a loaded 2-core machine (see the constants).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.errors import UserError

# Measured on a 2-core machine with other jobs running (this module's numbers, rounded
# to the safe side): about 55,000 requests/s simulated; peak memory 130 B per request with
# full records, 51 with summary and 34 with sketch. The LLM simulator generated 127,000
# tokens/s on the Azure trace. Each rate below is about half of what was measured.
REQUESTS_PER_S = 25_000.0
EVENTS_PER_S = 100_000.0  # control ticks, MMPP state changes
TOKENS_PER_S = 60_000.0
BYTES_PER_REQUEST = {"full": 300.0, "summary": 120.0, "sketch": 80.0}
BYTES_PER_LLM_REQUEST = 400.0
BYTES_PER_TOKEN = 40.0  # the token-time slot and the token table
BYTES_PER_TICK = 64.0  # the fleet's log per control tick
# prefix caching: per KV block and replica, two Python lists of 8-byte slots (reference
# counts, cached keys) and a third while the invariants are checked
BYTES_PER_CACHED_BLOCK = 24.0
BASE_BYTES = 256 * 2**20  # the interpreter, numpy, pandas, simpy


@dataclass(frozen=True)
class Budget:
    """What a command may use without ``--yes``."""

    memory_bytes: float = 4 * 2**30
    time_s: float = 600.0


BUDGET = Budget()
# What a live run may hold without ``--yes``: the same memory; no time limit here, since a
# live run lasts its schedule's real span (``--max-wall-s`` bounds that)
MEMORY_BUDGET = Budget(time_s=math.inf)


class BudgetError(UserError):
    """The estimated work exceeds the budget (and ``--yes`` was not given)."""


@dataclass(frozen=True)
class Estimate:
    """The estimated cost of some work.

    Attributes:
        requests: Requests simulated.
        memory_bytes: Peak memory.
        time_s: Wall time on one core.
        driver: The field that drives the cost the most (what to lower), e.g.
            ``workload.n_requests``.
        detail: What the estimate counted, in words.
    """

    requests: float
    memory_bytes: float
    time_s: float
    driver: str
    detail: str
    verb: str = "lower"  # what to do with ``driver``: lower it, or raise it (a period)

    def text(self, timed: bool = True) -> str:
        """``about 1.2 GiB and 3 min (2e+07 requests)``; not ``timed``: ``about 1.2 GiB of
        memory (2e+07 requests)``.
        """
        cost = f"and {_duration(self.time_s)}" if timed else "of memory"
        return f"about {_bytes(self.memory_bytes)} {cost} ({self.detail})"


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n / 1024:.3g} KiB"


def _duration(s: float) -> str:
    if not math.isfinite(s):
        return "forever"
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return f"{s:.3g} s"


def check(estimate: Estimate, what: str, *, yes: bool = False,
          budget: Budget | None = None) -> None:
    """Refuse ``estimate`` beyond ``budget`` (default :data:`BUDGET`) unless ``yes``.

    Raises:
        BudgetError: one line naming the estimate, the budget, the field that drives the
            cost, and ``--yes``.
    """
    budget = BUDGET if budget is None else budget
    if yes or (estimate.memory_bytes <= budget.memory_bytes and estimate.time_s <= budget.time_s):
        return
    timed = math.isfinite(budget.time_s)  # else a memory budget only (MEMORY_BUDGET)
    limit = _bytes(budget.memory_bytes) + (f" and {_duration(budget.time_s)}" if timed else
                                           " of memory")
    raise BudgetError(f"{estimate.driver}: this {what} would take {estimate.text(timed)}, "
                      f"beyond the budget of {limit}; {estimate.verb} {estimate.driver}, or "
                      "pass --yes to run it anyway")


# -- one run -----------------------------------------------------------------------------------
def _mean_rate_rps(workload: Any) -> float:
    if workload.kind == "mmpp":
        rates = workload.rates_rps
        dwell = workload.mean_dwell_s if isinstance(workload.mean_dwell_s, list) \
            else [workload.mean_dwell_s] * len(rates)
        return float(sum(r * d for r, d in zip(rates, dwell, strict=False)) / sum(dwell))
    return float(getattr(workload, "rate_rps", math.nan))


def _trace_rows(workload: Any) -> float:
    from sim.scenario.workloads import data_path

    try:
        with data_path(workload.path).open("rb") as fh:
            return float(max(0, sum(1 for _ in fh) - 1))
    except (OSError, UserError):
        return 0.0  # the run names the bad path


def _service_s(scenario: Any) -> float:
    """A batch of one's mean service time (s), for closed-loop round trips."""
    service = scenario.service
    for name in ("ms", "mean_ms"):
        if hasattr(service, name):
            return float(getattr(service, name)) / 1e3
    if service.kind == "linear":
        return float(service.base_ms + service.per_item_ms) / 1e3
    if service.kind == "profile":
        try:
            from calibration.profile import load_profile

            return float(load_profile(service.path).mean_s(1))
        except (UserError, ValueError, KeyError, OSError):
            return 1e-3
    return 1e-3


def _trace_span_s(workload: Any) -> float:
    """Simulated seconds the trace spans (its first to its last timestamp, after
    ``start_s`` and ``time_scale``), read from the first and last rows only; NaN where they
    cannot be read (the run names the problem).
    """
    import csv
    import io

    from sim.scenario.workloads import data_path

    try:
        with data_path(workload.path).open("rb") as fh:
            head = fh.readline().decode("utf-8", "replace")
            first = fh.readline().decode("utf-8", "replace")
            fh.seek(0, io.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            tail = [t for t in fh.read().decode("utf-8", "replace").splitlines() if t.strip()]
        column = next(csv.reader([head])).index(workload.timestamp_column)
        values = [next(csv.reader([line]))[column] for line in (first, tail[-1])]
        try:
            t0, t1 = (float(v) for v in values)
        except ValueError:
            import pandas as pd

            stamps = pd.to_datetime(pd.Series(values), format="mixed")
            t0, t1 = 0.0, float((stamps.iloc[1] - stamps.iloc[0]).total_seconds())
    except (OSError, UserError, ValueError, TypeError, IndexError, StopIteration,
            OverflowError):
        return math.nan
    span = (t1 - t0 - float(getattr(workload, "start_s", 0.0))) * float(workload.time_scale)
    return max(span, 0.0) if math.isfinite(span) else math.nan


def requests_and_horizon(scenario: Any) -> tuple[float, float, str]:
    """(requests, simulated seconds, the field that sets the count) of one run."""
    w = scenario.workload
    duration = getattr(w, "duration_s", None)
    n_max = float(w.n_requests) if getattr(w, "n_requests", None) is not None else math.inf
    if w.kind == "trace":
        rows = _trace_rows(w)
        count = min(n_max, rows * w.rate_scale)
        driver = "workload.n_requests" if n_max <= rows * w.rate_scale else (
            "workload.rate_scale" if w.rate_scale > 1 else "workload.path")
        # the simulated time: the trace's span, cut by duration_s, or by n_requests at
        # the trace's mean rate (control ticks are priced over it)
        span = _trace_span_s(w)
        if rows * w.rate_scale > 0 and count < rows * w.rate_scale:
            span *= count / (rows * w.rate_scale)
        return count, (min(span, duration) if duration is not None else span), driver
    if w.kind == "hash_trace":  # one request a row (a jsonl file: one more than counted)
        rows = _trace_rows(w) + 1
        count = min(n_max, rows)
        return count, (duration if duration is not None else math.nan), (
            "workload.n_requests" if n_max <= rows else "workload.path")
    if w.kind == "closed":
        # each client sends again a think time after its answer: the round trip sets both
        # the count (by duration_s) and the simulated time (by n_requests)
        round_trip = w.think_ms / 1e3 + _service_s(scenario)
        by_time = math.inf if duration is None else \
            w.clients * duration / max(round_trip, 1e-9)
        count = min(n_max, by_time)
        horizon = duration if duration is not None else count * round_trip / w.clients
        return count, horizon, ("workload.n_requests" if n_max <= by_time
                                else "workload.duration_s")
    rate = _mean_rate_rps(w)
    by_time = math.inf if duration is None else rate * duration
    if n_max <= by_time:
        return n_max, (duration if duration is not None else n_max / rate), \
            "workload.n_requests"
    return by_time, float(duration or math.nan), "workload.duration_s"


def _extra_events(scenario: Any, horizon_s: float) -> tuple[float, float, str | None, str]:
    """Events besides requests: (autoscaler ticks, MMPP state changes, the field that drives
    the larger, and whether to lower or raise it).
    """
    if not math.isfinite(horizon_s):
        return 0.0, 0.0, None, "lower"
    ticks, changes, driver, verb = 0.0, 0.0, None, "lower"
    cfg = getattr(scenario, "autoscaling", None)
    if cfg is not None:
        cold_s = cfg.cold_start_s or 0.0
        ticks = (horizon_s + cold_s) / cfg.control_period_s
        # the autoscaler ticks until a scaled-from-zero replica is up: an hours-long cold
        # start is what to lower, else the period is what to raise
        driver, verb = (("autoscaling.cold_start_s", "lower")
                        if cold_s > max(10 * horizon_s, 3600.0)
                        else ("autoscaling.control_period_s", "raise"))
    w = scenario.workload
    if w.kind == "mmpp":
        dwell = w.mean_dwell_s if isinstance(w.mean_dwell_s, list) else [w.mean_dwell_s]
        changes = horizon_s / (sum(dwell) / len(dwell))
        if changes > ticks:
            driver, verb = "workload.mean_dwell_s", "raise"
    return ticks, changes, driver, verb


def estimate_run(scenario: Any, records: str | None = None) -> Estimate:
    """The cost of simulating one (request-level or LLM) scenario."""
    requests, horizon_s, driver = requests_and_horizon(scenario)
    ticks, changes, event_driver, verb = _extra_events(scenario, horizon_s)
    events = ticks + changes
    if getattr(scenario.service, "kind", "").startswith("llm_"):
        tokens = requests * _mean_output_tokens(scenario)
        memory = BASE_BYTES + requests * BYTES_PER_LLM_REQUEST + tokens * BYTES_PER_TOKEN \
            + ticks * BYTES_PER_TICK
        time_s = tokens / TOKENS_PER_S + requests / REQUESTS_PER_S + events / EVENTS_PER_S
        if tokens / TOKENS_PER_S > requests / REQUESTS_PER_S and requests <= 1e6:
            driver = "workload.output_tokens"
        detail = f"{requests:.3g} requests, {tokens:.3g} output tokens"
        blocks = _cached_blocks(scenario)
        if blocks:
            memory += blocks * BYTES_PER_CACHED_BLOCK
            detail += f", {blocks:.3g} prefix-cached KV blocks"
            if blocks * BYTES_PER_CACHED_BLOCK > requests * BYTES_PER_LLM_REQUEST \
                    + tokens * BYTES_PER_TOKEN:
                driver = "policy.num_gpu_blocks"
    else:
        kept = str(records or getattr(scenario, "records", "full"))
        if getattr(scenario, "autoscaling", None) is not None or (
                scenario.workload.kind == "closed"
                     and getattr(scenario.workload, "duration_s", None) is None):
            kept = "full"  # autoscaled runs and closed loops without duration_s keep all
        memory = BASE_BYTES + requests * BYTES_PER_REQUEST.get(kept, 300.0) \
            + ticks * BYTES_PER_TICK
        time_s = requests / REQUESTS_PER_S + events / EVENTS_PER_S
        detail = f"{requests:.3g} requests"
    if events:
        detail += f", {events:.3g} other events"
        if event_driver is not None and events / EVENTS_PER_S > requests / REQUESTS_PER_S:
            return Estimate(requests, memory, time_s, event_driver, detail, verb)
    return Estimate(requests, memory, time_s, driver, detail)


def _mean_output_tokens(scenario: Any) -> float:
    """Mean output tokens of the requests a replica could hold (the others are refused on
    arrival and generate nothing).
    """
    w = scenario.workload
    if w.kind == "hash_trace":
        return 1000.0  # lengths from the file; a typical length, as for an empirical draw
    spec = getattr(w, "output_tokens", None)
    column = getattr(w, "output_tokens_column", None)
    if column is not None:
        return _column_mean(scenario, column)
    if spec is None:
        return 1.0
    if isinstance(spec, int):
        return float(spec) if spec <= _kv_tokens(scenario) else 0.0
    if spec.dist == "constant":
        return float(spec.value) if spec.value <= _kv_tokens(scenario) else 0.0
    if spec.dist == "uniform":
        return float(spec.low + spec.high) / 2
    if spec.dist == "lognormal":
        return float(min(spec.mean, spec.max or math.inf))
    return 1000.0  # empirical: resampled from a column; a typical length


def _cached_blocks(scenario: Any) -> float:
    """KV blocks the prefix caches track, over all replica slots (0 without caching)."""
    policy = scenario.policy
    if not getattr(policy, "enable_prefix_caching", False) or not hasattr(policy, "blocks"):
        return 0.0
    return float(policy.blocks()) * float(getattr(scenario, "fleet_size", 1))


def _kv_tokens(scenario: Any) -> float:
    policy = scenario.policy
    if hasattr(policy, "blocks") and hasattr(policy, "block_size"):
        return float(policy.blocks() * policy.block_size)
    return math.inf


def _column_mean(scenario: Any, column: str) -> float:
    import numpy as np
    import pandas as pd

    from sim.scenario.workloads import data_path

    w = scenario.workload
    try:
        frame = pd.read_csv(data_path(w.path), usecols=[column, w.prompt_tokens_column]
                            if w.prompt_tokens_column else [column])
    except (OSError, ValueError, UserError, pd.errors.ParserError):
        return 1.0  # the run names the problem
    out = pd.to_numeric(frame[column], errors="coerce").to_numpy(float)
    if w.output_tokens_max is not None:
        out = np.minimum(out, w.output_tokens_max)
    prompt = pd.to_numeric(frame[w.prompt_tokens_column], errors="coerce").to_numpy(float) \
        if w.prompt_tokens_column else np.zeros_like(out)
    fits = np.nan_to_num(out, nan=0.0) * (prompt + out <= _kv_tokens(scenario))
    return float(fits.mean()) if fits.size else 1.0


# -- calibration ---------------------------------------------------------------------------------
def estimate_calibration(runner: Any, sizes: list[int], runs_per_size: int) -> Estimate:
    """What a calibration will take, from one timed batch of one request: time linear in
    the items run (a CPU's cost; a GPU is faster on large batches, so this errs long), and
    the payloads of the largest batch (the model's activations come on top).
    """
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    runner.run_batch(runner.payloads(1, rng))  # the first call pays one-off costs
    t0 = time.perf_counter()
    runner.run_batch(runner.payloads(1, rng))
    per_item_s = time.perf_counter() - t0
    sample = runner.payloads(4, rng)
    per_item_bytes = sum(_nbytes(p) for p in sample) / len(sample)
    items = float(sum(sizes)) * runs_per_size
    return Estimate(items, BASE_BYTES + max(sizes) * per_item_bytes, items * per_item_s,
                    "--batch-sizes", f"{len(sizes)} batch sizes up to {max(sizes):,}, "
                    f"{runs_per_size} runs each, {items:.3g} items at "
                    f"{per_item_s * 1e3:.3g} ms per item")


def _nbytes(payload: Any) -> float:
    """Rough bytes of one payload (arrays, tensors, strings, containers of them)."""
    if hasattr(payload, "nbytes"):
        return float(payload.nbytes)
    if hasattr(payload, "element_size") and hasattr(payload, "nelement"):
        return float(payload.element_size() * payload.nelement())
    if isinstance(payload, str | bytes):
        return float(len(payload))
    if isinstance(payload, dict):
        return sum(_nbytes(v) for v in payload.values())
    if isinstance(payload, list | tuple):
        return sum(_nbytes(v) for v in payload)
    return 64.0



# -- many runs ---------------------------------------------------------------------------------
def estimate_many(estimates: list[Estimate], workers: int, what: str) -> Estimate:
    """Runs spread over ``workers`` processes: time adds up per worker, memory is the
    ``workers`` largest runs at once.
    """
    if not estimates:
        return Estimate(0, BASE_BYTES, 0.0, "--grid", f"0 {what}")
    workers = max(1, min(workers, len(estimates)))
    biggest = sorted(e.memory_bytes for e in estimates)[-workers:]
    total_s = sum(e.time_s for e in estimates) / workers
    requests = sum(e.requests for e in estimates)
    top = max(estimates, key=lambda e: e.time_s)
    return Estimate(requests, sum(biggest), total_s, top.driver,
                    f"{len(estimates)} {what}, {requests:.3g} requests on {workers} "
                    f"process{'es' if workers > 1 else ''}", top.verb)
