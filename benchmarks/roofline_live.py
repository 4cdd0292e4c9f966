"""Roofline predictions checked live on this machine (run it under ``fgrun``).

D1. The held-out ``tiny`` CPU shape: the roofline fitted on the other two shapes
    (``small``, ``wide``; benchmarks/results/roofline_cpu) predicts a Poisson load on it, and
    ``servelab compare`` runs that load live on servelab's own engine with the tiny shape's
    decoder (one thread, fp32), ``--repeats`` times.
D2. The real vLLM CPU server serving the tiny Llama the test fixture builds
    (``executor/endpoint/tiny_model.py``): ``servelab compare --endpoint`` predicts it with
    ``llm_roofline`` from the model's own config.json, the ``cpu`` sheet and the shipped
    ``cpu-decoder`` coefficients (fitted on servelab's decoder, never on vLLM), and benches
    the server ``--repeats`` times on the same schedule.

Relative error = (predicted − measured) / measured: > 0 means the prediction is slow
(pessimistic). The server is started inside this script so that under ``fgrun`` it shares the
CPU priority.

D3. ``--vllm-bench DIR`` (under fgrun) benches the same server at ``--rates`` and keeps the
    run directories; ``--fit-vllm DIR`` then fits the coefficients to them with
    ``servelab fit --bench`` (a held-out directory reported) and adds section D3.

Usage: fgrun python benchmarks/roofline_live.py [--repeats 2] [--requests 40]
Appends (or replaces) section D of benchmarks/results/roofline.md; writes roofline_live.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.scenario.roofline.fit import fit, load_profile_data  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CPU_PROFILES = RESULTS / "roofline_cpu"
METRICS = ("ttft_ms.mean", "ttft_ms.p50", "ttft_ms.p99", "tpot_ms.mean", "tpot_ms.p50",
           "e2e_ms.mean", "e2e_ms.p50", "e2e_ms.p99", "throughput_rps")
POLICY = {"kind": "vllm", "max_num_seqs": 16, "max_num_batched_tokens": 512,
          "block_size": 16, "num_gpu_blocks": 4096}
VLLM_ARGS = ("--max-num-seqs", "16", "--max-num-batched-tokens", "512")
SECTION = "## D. Live checks under fgrun"


def scenario(service: dict[str, Any], n_requests: int, name: str) -> dict[str, Any]:
    """The load both checks run: Poisson 1 req/s, lognormal prompts and outputs."""
    return {"name": name, "seed": 3, "warmup_s": 0, "service": service,
            "workload": {"kind": "poisson", "rate_rps": 1.0, "n_requests": n_requests,
                         "prompt_tokens": {"dist": "lognormal", "mean": 200, "cv": 0.8,
                                           "max": 500},
                         "output_tokens": {"dist": "lognormal", "mean": 60, "cv": 0.8,
                                           "max": 300}},
            "policy": POLICY}


def compare_cli(scn: dict[str, Any], out: Path, repeats: int, *extra: str) -> dict[str, Any]:
    """``servelab compare`` in a subprocess (this checkout first); its compare.json."""
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(scn))
    cmd = [sys.executable, "-m", "servelab.cli", "compare", str(path), "-o", str(out),
           "--repeats", str(repeats), "--force", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          check=False)
    print(done.stdout[-3000:], done.stderr[-2000:], sep="\n", flush=True)
    if done.returncode:
        raise SystemExit(f"compare failed ({done.returncode}): {' '.join(cmd)}")
    data: dict[str, Any] = json.loads((out / "compare.json").read_text())
    data["command"] = "servelab compare " + " ".join(cmd[4:])
    return data


def table(data: dict[str, Any]) -> list[str]:
    """Rows: metric, prediction, live median and min–max, error, bias."""
    lines = ["metric | roofline sim | live median | live min–max | error | bias",
             "---|---|---|---|---|---"]
    rows = {r["metric"]: r for r in data["rows"]}
    for key in METRICS:
        r = rows.get(key)
        if r is None:
            continue
        err = r["rel_error"]
        bias = "slow (pessimistic)" if err > 0 else "fast (optimistic)"
        lines.append(f"{key} | {r['sim']:.4g} | {r['live_median']:.4g} | "
                     f"{r['live_min']:.4g}–{r['live_max']:.4g} | {err:+.1%} | {bias}")
    return lines


def tiny_config(tmp: Path) -> tuple[Path, Path]:
    """The held-out tiny shape's config.json and the coefficients fitted without it."""
    data = {s: load_profile_data(str(CPU_PROFILES / f"{s}.json"))
            for s in ("tiny", "small", "wide")}
    shape = data["tiny"].shape
    cfg = tmp / "tiny" / "config.json"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps({
        "hidden_size": shape.hidden, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "intermediate_size": shape.intermediate, "vocab_size": shape.vocab,
        "torch_dtype": "float32"}))
    coeffs = fit([data["small"], data["wide"]], holdout=0.0, name="without-tiny")
    return cfg, coeffs.save(tmp / "coeffs-without-tiny.json")


