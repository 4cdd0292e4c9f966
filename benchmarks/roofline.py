"""Roofline step model validation: predict a model the coefficients never saw.

A. CPU, this machine: three decoder shapes measured in one shuffled session
   (``benchmarks/roofline_measure.py``; thread CPU time, see there). For each shape, fit the
   coefficients on the other two and predict every measured step of the third; report the
   relative error per kind of step and the terms' shares, and the same for the shape-blind
   baseline (``llm_linear``'s ``a + b·P + c·D + d·K`` fitted on the same two). Then simulate
   a vLLM-chunked Poisson load on the third shape twice, with its measured profile
   (``llm_profile``) and with the roofline fitted on the other two (``llm_roofline``), and
   report TTFT/TPOT/E2E errors with their sign.
B. GPU, public measurements: Vidur's per-layer operator times of Llama-style models on H100
   and A100 (``benchmarks/data/vidur_layer_ops.csv``, MIT), leave-one-model-out: fit the
   compute, weight-bytes and per-layer terms on the other models of the device and predict
   the held-out model's layer time at every token count and tensor parallelism.

C. (``--live``) One live run of the held-out ``tiny`` shape on this machine (servelab's own
   engine and decoder, one thread), against the simulator with the roofline fitted without
   it, on the same arrival schedule. Indicative only: the shared machine's load moves live
   step times by tens of percent between minutes.

Relative error = (predicted − measured) / measured: a positive mean is a slow (pessimistic)
prediction. Usage: python benchmarks/roofline.py [--live]. Writes
benchmarks/results/roofline.md and roofline.json.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sim.llm  # noqa: E402
from sim.scenario.roofline.fit import (  # noqa: E402
    ProfileData,
    errors,
    fit,
    load_profile_data,
    nnls_relative,
)
from sim.scenario.roofline.hardware import ModelShape, load_device  # noqa: E402
from sim.scenario.roofline.model import TERMS, RooflineStepModel, terms_us  # noqa: E402
from sim.serving.llm.step_model import Composition  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CPU_PROFILES = RESULTS / "roofline_cpu"
SHAPES = ("tiny", "small", "wide")
VIDUR = ROOT / "benchmarks" / "data" / "vidur_layer_ops.csv"
METRICS = (("ttft_ms", "mean"), ("ttft_ms", "p90"), ("tpot_ms", "mean"), ("tpot_ms", "p90"),
           ("e2e_ms", "mean"), ("e2e_ms", "p90"))


def kind_of(c: Composition) -> str:
    """Which kind of step a composition is."""
    if c.prefill_context:
        return "prefill chunk over a prefix"
    if c.prefill_tokens and c.decode_seqs:
        return "mixed"
    return "prefill only" if c.prefill_tokens else "decode only"


def _row(err: dict[str, float]) -> str:
    return (f"{err['n']} | {err['median_abs']:.1%} | {err['p90_abs']:.1%} | "
            f"{err['mean_signed']:+.1%}")


def cpu_part(lines: list[str], out: dict[str, Any]) -> None:
    """Leave-one-shape-out on the CPU profiles, step by step and through the simulator."""
    data = {s: load_profile_data(str(CPU_PROFILES / f"{s}.json")) for s in SHAPES}
    lines += ["## A. CPU: fit on two decoder shapes, predict the third", "",
              "Shapes: " + "; ".join(
                  f"{s} (d {d.shape.hidden}, {d.shape.layers} layers, {d.shape.heads} heads, "
                  f"{d.shape.kv_heads} KV heads, MLP {d.shape.intermediate})"
                  for s, d in data.items()), "",
              "### Step times", "",
              "held out | model | kind of step | steps | median abs | p90 abs | mean signed",
              "---|---|---|---|---|---|---"]
    shares: dict[str, dict[str, float]] = {}
    for held in SHAPES:
        train = [data[s] for s in SHAPES if s != held]
        coeffs = fit(train, holdout=0.0, name=f"without-{held}")
        model = RooflineStepModel(data[held].shape, data[held].device, 1, coeffs)
        rows = data[held].rows
        comps = [r.comp for r in rows]
        meas = np.asarray([r.measured_s for r in rows])
        pred = np.asarray([model.step_s(c) for c in comps])
        # the shape-blind baseline: llm_linear's fit pooled over the two training shapes
        lin = _pooled_linear(train)
        pred_lin = np.asarray([(lin[0] + lin[1] * c.prefill_tokens + lin[2] * c.decode_seqs
                                + lin[3] * c.kv_tokens) / 1e3 for c in comps])
        kinds = np.asarray([kind_of(c) for c in comps])
        res: dict[str, Any] = {"coefficients": coeffs.values}
        for kind in ("all", *sorted(set(kinds))):
            mask = np.ones(len(kinds), bool) if kind == "all" else kinds == kind
            res[kind] = {"roofline": errors(pred[mask], meas[mask]),
                         "linear": errors(pred_lin[mask], meas[mask])}
            lines.append(f"{held} | roofline | {kind} | {_row(res[kind]['roofline'])}")
            lines.append(f"{held} | linear (shape-blind) | {kind} | "
                         f"{_row(res[kind]['linear'])}")
        contrib = np.asarray([[model.contributions_us(c)[t] for t in TERMS] for c in comps])
        total = contrib.sum(axis=1, keepdims=True)
        shares[held] = {t: float(v) for t, v in zip(TERMS, (contrib / total).mean(axis=0),
                                                     strict=True)}
        res["term_shares"] = shares[held]
        # the error where each term carries more than a third of the predicted time
        res["by_dominant_term"] = {}
        for j, term in enumerate(TERMS):
            mask = contrib[:, j] / total[:, 0] > 1 / 3
            if mask.sum() >= 3:
                res["by_dominant_term"][term] = errors(pred[mask], meas[mask])
        res["metrics"] = simulate_both(data[held], coeffs)
        out[held] = res
    lines += ["", "### Error where one term carries more than a third of the predicted step",
              "", "held out | term | steps | median abs | p90 abs | mean signed",
              "---|---|---|---|---|---"]
    for held in SHAPES:
        for term, err in out[held]["by_dominant_term"].items():
            lines.append(f"{held} | {term} | {_row(err)}")
    lines += ["", "### Coefficients of each fold (β; overheads in µs)", "",
              "term | " + " | ".join(f"without {s}" for s in SHAPES),
              "---|" + "---|" * len(SHAPES)]
    for term in TERMS:
        lines.append(f"{term} | " + " | ".join(f"{out[s]['coefficients'][term]:.4g}"
                                               for s in SHAPES))
    lines += ["", "### Serving metrics: simulated with the held-out shape's measured profile "
              "(reference) and with the roofline fitted without it", "",
              "held out | metric | profile (ms) | roofline (ms) | error", "---|---|---|---|---"]
    for held in SHAPES:
        for key, value in out[held]["metrics"].items():
            lines.append(f"{held} | {key} | {value['profile']:.1f} | {value['roofline']:.1f} "
                         f"| {value['error']:+.1%}")


def _pooled_linear(train: list[ProfileData]) -> np.ndarray:
    """``a + b·P + c·D + d·K`` (ms) by least squares over the training shapes' steps."""
    x = np.asarray([[1.0, r.comp.prefill_tokens, r.comp.decode_seqs, r.comp.kv_tokens]
                    for d in train for r in d.rows])
    y = np.asarray([r.measured_s * 1e3 for d in train for r in d.rows])
    coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)
    return np.asarray(coef)


