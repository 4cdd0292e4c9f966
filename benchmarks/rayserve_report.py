"""The Markdown table of ``benchmarks/fidelity_rayserve.py``'s results (one job: layout)."""

from __future__ import annotations

from typing import Any

TARGETS = {"latency_p50_ms": 0.05, "latency_p99_ms": 0.10, "throughput_rps": 0.02,
           "mean_batch_size": 0.05}
OTHER = (("first_overhead", "timer first + request overhead"),
         ("arrival_overhead", "timer arrival + request overhead"),
         ("arrival_late", "timer arrival, late timer + request overhead"),
         ("arrival_late_handover", "... + hand-over per batch (last stop's main)"),
         ("measured_path", "last stop's main, measured path instead of calibrated overhead"),
         ("replay_ray_busy", "last stop's main, Ray's logged busy times (replay)"),
         ("replay_contention", "Ray's logged busy times less the front end's share + "
                               "contention (replay)"),
         ("contention", "contention, window + idle timer lateness"),
         ("contention_batching", "contention, window + batching lateness (main)"),
         ("arrival_proxy", "timer arrival + proxy FIFO stage"),
         ("overhead_as_busy", "overhead as busy time"))


def _setting_head(st: dict[str, Any]) -> list[str]:
    over = st["request_overhead"]
    lines = [f"## max_batch_size {st['max_batch_size']}, batch_wait_timeout "
             f"{st['window_ms']:g} ms", "",
             f"Calibrated request overhead outside the replica: {over['request_ms']:.1f} ms "
             f"({over.get('method', '')}, at size {over.get('from_size')}).", ""]
    stage = st.get("proxy_stage")
    if stage is not None:
        o, fit = stage["overheads"], stage["fit"]
        lines += [f"Proxy stage (fitted on {stage.get('fitted_on', 'the other setting')}'s "
                  f"runs, {fit['n']} requests): inbound {o['proxy_in_ms']:.2f} ms per request "
                  f"(client send -> batcher; residual sd {fit['inbound']['resid_sd_ms']:.2f} "
                  f"ms, {fit['inbound']['resid_sd_no_stage_ms']:.2f} ms without the stage), "
                  f"outbound {o['proxy_out_ms']:.2f} ms (replica answer -> client; residual "
                  f"sd {fit['outbound']['resid_sd_ms']:.2f} ms, "
                  f"{fit['outbound']['resid_sd_no_stage_ms']:.2f} without), pure delay "
                  f"{o['request_ms']:.2f} ms. Median path outside the batcher "
                  f"{fit['outside_ms_p50']:.1f} ms: send -> user code "
                  f"{fit['in_ms_p50']:.1f} ms, body read back from the proxy "
                  f"{fit['body_ms_p50']:.1f} ms, answer -> client {fit['out_ms_p50']:.1f} ms.",
                  ""]
    late, hand = st.get("timer_lateness_ms"), st.get("handover_ms")
    if late is not None and hand is not None:
        lines += [f"Measured on the other setting's runs: Ray's batch timer fires "
                  f"{late['p50']:.2f} ms late (median; p10 {late['p10']:.2f}, p90 "
                  f"{late['p90']:.2f}; {late['n']} batches that started on an idle replica), "
                  f"and between two batches when the next was already waiting the replica "
                  f"spends {hand['mean']:.2f} ms (mean; median {hand['p50']:.2f}, p90 "
                  f"{hand['p90']:.2f}; {hand['n']} hand-overs) outside its batch log.", ""]
    cont, used = st.get("contention_ms"), st.get("contention_overheads")
    bl = st.get("batching_lateness_ms")
    if cont is not None and used is not None and bl is not None:
        lines += [f"Measured on the other setting's runs ({cont['n']} batches of one): each "
                  f"request sent while a batch runs lengthens it by "
                  f"{cont['arrival_busy_ms']:.2f} ms (se {cont['arrival_se_ms']:.2f}), each "
                  f"answer of the batch before (when it followed at once) by "
                  f"{cont['answer_busy_ms']:.2f} ms (se {cont['answer_se_ms']:.2f}); the rule "
                  f"forms the most of Ray's batches ({bl['same_size_in_order']:.0f} of "
                  f"{bl['ray_batches']:.0f} size for size, in order) with the window + "
                  f"{bl['late_ms']:.2f} ms. The main prediction's path outside the replica: "
                  f"{used['request_ms']:.2f} ms (the calibrated outside time less that "
                  "lateness and the contention it holds).", ""]
    if st.get("rule_check"):
        lines += ["Ray's batches against servelab's `timer: arrival` fed the times requests "
                  "reached the batcher (the replica's own stamps):", "",
                  "| rho | Ray batches | rule batches | same size, in order | Ray mean | "
                  "rule mean |", "|---|---|---|---|---|---|"]
        for c in st["rule_check"]:
            lines.append(f"| {c['rho']} | {c['ray_batches']} | {c['rule_batches']} | "
                         f"{c['same_size_in_order']} | {c['ray_mean']:.3f} | "
                         f"{c['rule_mean']:.3f} |")
        lines.append("")
    lines += ["| batch size | calibrated busy ms | outside ms | pairs queued | Ray's batch log "
              "busy ms | burst split? |", "|---|---|---|---|---|---|"]
    for b, v in st["profile_busy_ms"].items():
        ray = st["ray_busy_ms"].get(b)
        pair = over.get("sizes", {}).get(b, {})
        split = st["calibration_bursts"].get(b, {}).get("probably_split")
        lines.append(f"| {b} | {v:.1f} | {pair.get('outside_ms', float('nan')):.1f} | "
                     f"{pair.get('queued_pairs', 0)}/{over.get('pairs', 0)} | "
                     f"{'' if ray is None else f'{ray:.1f}'} | {'yes' if split else ''} |")
    return lines