def vllm_bench(out: Path, rates: list[float], n_requests: int, repeats: int = 1) -> None:
    """Bench the vLLM CPU server (tiny Llama) at each rate, ``repeats`` times on one server
    start; keep the run directories (``out/repeat-K/rate-R`` when ``repeats > 1``, each
    repeat folder with the model's config.json).
    """
    from executor.endpoint.bench import bench
    from executor.endpoint.servers import VllmServer, ensure_vllm

    env = ensure_vllm(progress=print)
    folders = [out / f"repeat-{k + 1}" for k in range(repeats)] if repeats > 1 else [out]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text((env.model_dir / "config.json").read_text())
    service = {"kind": "llm_roofline", "model": str(env.model_dir / "config.json"),
               "device": "cpu", "coefficients": "builtin"}
    server = VllmServer(env, args=VLLM_ARGS).start()
    try:
        for k, folder in enumerate(folders):
            for rate in rates:
                scn = scenario(service, n_requests, f"vllm-tiny-llama-{rate:g}rps")
                scn["workload"]["rate_rps"] = rate
                result = bench(scn, server.url)
                result.write(folder / f"rate-{rate:g}")
                print(f"repeat {k + 1} rate {rate:g}: "
                      f"{result.summary['e2e_ms']['p50']:.1f} ms E2E p50", flush=True)
    finally:
        server.stop()


def _fit_cli(folder: Path) -> tuple[list[str], dict[str, Any]]:
    """``servelab fit --bench`` on one set of bench directories (rate-R folders and the
    model's config.json); the command and the fit's report.
    """
    dirs = sorted((p for p in folder.iterdir() if (p / "meta.json").exists()),
                  key=lambda p: float(p.name.removeprefix("rate-")))
    out = folder / "fitted-coefficients.json"
    cmd = [sys.executable, "-m", "servelab.cli", "fit",
           *(a for d in dirs for a in ("--bench", str(d.relative_to(ROOT)))),
           "--model", str((folder / "config.json").relative_to(ROOT)), "--device", "cpu",
           "--holdout", "0.34", "--out", str(out.relative_to(ROOT))]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          check=False)
    print(done.stdout, done.stderr)
    if done.returncode:
        raise SystemExit(f"fit failed ({done.returncode})")
    return cmd, json.loads(out.read_text())


def _without_request_term(folder: Path) -> dict[str, Any]:
    """The same fit with the three step-term multipliers only (no request overhead): what
    ``fit --bench`` did before it had the fourth parameter.
    """
    from sim.experiments.fit_bench import fit_bench, load_bench_run
    from sim.scenario.roofline.hardware import load_device
    from sim.scenario.roofline.model import load_coefficients
    from sim.scenario.roofline.service import load_shape

    config = str(folder / "config.json")
    service = {"kind": "llm_roofline", "model": config, "device": "cpu"}
    dirs = sorted((p for p in folder.iterdir() if (p / "meta.json").exists()),
                  key=lambda p: float(p.name.removeprefix("rate-")))
    runs = [load_bench_run(d, service) for d in dirs]
    got = fit_bench(runs, load_shape(config), load_device("cpu"), 1,
                    load_coefficients("builtin", "cpu"), holdout=0.34, seed=0,
                    max_evals=120, fit_request=False)
    return dict(got.meta["fit"])


