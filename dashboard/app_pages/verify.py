"""Verify: sim-vs-live results, errors coloured against the fidelity targets."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import figures
from dashboard.compare_runs import label, listing, measured_by, run_dirs
from dashboard.i18n import chart, frame, t
from sim.metrics.rundir import Result
from sim.scenario.schema import load_scenario

st.title(t("Verify: simulator vs the real model"))
st.caption(t("A `servelab compare` result: the same scenario simulated and run live (or, "
             "with `--endpoint`, measured against a server: vLLM, Ray Serve, KServe); the "
             "prediction is good when its error is inside the measured run-to-run spread."))

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STORED_NOTE = "'stored error' is the stored profile's prediction against the same runs."
TARGETS = {"throughput_rps": 0.02, "latency_ms.p50": 0.02, "latency_ms.p99": 0.05,
           # LLM runs (the LLM issue's targets)
           "output_tokens_per_s": 0.02, "ttft_ms.p50": 0.05, "tpot_ms.p50": 0.05,
           "ttft_ms.p99": 0.10, "tpot_ms.p99": 0.10}

folder = st.text_input(t("compare result directory"), str(EXAMPLES), key="verify-dir",
                       help=t("A `servelab compare` output directory, or a folder holding "
                              "several: each one found is listed with what it measured."))
found = listing(Path(folder))
if len(found) > 1 or (found and found[0][0] != Path(folder)):
    labels = {str(d): f"{d.name} — {label(info, t)}" for d, info in found}
    top = Path(st.selectbox(t("comparison"), list(labels), format_func=labels.__getitem__,
                            key="verify-run"))
else:
    top = Path(folder)
measured = measured_by(top)
loads = sorted(top.glob("rho-*/compare.json"))
path = top
if loads:  # a `servelab compare --sweep` directory: one comparison per load
    pick = st.selectbox(t("load"), [p.parent.name for p in loads], key="verify-load")
    path = top / pick
if not (path / "compare.json").is_file():
    st.error(f"No compare.json in {folder!r}. " + t(
        "Run `servelab compare SCENARIO --out DIR` and give DIR here (a shipped example is "
        "the default)."))
    st.stop()
try:
    data = json.loads((path / "compare.json").read_text())
except (OSError, json.JSONDecodeError) as exc:
    st.error(f"Cannot read {path / 'compare.json'}: {exc}")
    st.stop()

rows = pd.DataFrame(data["rows"])
llm = data.get("kind") == "llm"
endpoint = measured["kind"] == "endpoint"
runs_word = t("runs against the server") if endpoint else t("live runs")
st.markdown(f"**{data['scenario']}** — "
            + (t("LLM scenario") if llm else f"ρ = {data['rho']:.2f}"
               if data.get("rho") is not None else t("request-level scenario"))
            + f", {data['repeats']} {runs_word}")
st.caption(f"{t('measured by')}: {label(measured, t)}")
probes = data.get("probes") or []
if llm and data.get("probed") and probes:
    st.info(t("Predictions use the step profile rescaled by the probes around each live "
              "run") + ": "
            + "; ".join(f"{t('run')} {i + 1}: {t('prefill')} ×{p['prefill_scale']:.3f}, "
                        f"{t('decode')} ×{p['decode_scale']:.3f} "
                        f"({t('drift')} {100 * p['drift']:.1f}%)"
                        for i, p in enumerate(probes))
            + ". " + t(STORED_NOTE))
elif data.get("probed") and probes:
    st.info(t("Predictions use the profile rescaled to the device's speed, probed around "
              "each live run") + ": " + "; ".join(
                f"{t('run')} {p['repeat']}: ×{p['scale']:.3f} ({t('drift during the run')} "
                f"{100 * p['drift']:+.1f}%)" for p in probes)
            + ". " + t(STORED_NOTE))
for note in data.get("calibration_warnings", []):
    st.warning(f"{t('calibration mismatch')}: {note}")


def trace_name(run: str) -> str:
    """A run's name in the figures: a bench run names the server it measured."""
    return f"{run} ({t(measured['server'])})" if run.startswith("bench-") else run


def colour(row: pd.Series) -> list[str]:
    target = TARGETS.get(row[t("metric")])
    within = bool(row[t("within_spread")])
    ok = within if target is None else abs(row[t("prediction error %")]) / 100 <= target or within
    style = "background-color: #cfe8d9" if ok else "background-color: #f6d5c8"
    return [style if col == t("prediction error %") else "" for col in row.index]


columns = ["metric", "label", "sim", "live_median", "prediction error %", "live_min", "live_max",
           "within_spread"]
shown = rows.assign(**{"prediction error %": 100 * rows["rel_error"]})
if "rel_error_stored" in rows:
    shown = shown.assign(**{"stored error %": 100 * rows["rel_error_stored"]})
    columns.append("stored error %")
shown = shown[columns]
shown = frame(shown)  # headers and the metrics' labels in the chosen language
st.dataframe(shown.style.apply(colour, axis=1).format(precision=3), hide_index=True)
st.caption(t("Green: within the target (throughput and P50 ±2%, P99 ±5%; LLM: TTFT/TPOT P50 "
             "±5%, P99 ±10%) or inside the live spread; orange: outside both."))

if llm:
    import plotly.graph_objects as go

    from calibration.report import PALETTE

    fig = go.Figure()
    dirs = [path / "sim", *sorted(path.glob("sim-*")), *run_dirs(path)]
    for i, run_dir in enumerate(d for d in dirs if (d / "requests.parquet").is_file()):
        req = pd.read_parquet(run_dir / "requests.parquet")
        ok = req[req["status"] == "ok"]
        ttft = ((ok["first_token_s"] - ok["arrival_s"]) * 1e3).sort_values().to_numpy()
        if ttft.size:
            fig.add_trace(go.Scatter(x=ttft, y=[(k + 1) / ttft.size for k in range(ttft.size)],
                                     name=trace_name(run_dir.name), mode="lines",
                                     line={"color": PALETTE[i % len(PALETTE)]}))
    fig.update_layout(title="TTFT CDF, sim vs live", xaxis_title="TTFT (ms)",
                      xaxis_type="log", yaxis_title="fraction of requests",
                      template="plotly", height=400)
    chart(fig)
    if (top / "fidelity.csv").is_file():
        chart(figures.fidelity_curve(pd.read_csv(top / "fidelity.csv")))
    st.stop()


def load_run(folder: Path) -> Result:
    return Result(load_scenario(folder / "scenario.yaml"),
                  json.loads((folder / "summary.json").read_text()),
                  pd.read_parquet(folder / "requests.parquet"),
                  pd.read_parquet(folder / "batches.parquet"),
                  pd.read_parquet(folder / "queue.parquet"),
                  json.loads((folder / "meta.json").read_text()))


runs = {"sim": load_run(path / "sim")}
if (path / "sim-1").is_dir():
    try:
        runs["sim (probed, run 1)"] = load_run(path / "sim-1")
    except (OSError, ValueError) as exc:  # e.g. the probed profile moved away
        st.caption(f"probed simulation not shown: {exc}")
for live_dir in run_dirs(path):
    try:
        runs[trace_name(live_dir.name)] = load_run(live_dir)
    except (OSError, ValueError) as exc:
        st.caption(f"{live_dir.name} not shown: {exc}")
chart(figures.latency_cdf(runs))
fidelity = top / "fidelity.csv"
if fidelity.is_file():
    chart(figures.fidelity_curve(pd.read_csv(fidelity)))