def markdown(out: dict[str, Any]) -> list[str]:
    """The results file's lines."""
    lines = ["# Fidelity against Ray Serve (MiniLM, @serve.batch, 1 replica)", "",
             f"{out['runs']} runs of {out['duration_s']:g} s per load, under `fgrun` (CPU "
             "priority over the other jobs on this 2-core machine). error = (predicted - "
             "measured mean) / measured mean; per-run errors: the range of (predicted - run) / "
             "run; spread = (max - min) / mean over the runs. Targets at rho <= 0.8: p50 5%, "
             "p99 10%, throughput 2%, mean batch 5%. rho: arrival rate x the replica's "
             "calibrated busy time at batch 1.", "", f"Command: `{out['command']}`", ""]
    for note in out.get("notes", []):
        lines += [note, ""]
    main = out.get("main_model", "timer first + request overhead")
    for st in out["settings"]:
        lines += [*_setting_head(st), "",
                  "| rho | rate req/s | metric | measured | spread | predicted | "
                  "predicted runs' sd | error | per-run errors | target | "
                  + " | ".join(f"error, {t}" for _, t in OTHER)
                  + " |", "|---" * (10 + len(OTHER)) + "|"]
        for r in st["rows"]:
            target = TARGETS.get(r["metric"])
            verdict = "" if target is None or r["rho"] > 0.8 else (
                "met" if abs(r["error"]) <= target else "missed")
            others = " | ".join(f"{r.get(f'error_{k}', float('nan')):+.1%}" for k, _ in OTHER)
            lines.append(f"| {r['rho']} | {r['rate_rps']} | {r['metric']} | "
                         f"{r['live_mean']:.2f} | {r['live_spread']:.0%} | {r['predicted']:.2f} "
                         f"| {r.get('pred_spread', float('nan')):.0%} | {r['error']:+.1%} "
                         f"| {r['error_min']:+.0%}..{r['error_max']:+.0%} "
                         f"| {verdict} | {others} |")
        lines.append("")
    lines += [f"Columns: *predicted* is servelab's main prediction ({main}), the mean over "
              f"{out.get('pred_seeds', 1)} simulated runs as long as a measured one, and "
              "*predicted runs' sd* the sd of those runs (relative); the *error, ...* "
              "columns are the other models on the same profile: `timer: first` with the "
              "calibrated request overhead as a pure delay (last round's main prediction), "
              "`timer: arrival` with it, and the overhead added to every batch's busy time. "
              "`python benchmarks/fidelity_rayserve.py --repredict [--tag TAG]` recomputes "
              "the predictions from the saved profiles and raw logs.", "",
              "Client against the local stub (instant answers):", "",
              "| offered req/s | throughput | p50 ms | p99 ms | send lag p99 ms | CPU share |",
              "|---|---|---|---|---|---|"]
    for c in out["client_overhead"]:
        lines.append(f"| {c['offered_rps']} | {c['throughput_rps']:.0f} | "
                     f"{c['latency_p50_ms']:.2f} | {c['latency_p99_ms']:.2f} | "
                     f"{c['send_lag_p99_ms']:.2f} | {c['client_cpu_share']:.0%} |")
    return lines
