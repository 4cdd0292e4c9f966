"""Hardware planning: the cheapest device × tensor parallelism × replica count that holds the
SLOs for a model and a load, by simulation with the roofline step model.

For every device and tensor-parallel size that fits the model, the fewest replicas meeting
every SLO on every seed is found by doubling then bisecting (more replicas never make a
percentile worse in expectation); each candidate is then priced (price per GPU-hour × tp ×
replicas). The uncertainty shown is the spread of the percentiles over the seeds and the
held-out error of the coefficient set's fit.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from sim.errors import UserError
from sim.scenario.roofline.hardware import HardwareError, kv_cache_blocks, load_device
from sim.scenario.roofline.model import load_coefficients
from sim.scenario.roofline.service import load_shape


@dataclass(frozen=True)
class Slo:
    """One objective: ``metric`` (ttft_ms, tpot_ms, itl_ms, e2e_ms) at ``stat`` ≤ ``limit_ms``."""

    metric: str
    stat: str
    limit_ms: float

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft_p99_ms=500`` -> Slo('ttft_ms', 'p99', 500).

        Raises:
            UserError: not METRIC_STAT_ms=NUMBER with a known metric and statistic.
        """
        key, _, value = text.partition("=")
        parts = key.split("_")
        allowed = "ttft|tpot|itl|e2e _ mean|p50|p90|p95|p99 _ms=NUMBER, e.g. ttft_p99_ms=500"
        if len(parts) != 3 or parts[0] not in ("ttft", "tpot", "itl", "e2e") or \
                parts[1] not in ("mean", "p50", "p90", "p95", "p99") or parts[2] != "ms":
            raise UserError(f"--slo {text!r}: allowed: {allowed}")
        try:
            limit = float(value)
        except ValueError:
            raise UserError(f"--slo {text!r}: the limit must be a number of ms") from None
        if limit <= 0:
            raise UserError(f"--slo {text!r}: the limit must be > 0")
        return cls(f"{parts[0]}_ms", parts[1], limit)


@dataclass
class Candidate:
    """One device × tp with the replicas it needs (None: not within ``max_replicas``)."""

    device: str
    tp: int
    price_per_gpu_hour: float
    replicas: int | None = None
    metrics: dict[str, list[float]] = field(default_factory=dict)  # "ttft_ms p99" -> seeds
    note: str = ""
    fit_error: float | None = None

    @property
    def cost_per_hour(self) -> float | None:
        """Price of the fleet per hour (None when no replica count held the SLOs)."""
        if self.replicas is None:
            return None
        return self.price_per_gpu_hour * self.tp * self.replicas


def _run(base: dict[str, Any], replicas: int, seed: int) -> dict[str, Any]:
    import sim.llm

    data = copy.deepcopy(base)
    data["replicas"] = replicas
    data["seed"] = seed
    return dict(sim.llm.run(data).summary)


def _holds(summaries: list[dict[str, Any]], slos: list[Slo]) -> bool:
    for s in summaries:
        if s["ok"] < s["requests"]:
            return False
        for slo in slos:
            value = (s.get(slo.metric) or {}).get(slo.stat)
            if value is None or value > slo.limit_ms:
                return False
    return True


def plan(base: dict[str, Any], devices: dict[str, float], tps: list[int], slos: list[Slo],
         seeds: int = 2, max_replicas: int = 16) -> list[Candidate]:
    """Every device × tp with the fewest replicas holding ``slos`` on all ``seeds``,
    cheapest first (those that never hold them last).

    Args:
        base: An LLM scenario dict whose ``service`` is ``llm_roofline`` (its device and tp
            are replaced per candidate).
        devices: Device sheet -> price per GPU-hour.
        tps: Tensor-parallel sizes to try.
        slos: Objectives every seed must meet.
        seeds: Seeds per replica count.
        max_replicas: The most replicas tried.

    Raises:
        UserError: no SLO, an unknown device, or a base that is not an llm_roofline scenario.
    """
    if not slos:
        raise UserError("--slo: give at least one, e.g. --slo ttft_p99_ms=1000")
    service = base.get("service") or {}
    if service.get("kind") != "llm_roofline":
        raise UserError("service.kind: plan needs an llm_roofline scenario")
    shape = load_shape(str(service["model"]), service.get("dtype"))
    out = []
    for device_name, price in devices.items():
        device = load_device(device_name)
        coeffs = load_coefficients(str(service.get("coefficients", "builtin")), device.kind)
        fit_error = ((coeffs.meta.get("fit") or {}).get("held_out") or {}).get("median_abs")
        for tp in tps:
            cand = Candidate(device_name, tp, price, fit_error=fit_error)
            out.append(cand)
            try:
                shape.check_tp(tp)
                kv_cache_blocks(shape, device, tp, 16,
                                float(service.get("gpu_memory_utilization", 0.9)))
            except HardwareError as exc:
                cand.note = str(exc).split(": ", 1)[-1].split(";")[0]
                continue
            trial = copy.deepcopy(base)
            trial["service"] = {**service, "device": device_name, "tp": tp}
            policy = trial.get("policy") or {}
            policy.pop("num_gpu_blocks", None)  # sized for this device and tp
            _search(cand, trial, slos, seeds, max_replicas)
    return sorted(out, key=lambda c: (c.cost_per_hour is None, c.cost_per_hour or 0.0))


def _search(cand: Candidate, trial: dict[str, Any], slos: list[Slo], seeds: int,
            max_replicas: int) -> None:
    tried: dict[int, list[dict[str, Any]]] = {}

    def holds(n: int) -> bool:
        tried[n] = [_run(trial, n, seed) for seed in range(seeds)]
        return _holds(tried[n], slos)

    lo, hi = 0, 1  # lo fails (0 replicas always does), hi is the candidate
    while not holds(hi):
        lo = hi
        if hi >= max_replicas:
            cand.note = f"misses the SLOs at {max_replicas} replicas"
            return
        hi = min(2 * hi, max_replicas)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    cand.replicas = hi
    cand.metrics = {f"{slo.metric} {slo.stat}": [s[slo.metric][slo.stat] for s in tried[hi]]
                    for slo in slos}