def load_for(held: ProfileData) -> dict[str, Any]:
    """The scenario (less its service) both parts A and C run on a held-out shape."""
    return {
        "seed": 3, "warmup_s": 0,
        "workload": {"kind": "poisson", "rate_rps": 1.0, "n_requests": 150,
                     "prompt_tokens": {"dist": "lognormal", "mean": 200, "cv": 0.8,
                                       "max": 500},
                     "output_tokens": {"dist": "lognormal", "mean": 60, "cv": 0.8,
                                       "max": 400}},
        "policy": {"kind": "vllm", "max_num_seqs": 16, "max_num_batched_tokens": 512,
                   "num_gpu_blocks": 4096}}


def roofline_service(held: ProfileData, coeffs: Any, tmp: str) -> dict[str, Any]:
    """An llm_roofline service for the held-out shape with ``coeffs`` (files in ``tmp``)."""
    shape = held.shape
    cfg = Path(tmp) / "config.json"
    cfg.write_text(json.dumps({
        "hidden_size": shape.hidden, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "intermediate_size": shape.intermediate, "vocab_size": shape.vocab,
        "torch_dtype": "float32"}))
    return {"kind": "llm_roofline", "model": str(cfg), "device": "cpu",
            "coefficients": str(coeffs.save(Path(tmp) / "coeffs.json"))}


def simulate_both(held: ProfileData, coeffs: Any) -> dict[str, dict[str, float]]:
    """TTFT/TPOT/E2E of one load on the held-out shape: measured profile vs roofline."""
    base = load_for(held)
    with tempfile.TemporaryDirectory() as tmp:
        ref = sim.llm.run({**base, "service": {
            "kind": "llm_profile", "path": str(CPU_PROFILES / f"{held.name}.json")}})
        rl = sim.llm.run({**base, "service": roofline_service(held, coeffs, tmp)})
    res = {}
    for metric, stat in METRICS:
        a, b = ref.summary[metric][stat], rl.summary[metric][stat]
        res[f"{metric} {stat}"] = {"profile": a, "roofline": b, "error": (b - a) / a}
    return res


