"""Fit the roofline step model's coefficients to measured step profiles.

Each measured step (a profile's grid points, its prefix-attention chunks and its held-out
trace steps; the median of the repeated timings) becomes one row: the term bases of its
composition on the profile's model and device, and its measured time. Non-negative least
squares on the *relative* error (each row divided by its time, so a 2 ms decode counts as
much as a 300 ms prefill) gives the coefficients; a seeded random share of the rows is held
out and its error reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration.step_profile import StepProfile, load_step_profile
from sim.scenario.roofline.hardware import DeviceSheet, HardwareError, ModelShape, load_device
from sim.scenario.roofline.model import (
    DEFAULT_BETA,
    TERMS,
    Coefficients,
    RooflineStepModel,
    terms_us,
)
from sim.serving.llm.step_model import Composition

TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class StepRow:
    """One measured step: its composition, median seconds, and the profile it came from."""

    comp: Composition
    measured_s: float
    source: str


@dataclass(frozen=True)
class ProfileData:
    """A step profile's rows with the model and device they were measured on."""

    name: str
    shape: ModelShape
    device: DeviceSheet
    tp: int
    rows: list[StepRow]


def shape_from_profile(profile: StepProfile, name: str) -> ModelShape:
    """The decoder shape a ``calibrate --model llm`` profile records in its meta.

    Raises:
        HardwareError: the profile has no model parameters.
    """
    model = profile.meta.get("model") or {}
    params = model.get("params") if isinstance(model, dict) else None
    if not isinstance(params, dict):
        raise HardwareError(f"--profile {name}: no meta.model.params (a profile written by "
                            "servelab calibrate --model llm)")
    try:
        hidden, heads = int(params["hidden"]), int(params["heads"])
        return ModelShape(name=name, layers=int(params["layers"]), hidden=hidden, heads=heads,
                          kv_heads=int(params.get("kv_heads", heads)),
                          head_dim=hidden // heads, intermediate=int(params["intermediate"]),
                          vocab=int(params["vocab"]),
                          dtype=TORCH_DTYPES.get(str(profile.meta.get("dtype")), "fp32"))
    except (KeyError, TypeError, ValueError) as exc:
        raise HardwareError(f"--profile {name}: bad meta.model.params ({exc})") from None


def _comp(p: int, d: int, kv: int, start: int = 0) -> Composition:
    return Composition(prefill_tokens=p, decode_seqs=d, kv_tokens=kv,
                       prefill_context=p * start, prefill_seqs=1 if p else 0,
                       prefill_sq=p * p)


