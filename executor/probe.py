"""Probe: how fast the model runs *now*, through the live executor's own dispatch path.

A profile is measured once; a machine's speed is not constant (frequency scaling, other
tenants, thermal state — on the shared CPU VM we develop on, identical calibrations two
minutes apart differ by ~10%). A sim-vs-live comparison against a stale profile mixes that
drift into the prediction error. ``compare`` therefore probes the device right before and
right after each live run: back-to-back batches at each batch size the scenario can
dispatch, run by the live driver itself (a short run at saturation on the same runner: the same
driver and worker threads, bookkeeping and policy calls). Each batch yields two times:

- the model time (inside ``run_batch``, what calibration measures): the ratio of its medians
  to the profile's, a **speed scale per batch size** (pooled over the probes before and
  after a run; sizes between the probed ones interpolated in log size). A device need not
  drift evenly: on ``builtin:dyn-demo`` one probe found batch 1 at ×1.40 of the profile and
  batches 4–8 at ×0.8, which one scale pooled over sizes (×0.99) turned into a prediction
  25–44% low. The pooled scale is still reported (``scale``) and is what drift is measured
  on;
- the **dispatch overhead**: from one batch's dispatch to the next one's, minus the model
  time — thread wake-ups on both sides, payload preparation, the driver's bookkeeping and
  policy call. The replica cannot start its next batch before then, so it is part of the
  service time a queue sees; it is nearly constant, so its mean is precise.

When the profile has cold samples (runs after an idle gap), the probe also times batches of
the smallest size each after the same idle gap, for a separate **cold scale**: how much
slower a model runs after idling is not stable either (+49% on the day minilm-cpu was
measured, +3–6% on a later afternoon).

The profile rescaled by the scales plus the overhead
(:meth:`calibration.profile.LatencyProfile.rescaled`) is what the simulator predicts with —
the shape of the service-time distribution and the batching curve still come from the
calibration; only the levels are refreshed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration.model_runners import ModelRunner
from calibration.profile import LatencyProfile
from sim.errors import UserError
from sim.scenario.schema import Scenario


@dataclass(frozen=True)
class Probe:
    """Back-to-back batches measured through the live driver, per batch size.

    Attributes:
        model_median_s: Median time inside the model call, by batch size.
        profile_median_s: The profile's median at the same sizes.
        overhead_s: Mean over all batches of (dispatch to the next batch's dispatch) minus
            the model time (the mean: a queue's load grows with the mean service time,
            and the rare slow wake-up counts).
        reps: Batches timed at each size (after one discarded warm-up batch).
        wall_s: How long the probe took.
        model_se_rel: Standard error of each model-time median relative to it (normal
            approximation, 1.2533 σ / √n / median): how precise the probe is.
        cold_size: The size probed cold (0: none).
        cold_median_s: Median model time of the cold batches.
        cold_profile_median_s: The profile's cold median at that size.
        cold_reps: Cold batches timed.
        budget_s: The time the probe was asked to keep to (nan: not stated).
    """

    model_median_s: dict[int, float]
    profile_median_s: dict[int, float]
    overhead_s: float
    reps: dict[int, int]
    wall_s: float
    model_se_rel: dict[int, float] = field(default_factory=dict)
    cold_size: int = 0
    cold_median_s: float = math.nan
    cold_profile_median_s: float = math.nan
    cold_reps: int = 0
    budget_s: float = math.nan

    @property
    def cold_ratio(self) -> float:
        """Cold median / the profile's cold median (nan when not probed)."""
        return self.cold_median_s / self.cold_profile_median_s if self.cold_reps else math.nan

    @property
    def ratio_by_size(self) -> dict[int, float]:
        """Model-time median / profile median at each probed size."""
        return {b: self.model_median_s[b] / self.profile_median_s[b]
                for b in self.model_median_s}

    @property
    def log_ratios(self) -> list[tuple[float, int]]:
        """(log ratio, reps) per size, for pooling."""
        return [(math.log(r), self.reps[b]) for b, r in self.ratio_by_size.items()]

    @property
    def scale(self) -> float:
        """The pooled ratio: geometric mean of the per-size ratios weighted by reps."""
        return pooled_scale([self])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (milliseconds)."""
        return {"wall_s": self.wall_s, "budget_s": self.budget_s, "scale": self.scale,
                "overhead_ms": self.overhead_s * 1e3,
                "cold": {"batch_size": self.cold_size, "reps": self.cold_reps,
                         "model_median_ms": self.cold_median_s * 1e3,
                         "profile_median_ms": self.cold_profile_median_s * 1e3,
                         "ratio": self.cold_ratio},
                "sizes": [
                    {"batch_size": b, "reps": self.reps[b],
                     "model_median_ms": self.model_median_s[b] * 1e3,
                     "profile_median_ms": self.profile_median_s[b] * 1e3,
                     "ratio": self.ratio_by_size[b],
                     "se_rel": self.model_se_rel.get(b, math.nan)}
                    for b in sorted(self.model_median_s)]}

    def profile_for(self, profile: LatencyProfile, mode: str = "full",
                    others: Sequence[Probe] = ()) -> LatencyProfile:
        """``profile`` refreshed by this probe (and ``others``, e.g. the one after a run).

        Args:
            profile: The stored profile.
            mode: ``full``: a speed scale per probed batch size (:func:`pooled_scales`,
                interpolated between them) and the dispatch overhead; ``overhead``: only the
                overhead (the device's speed is known to match the profile, e.g. a replay).
            others: More probes to pool with this one.
        """
        if mode not in PROBE_MODES[1:]:
            raise UserError(f"probe mode {mode!r}: allowed: {', '.join(PROBE_MODES[1:])}")
        probes = [self, *others]
        scales = pooled_scales(probes) if mode == "full" else {profile.batch_sizes[0]: 1.0}
        cold = pooled_cold_scale(probes) if mode == "full" else None
        overhead_s = float(np.mean([p.overhead_s for p in probes]))
        return profile.rescaled(scales, add_s=overhead_s, cold_ratio=cold,
                                note={"by": "probe", "mode": mode,
                                      "scale": pooled_scale(probes) if mode == "full" else 1.0,
                                      "scale_by_size": {str(b): r for b, r in scales.items()},
                                      "overhead_ms": overhead_s * 1e3})


PROBE_MODES = ("off", "full", "overhead")


def probe_sizes(scenario: Scenario, profile: LatencyProfile) -> list[int]:
    """The profile's measured sizes a scenario can dispatch: up to the policy's largest batch
    times the request size, plus the next measured size above (so interpolation is covered).
    """
    policy = scenario.policy
    most = getattr(policy, "max_batch_size", None) or getattr(policy, "batch_size", None)
    if policy.kind == "none":
        most = 1
    cap_items = (most or profile.max_batch_size) * getattr(scenario.workload, "size", 1)
    sizes = [b for b in profile.batch_sizes if b <= cap_items]
    above = [b for b in profile.batch_sizes if b > cap_items]
    if above and (not sizes or sizes[-1] < cap_items):
        sizes.append(above[0])
    return sizes or [profile.batch_sizes[0]]


def _run_batches(runner: ModelRunner, workload: dict[str, Any], policy: dict[str, Any],
                 seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A short live run on ``runner``; per batch in dispatch order: start, finish and model
    time (finish − start − the thread hand-off).

    Raises:
        RuntimeError: a batch's model call failed.
    """
    from executor.live_requests import live
    from executor.request_driver import LiveDriver

    drivers: list[LiveDriver] = []
    cfg = {"name": "probe", "seed": seed, "service": {"kind": "constant", "ms": 1.0},
           "workload": workload, "policy": policy}
    result = live(cfg, runners=[runner], on_driver=drivers.append)
    if bool(result.batches["failed"].any()):
        reason = result.requests.loc[result.requests["status"] == "failed", "reason"].iloc[0]
        raise RuntimeError(f"probe: the model failed: {reason}")
    batches = result.batches.sort_values("start_s")
    start = batches["start_s"].to_numpy()
    finish = batches["finish_s"].to_numpy()
    return start, finish, finish - start - np.asarray(drivers[0].health.handoff_s)


def _saturated(runner: ModelRunner, size: int, n_batches: int, seed: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Run ``n_batches`` full batches of ``size`` back to back through the live driver.

    Returns:
        Per batch except the last: the model time and the overhead (from this batch's
        dispatch to the next one's, minus the model time).
    """
    start, _, model = _run_batches(
        runner, {"kind": "constant", "rate_rps": 1e6, "n_requests": size * n_batches},
        {"kind": "fixed", "batch_size": size}, seed)
    return model[:-1], np.diff(start) - model[:-1]


def _cold(runner: ModelRunner, n_batches: int, idle_s: float, warm_s: float, after_s: float,
          seed: int) -> np.ndarray:
    """Model times of single-request batches that each start after about ``idle_s`` idle
    (arrivals spaced ``idle_s`` + 1.2 × the warm time; only batches that really idled at least
    ``after_s`` count).
    """
    start, finish, model = _run_batches(
        runner, {"kind": "constant", "rate_rps": 1.0 / (idle_s + 1.2 * warm_s),
                 "n_requests": n_batches}, {"kind": "none"}, seed)
    idle = np.concatenate([[np.inf], start[1:] - finish[:-1]])
    return np.asarray(model[idle >= after_s], dtype=float)


def probe(runner: ModelRunner, profile: LatencyProfile, sizes: Sequence[int], *,
          budget_s: float = 3.0, min_reps: int = 8, max_reps: int = 400,
          seed: int = 0) -> Probe:
    """Run back-to-back batches of each size through the live driver and time them.

    Each size is a short live run at saturation (a backlog of requests, a fixed batch size)
    on ``runner``: the same driver thread, worker thread, bookkeeping and policy calls a live
    run has. The first batch (after idling) is discarded.

    Args:
        runner: The model runner (the one a live replica uses).
        profile: The profile whose medians the probe is compared with.
        sizes: Batch sizes (items) to probe; each must be measured in the profile.
        budget_s: The time the probe keeps to. A first timing (three batches of the
            smallest size) gives the device's speed, each batch's overhead beyond the model
            call and a live run's start-up cost; from them the probe plans the repetitions
            per size (within the bounds) and which sizes run: when ``min_reps`` of every
            size would not fit, the sizes that do not fit are left out
            (:func:`sizes_within_budget`; the smallest always runs), and where even that is
            too long, fewer batches run (at least 3). Each run corrects the estimate for
            the next; a size that no longer fits is skipped once one size is measured. With
            cold samples in the profile, what is left of the last third goes to cold
            batches (none when fewer than 3 fit). Only the first timing and one run of 3
            batches are certain to run, so a budget below them is overrun.
        min_reps: Fewest timed batches per size.
        max_reps: Most timed batches per size.
        seed: Seeds the payloads.

    Raises:
        ValueError: a size the profile does not hold, or bad bounds.
        RuntimeError: the model call failed during the probe.
    """
    missing = [b for b in sizes if b not in profile.samples_s]
    if missing or not sizes:
        raise ValueError(f"probe sizes {list(sizes)}: each must be a measured batch size of the "
                         f"profile ({profile.batch_sizes})")
    if not 1 <= min_reps <= max_reps or budget_s <= 0:
        raise ValueError("probe: need 1 <= min_reps <= max_reps and budget_s > 0")
    t0 = time.perf_counter()
    deadline_s = t0 + budget_s
    model: dict[int, float] = {}
    model_se: dict[int, float] = {}
    overheads: list[float] = []
    reps: dict[int, int] = {}
    cold_size = sizes[0] if sizes[0] == 1 and 1 in profile.cold_samples_s else 0
    warm_deadline_s = t0 + budget_s * (2 / 3 if cold_size else 1.0)
    ordered = sorted(sizes)
    # a first timing: three batches of the smallest size (also the warm-up) give the
    # device's speed against the profile, the overhead each batch adds beyond the model
    # call, and what one short live run costs beyond its batches (driver start-up, threads)
    first_model, first_extra = _saturated(runner, ordered[0], 3, seed)
    pilot_s = time.perf_counter() - t0
    speed = max(float(np.median(first_model)) / profile.median_s(ordered[0]), 1e-3)
    extra_s = max(float(np.median(first_extra)), 0.0)
    call_s = max(0.0, pilot_s - 3 * (float(np.median(first_model)) + extra_s))
    plan = _Plan(speed=speed, extra_s=extra_s, call_s=call_s)

    def cost_s(size: int) -> float:
        return plan.run_s(profile.median_s(size), min_reps + 2)

    chosen = sizes_within_budget(ordered, cost_s, warm_deadline_s - time.perf_counter())
    for i, size in enumerate(chosen):
        left_s = warm_deadline_s - time.perf_counter()
        # this size's share of what is left, keeping the minimum for the sizes after it;
        # fewer than min_reps batches (at least 3) only where the budget cannot hold them
        reserve_s = sum(cost_s(b) for b in chosen[i + 1:])
        share_s = (left_s - reserve_s) / (len(chosen) - i) if i < len(chosen) - 1 else \
            left_s - reserve_s
        n = plan.batches_within(profile.median_s(size), share_s, max_reps + 2) - 2
        if n < 3 and model:
            continue  # over budget already: the sizes measured so far pool into the scale
        n = max(n, 3)
        started_s = time.perf_counter()
        times, extra = _saturated(runner, size, n + 2, seed)
        plan.learn(profile.median_s(size), n + 2, time.perf_counter() - started_s)
        times, extra = times[1:], extra[1:]  # the first batch ran after idling
        model[size] = float(np.median(times))
        model_se[size] = float(1.2533 * np.std(times, ddof=1) / math.sqrt(times.size)
                               / model[size])
        overheads.extend(extra.tolist())
        reps[size] = int(times.size)
    cold_median_s, cold_reps = math.nan, 0
    if cold_size:
        idle_s = float((profile.meta.get("cold") or {}).get("idle_ms", 50.0)) / 1e3
        warm_s = model.get(cold_size, speed * profile.median_s(cold_size))
        # the arrivals are paced (the first one period after the start), so the run lasts
        # one live run's start-up, n periods and the last batch, which runs cold: the
        # profile's cold median at this run's speed
        period_s = idle_s + 1.2 * warm_s
        last_s = max(warm_s, speed * float(np.median(profile.cold_samples_s[cold_size])))
        n = min(int((deadline_s - time.perf_counter() - plan.fix * (plan.call_s + last_s))
                    / period_s), max_reps)
        if n >= 3:  # fewer cold batches say nothing: no cold scale rather than overrun
            cold_times = _cold(runner, n, idle_s, warm_s, profile.cold_after_s, seed)
            if cold_times.size:
                cold_median_s, cold_reps = float(np.median(cold_times)), int(cold_times.size)
    cold_profile_s = (float(np.median(profile.cold_samples_s[cold_size])) if cold_size
                      else math.nan)
    return Probe(model, {b: profile.median_s(b) for b in model}, float(np.mean(overheads)),
                 reps, time.perf_counter() - t0, model_se, cold_size, cold_median_s,
                 cold_profile_s, cold_reps, budget_s)


@dataclass
class _Plan:
    """How long a probe run will take, from the first timing, corrected by each run since.

    A run of ``n`` batches of a size whose profile median is ``median_s`` lasts about
    ``call_s + n * (speed * median_s + extra_s)``; ``fix`` is the ratio of what the last
    run really took to that estimate (a machine whose load changed mid-probe).
    """

    speed: float
    extra_s: float
    call_s: float
    fix: float = 1.0

    def batch_s(self, median_s: float) -> float:
        """One batch's wall time (model call plus the dispatch overhead)."""
        return max(self.speed * median_s + self.extra_s, 1e-6)

    def run_s(self, median_s: float, n: int) -> float:
        """A run of ``n`` batches, start-up included."""
        return self.fix * (self.call_s + n * self.batch_s(median_s))

    def batches_within(self, median_s: float, budget_s: float, most: int) -> int:
        """The most batches (at most ``most``) whose run fits ``budget_s``."""
        room_s = budget_s / self.fix - self.call_s
        return int(min(max(room_s, 0.0) / self.batch_s(median_s), most))

    def learn(self, median_s: float, n: int, took_s: float) -> None:
        """Correct the estimate by a run that took ``took_s``."""
        estimate_s = self.call_s + n * self.batch_s(median_s)
        self.fix = float(np.clip(took_s / estimate_s, 0.5, 4.0))


def sizes_within_budget(sizes: Sequence[int], cost_s: Callable[[int], float],
                        budget_s: float) -> list[int]:
    """The sizes to probe so that their estimated cost fits ``budget_s``: the smallest
    always (the cheapest, and the size a light load dispatches most: each size now gets its
    own scale, so a size left out is a guess), then the largest (the range the scenario
    dispatches) and the middle ones in bisection order while they fit. The sizes left out
    take the scale interpolated between their probed neighbours (the nearest one's beyond).
    """
    ordered = sorted(sizes)
    priority = [ordered[0], ordered[-1]]
    spans = [(0, len(ordered) - 1)]
    while spans:
        lo, hi = spans.pop(0)
        if hi - lo < 2:
            continue
        mid = (lo + hi) // 2
        priority.append(ordered[mid])
        spans += [(lo, mid), (mid, hi)]
    chosen: list[int] = []
    spent = 0.0
    for size in dict.fromkeys(priority):
        cost = cost_s(size)
        if not chosen or spent + cost <= budget_s:
            chosen.append(size)
            spent += cost
    return sorted(chosen)


def pooled_scale(probes: Sequence[Probe]) -> float:
    """One speed ratio from probes (e.g. the two around a run): the geometric mean of all
    per-size ratios, weighted by the batches timed at each.
    """
    pairs = [pair for p in probes for pair in p.log_ratios]
    total = sum(n for _, n in pairs)
    return math.exp(sum(lr * n for lr, n in pairs) / total)


def pooled_scales(probes: Sequence[Probe]) -> dict[int, float]:
    """A speed ratio per probed batch size from probes (e.g. the two around a run): at each
    size, the geometric mean of the probes' ratios weighted by the batches timed. A device
    need not slow down evenly: a batch of one may run 40% slower than profiled while batches
    of 4-8 run 20% faster (the thread hand-off and per-call costs weigh most on small
    batches), which one pooled ratio would average away. Sizes between the probed ones take
    the ratio interpolated in log batch size (:meth:`LatencyProfile.rescaled`).
    """
    logs: dict[int, list[tuple[float, int]]] = {}
    for p in probes:
        for size, ratio in p.ratio_by_size.items():
            logs.setdefault(size, []).append((math.log(ratio), p.reps[size]))
    return {size: math.exp(sum(lr * n for lr, n in pairs) / sum(n for _, n in pairs))
            for size, pairs in sorted(logs.items())}


def pooled_cold_scale(probes: Sequence[Probe]) -> float | None:
    """One cold ratio from probes: geometric mean weighted by cold batches (None: none)."""
    pairs = [(math.log(p.cold_ratio), p.cold_reps) for p in probes if p.cold_reps]
    total = sum(n for _, n in pairs)
    return math.exp(sum(lr * n for lr, n in pairs) / total) if total else None


def drift(before: Probe, after: Probe) -> float:
    """Relative change of the device's speed across a run: after.scale / before.scale − 1
    (positive: slower afterwards).
    """
    return after.scale / before.scale - 1