def gpu_part(lines: list[str], out: dict[str, Any]) -> None:
    """Leave-one-model-out on Vidur's per-layer operator times."""
    df = pd.read_csv(VIDUR, comment="#")
    cols = [TERMS.index(t) for t in ("prefill_compute", "weights", "per_layer")]
    lines += ["", "## B. GPU: leave-one-model-out on Vidur's per-layer operator times", "",
              "Measured: the sum of a decoder layer's token-wise operations (norms, "
              "projections, rotary, gated MLP, adds; no attention kernel) from Vidur's "
              "profiles, 1-4096 tokens, tp 1/2/4/8. Terms fitted: prefill_compute (the "
              "tokens' linear FLOPs), weights, per_layer.", "",
              "device | held-out model | rows | median abs | p90 abs | mean signed | "
              "≤ 64 tokens median abs | ≥ 1024 tokens median abs",
              "---|---|---|---|---|---|---|---"]
    sheets = {"h100": load_device("h100-sxm"), "a100": load_device("a100-80gb")}
    design: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for dev, group in df.groupby("device"):
        device = sheets[str(dev)]
        x = np.asarray([[terms_us(_shape(r), device, int(r.tp), Composition(
            int(r.num_tokens), 0, 0))[TERMS[c]] for c in cols]
            for r in group.itertuples()])
        y = group["layer_ms"].to_numpy() * 1e3
        design[str(dev)] = (x, y)
        models = group["model"].to_numpy()
        toks = group["num_tokens"].to_numpy()
        out[str(dev)] = {}
        for held in sorted(set(models)):
            test = models == held
            beta = nnls_relative(x[~test], y[~test])
            pred = x[test] @ beta
            err = errors(pred, y[test])
            small = errors(pred[toks[test] <= 64], y[test][toks[test] <= 64])
            large = errors(pred[toks[test] >= 1024], y[test][toks[test] >= 1024])
            out[str(dev)][held] = {"beta": beta.tolist(), "all": err, "le64": small,
                                   "ge1024": large}
            lines.append(f"{dev} | {held} | {_row(err)} | {small['median_abs']:.1%} | "
                         f"{large['median_abs']:.1%}")
    lines += ["", "Unseen GPU: fit on every model of one device, predict the other device "
              "through its datasheet peaks alone.", "",
              "fitted on | predicted | rows | median abs | p90 abs | mean signed",
              "---|---|---|---|---|---"]
    for src, dst in (("h100", "a100"), ("a100", "h100")):
        beta = nnls_relative(*design[src])
        err = errors(design[dst][0] @ beta, design[dst][1])
        out[f"{src}->{dst}"] = {"beta": beta.tolist(), "all": err}
        lines.append(f"{src} | {dst} | {_row(err)}")


def live_part(lines: list[str], out: dict[str, Any]) -> None:
    """One live run of the tiny shape against the roofline fitted on the other two."""
    from executor.llm_run import live_llm

    data = {s: load_profile_data(str(CPU_PROFILES / f"{s}.json")) for s in SHAPES}
    held = data["tiny"]
    coeffs = fit([data["small"], data["wide"]], holdout=0.0, name="without-tiny")
    with tempfile.TemporaryDirectory() as tmp:
        scn = {**load_for(held), "service": roofline_service(held, coeffs, tmp),
               "model": {"params": {
                   "hidden": held.shape.hidden, "layers": held.shape.layers,
                   "heads": held.shape.heads, "kv_heads": held.shape.kv_heads,
                   "intermediate": held.shape.intermediate, "vocab": held.shape.vocab},
                   "device": "cpu", "dtype": "fp32", "threads": 1}}
        scn["workload"] = {**scn["workload"], "n_requests": 60}
        predicted = sim.llm.run(scn).summary
        import os

        load_before = os.getloadavg()[0]
        measured = live_llm(scn).summary
        load_after = os.getloadavg()[0]
    lines += ["", "## C. Live: the tiny shape on this machine against the roofline fitted "
              "without it", "", "60 requests at 1 req/s (the same schedule); one live run "
              f"on a shared machine: indicative only. Load average (1 min) {load_before:.1f} "
              f"before and {load_after:.1f} after the run on 2 cores; the coefficients "
              "model the step's CPU time, so a live run that gets a fraction of a core is "
              "slower by about that fraction.", "",
              "metric | live (ms) | roofline sim (ms) | error", "---|---|---|---"]
    for metric, stat in METRICS:
        a, b = measured[metric][stat], predicted[metric][stat]
        out[f"{metric} {stat}"] = {"live": a, "roofline": b, "error": (b - a) / a,
                                   "load_average": [load_before, load_after]}
        lines.append(f"{metric} {stat} | {a:.1f} | {b:.1f} | {(b - a) / a:+.1%}")


def _shape(r: Any) -> ModelShape:
    return ModelShape(str(r.model), layers=1, hidden=int(r.hidden), heads=int(r.heads),
                      kv_heads=int(r.kv_heads), head_dim=int(r.hidden) // int(r.heads),
                      intermediate=int(r.intermediate), vocab=int(r.vocab))


def main() -> None:
    """Run both parts, print the table, write the results."""
    lines = ["# Roofline step model: predicting a model the fit never saw", "",
             "Relative error = (predicted − measured) / measured; mean signed > 0: the "
             "prediction is slow (pessimistic). Produced by `python benchmarks/roofline.py`.",
             ""]
    out: dict[str, Any] = {"cpu": {}, "gpu": {}}
    cpu_part(lines, out["cpu"])
    gpu_part(lines, out["gpu"])
    if "--live" in sys.argv[1:]:
        out["live"] = {}
        live_part(lines, out["live"])
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "roofline.md").write_text(text)
    (RESULTS / "roofline.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