def profile_rows(profile: StepProfile, source: str) -> list[StepRow]:
    """Every measured composition of a profile (one chunk of ``P`` tokens from its start,
    ``D`` decodes at context ``L`` each), with its median time.
    """
    rows = []
    for key, values in profile.samples_s.items():
        p, d, ctx = (int(v) for v in key.split(","))
        rows.append(StepRow(_comp(p, d, d * ctx), float(np.median(values)), source))
    for key, values in profile.prefill_context_s.items():
        n, start = (int(v) for v in key.split(","))
        rows.append(StepRow(_comp(n, 0, 0, start), float(np.median(values)), source))
    for row in (profile.meta.get("held_out") or {}).get("rows", []):
        p, d, kv = int(row["prefill_tokens"]), int(row["decode_seqs"]), int(row["kv_tokens"])
        # the calibration ran the chunk from start = context // P, the decodes at kv // D
        start = int(row.get("prefill_context", 0)) // p if p else 0
        per = max(1, kv // d) if d else 0
        rows.append(StepRow(_comp(p, d, per * d, start), float(row["measured_ms"]) / 1e3,
                            source))
    return [r for r in rows if r.measured_s > 0 and r.comp.batched_tokens > 0]


def load_profile_data(ref: str, device: str | None = None, tp: int = 1) -> ProfileData:
    """A profile's rows, shape and device sheet (``cpu`` for CPU profiles unless given).

    Raises:
        HardwareError: a GPU profile without ``device``, or a bad profile.
    """
    profile = load_step_profile(ref)
    name = ref.removeprefix("builtin:").removesuffix(".json").rsplit("/", 1)[-1]
    kind = str((profile.meta.get("device") or {}).get("kind", ""))
    if device is None:
        if kind != "cpu":
            where = kind or "an unknown device"
            raise HardwareError(f"--device: profile {ref!r} was measured on {where}; name "
                                "its device sheet (h100-sxm, a100-80gb, l40s, h200, or a "
                                ".yaml)")
        device = "cpu"
    return ProfileData(name, shape_from_profile(profile, name), load_device(device), tp,
                       profile_rows(profile, name))


def design(data: list[ProfileData]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Basis matrix (rows × :data:`TERMS`), measured µs, and each row's source."""
    xs, ys, src = [], [], []
    for prof in data:
        for row in prof.rows:
            basis = terms_us(prof.shape, prof.device, prof.tp, row.comp)
            xs.append([basis[t] for t in TERMS])
            ys.append(row.measured_s * 1e6)
            src.append(row.source)
    return np.asarray(xs, float), np.asarray(ys, float), src


def nnls_relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising Σ ((x·β − y) / y)²; unused columns get 0."""
    from scipy.optimize import nnls

    a = x / y[:, None]
    scale = np.linalg.norm(a, axis=0)
    used = scale > 0
    beta = np.zeros(x.shape[1])
    if used.any():
        sol, _ = nnls(a[:, used] / scale[used], np.ones(len(y)), maxiter=50 * x.shape[1])
        beta[used] = sol / scale[used]
    return beta


def errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    """Relative error statistics: median and p90 of |error|, mean signed (bias: > 0 means
    the prediction is slow, too long), and the count.
    """
    if not len(meas):
        return {"n": 0}
    rel = (pred - meas) / meas
    return {"median_abs": float(np.median(np.abs(rel))),
            "p90_abs": float(np.percentile(np.abs(rel), 90)),
            "mean_signed": float(np.mean(rel)), "n": len(meas)}


def fit(data: list[ProfileData], holdout: float = 0.25, seed: int = 0,
        name: str = "fitted") -> Coefficients:
    """Fit coefficients to the profiles' rows, holding out a random ``holdout`` share.

    Raises:
        HardwareError: no rows, or a bad hold-out share.
    """
    if not 0 <= holdout < 1:
        raise HardwareError(f"--holdout: {holdout} must be in [0, 1)")
    x, y, src = design(data)
    if len(y) < len(TERMS):
        raise HardwareError(f"--profile: {len(y)} measured steps are too few to fit "
                            f"{len(TERMS)} coefficients")
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), bool)
    test[rng.choice(len(y), size=round(holdout * len(y)), replace=False)] = True
    beta = nnls_relative(x[~test], y[~test])
    unused = [t for t, col in zip(TERMS, x.T, strict=True) if not col.any()]
    for term in unused:  # what no measured step shows keeps its default (see DEFAULT_BETA)
        beta[TERMS.index(term)] = DEFAULT_BETA.get(term, 0.0)
    pred = x @ beta
    by_source = {s: {"train": errors(pred[(np.asarray(src) == s) & ~test],
                                      y[(np.asarray(src) == s) & ~test]),
                     "held_out": errors(pred[(np.asarray(src) == s) & test],
                                        y[(np.asarray(src) == s) & test])}
                 for s in dict.fromkeys(src)}
    meta: dict[str, Any] = {
        "fitted_on": {
            "models": [{"name": p.name, "layers": p.shape.layers, "hidden": p.shape.hidden,
                        "heads": p.shape.heads, "kv_heads": p.shape.kv_heads,
                        "intermediate": p.shape.intermediate, "vocab": p.shape.vocab,
                        "dtype": p.shape.dtype} for p in data],
            "devices": sorted({p.device.name for p in data}),
            "engines": ["servelab's step profiles (calibrate --model llm)"]},
        "fit": {"method": "non-negative least squares on relative error", "seed": seed,
                "holdout": holdout, "train": errors(pred[~test], y[~test]),
                "held_out": errors(pred[test], y[test]), "by_profile": by_source,
                "not_identified": unused}}
    return Coefficients({t: float(b) for t, b in zip(TERMS, beta, strict=True)}, name, meta)


def predict_s(data: ProfileData, coefficients: Coefficients) -> tuple[np.ndarray, np.ndarray]:
    """Predicted and measured seconds of every row of a profile."""
    model = RooflineStepModel(data.shape, data.device, data.tp, coefficients)
    pred = np.asarray([model.step_s(r.comp) for r in data.rows])
    return pred, np.asarray([r.measured_s for r in data.rows])