def fit_vllm(folder: Path) -> None:
    """``servelab fit --bench`` on the vLLM bench directories (each ``repeat-K`` folder, or
    the folder itself); section D3 of the results and ``d3`` of roofline_live.json.
    """
    from sim.experiments.fit_bench import TARGETS, mean_abs

    folder = folder.resolve()
    repeats = sorted(p for p in folder.iterdir() if p.name.startswith("repeat-")) or [folder]
    keys = [f"{m}.p{q}" for m, q in TARGETS]
    rel = folder.relative_to(ROOT)
    lines = ["### D3. Fitting the vLLM server from its bench runs (simulation in the loop)",
             "", f"The server benched at 1, 4 and 8 req/s, {len(repeats)} times (40 requests "
             "each, the load of D2 at those rates, fresh prompts every run; `fgrun python "
             f"benchmarks/roofline_live.py --vllm-bench {rel} --rates 1,4,8 --requests 40 "
             f"--bench-repeats {len(repeats)}`, with CPU priority, one server start; run "
             f"directories kept in `{rel}`), then `servelab fit --bench` on each repeat from "
             "`cpu-decoder` (seed 0; held out: rate-8; `python benchmarks/roofline_live.py "
             f"--fit-vllm {rel}`, simulation only). Rows: the start set, the fit without the "
             "request-overhead parameter (the three step-term multipliers, as before), and "
             "the fit with it. Error = (sim − measured) / measured, > 0 slow.", ""]
    record: dict[str, Any] = {}
    held: dict[str, dict[str, list[float]]] = {"without": {k: [] for k in keys},
                                               "with": {k: [] for k in keys}}
    for rep in repeats:
        cmd, saved = _fit_cli(rep)
        fit, three = saved["fit"], _without_request_term(rep)
        record[rep.name] = {"command": " ".join(cmd[3:]), "fit": fit,
                            "fit_without_request_term": three,
                            "request_overheads": saved.get("request_overheads", {})}
        lines += [f"#### {rep.name}", "", f"`servelab {' '.join(cmd[3:])}`", "",
                  "run | split | set | " + " | ".join(keys),
                  "---|---|---|" + "---|" * len(keys)]
        for label, report in (("start", fit["runs"]["start"]),
                              ("3 multipliers", three["runs"]["fitted"]),
                              ("+ request overhead", fit["runs"]["fitted"])):
            for run, row in report.items():
                lines.append(f"{run} | {row['split']} | {label} | " + " | ".join(
                    f"{row['errors'][k]:+.1%}" for k in keys))
                if row["split"] == "held_out" and label != "start":
                    which = "with" if label.startswith("+") else "without"
                    for k in keys:
                        held[which][k].append(row["errors"][k])
        lines += ["", "Multipliers of cpu-decoder: " + ", ".join(
            f"{g} ×{m:.3g}" for g, m in fit["group_multipliers"].items())
            + f"; request overhead {fit['request_ms']['start']:.3g} → "
            f"{fit['request_ms']['fitted']:.3g} ms. Mean |error| start → 3 multipliers → "
            "+ request overhead: " + "; ".join(
                f"{split} {mean_abs(fit['runs']['start'], split):.1%} → "
                f"{mean_abs(three['runs']['fitted'], split):.1%} → "
                f"{mean_abs(fit['runs']['fitted'], split):.1%}"
                for split in ("train", "held_out")) + ".", ""]
    lines += ["#### Held-out run (rate-8) over the repeats", "",
              "fit | " + " | ".join(keys), "---|" + "---|" * len(keys)]
    for which, label in (("without", "3 multipliers"), ("with", "+ request overhead")):
        cells = []
        for k in keys:
            v = held[which][k]
            cells.append(f"{sum(v) / len(v):+.1%} ({min(v):+.1%}…{max(v):+.1%})")
        lines.append(f"{label} | " + " | ".join(cells))
    lines += ["", "Mean over the repeats (min…max in brackets: the spread between repeats).",
              ""]
    record["held_out_by_repeat"] = held
    md = RESULTS / "roofline.md"
    text = md.read_text()
    head = text.split("### D3.")[0].rstrip() + "\n\n"
    md.write_text(head + "\n".join(lines))
    live = RESULTS / "roofline_live.json"
    data = json.loads(live.read_text()) if live.exists() else {}
    data["d3"] = record
    live.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Run D1 and D2, print and write the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--vllm-bench", type=Path, default=None, help=(
        "only bench the vLLM server at each of --rates and keep the run directories here "
        "(the input of servelab fit --bench)"))
    parser.add_argument("--rates", default="1,4,8")
    parser.add_argument("--bench-repeats", type=int, default=1, help=(
        "with --vllm-bench: bench every rate this many times (repeat-K folders)"))
    parser.add_argument("--fit-vllm", type=Path, default=None, help=(
        "fit the coefficients to the bench directories kept by --vllm-bench (servelab fit "
        "--bench; simulation only, no fgrun needed) and add section D3"))
    args = parser.parse_args()
    if args.fit_vllm is not None:
        fit_vllm(args.fit_vllm)
        return
    if args.vllm_bench is not None:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        vllm_bench(args.vllm_bench, [float(r) for r in args.rates.split(",")],
                   args.requests, args.bench_repeats)
        return
    # SIGTERM (a timeout) unwinds like Ctrl-C, so the vLLM server is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out: dict[str, Any] = {"load_average_start": os.getloadavg()}
    lines = [SECTION, "", f"Produced by `fgrun python benchmarks/roofline_live.py --repeats "
             f"{args.repeats} --requests {args.requests}` (the whole script, the vLLM server "
             "included, ran with CPU priority over the other jobs on this shared 2-core "
             "machine). Load: Poisson 1 req/s, "
             f"{args.requests} requests, prompts lognormal mean 200 (cv 0.8, ≤ 500), outputs "
             "mean 60 (≤ 300); vLLM-style scheduler, 16 sequences, 512 tokens per step. "
             "Error = (sim − live median) / live median; live min–max is the spread of the "
             "repeats.", ""]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cfg, coeffs = tiny_config(tmp)
        t0 = time.monotonic()
        d1 = compare_cli(scenario({"kind": "llm_roofline", "model": str(cfg), "device": "cpu",
                                   "coefficients": str(coeffs)}, args.requests,
                                  "roofline-live-tiny"), tmp / "d1", args.repeats)
        out["d1"] = {**d1, "wall_s": time.monotonic() - t0,
                     "load_average_after": os.getloadavg()}
        lines += ["### D1. Held-out tiny shape (fit on small and wide), servelab's engine",
                  "", f"`{d1['command']}`", "", *table(d1), ""]
        if not args.skip_vllm:
            from executor.endpoint.servers import VllmServer, ensure_vllm

            env = ensure_vllm(progress=print)
            model_cfg = env.model_dir / "config.json"
            server = VllmServer(env, args=VLLM_ARGS).start()
            try:
                t0 = time.monotonic()
                d2 = compare_cli(scenario({"kind": "llm_roofline", "model": str(model_cfg),
                                           "device": "cpu", "coefficients": "builtin"},
                                          args.requests, "roofline-vllm-tiny-llama"),
                                 tmp / "d2", args.repeats, "--endpoint", server.url)
            finally:
                server.stop()
            out["d2"] = {**d2, "wall_s": time.monotonic() - t0,
                         "server_start_s": server.started_s,
                         "server_args": list(VLLM_ARGS)}
            lines += ["### D2. Real vLLM CPU server, tiny Llama (the test fixture's), "
                      "predicted from its config.json + cpu sheet + cpu-decoder", "",
                      f"`{d2['command']}` (server flags: {' '.join(VLLM_ARGS)}, fp32, "
                      "1 GiB KV)", "", *table(d2), ""]
    out["load_average_end"] = os.getloadavg()
    text = "\n".join(lines) + "\n"
    print(text)
    md = RESULTS / "roofline.md"
    old = md.read_text() if md.exists() else ""
    keep = old.split(SECTION)[0].rstrip() + "\n\n" if SECTION in old else old + "\n"
    md.write_text(keep + text)
    (RESULTS / "roofline_live.json").write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
