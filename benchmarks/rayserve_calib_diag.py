"""What ``calibrate --endpoint``'s bursts do inside a real Ray Serve: the calibration of
``benchmarks/fidelity_rayserve.py`` (MiniLM behind ``@serve.batch``) run again with every
burst's client times kept beside the replica's own stamps and Ray's batch log, and a
contention probe: one request, then ``k`` more sent while its batch runs, to see how much
each request the replica takes in while a batch runs lengthens that batch.

    fgrun python benchmarks/rayserve_calib_diag.py [--settings 16/10,8/5] [--reps 8]
    python benchmarks/rayserve_calib_diag.py --report

Writes benchmarks/results/rayserve_calib_diag-raw.json (one line per burst plan, unix s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.fidelity_rayserve import _call, start_minilm  # noqa: E402
from executor.endpoint import request_calibrate  # noqa: E402
from executor.endpoint.client import OpenLoop  # noqa: E402
from executor.endpoint.probes import Stopper  # noqa: E402
from sim.scenario.payload import PayloadCfg  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CLIENTS: list[OpenLoop] = []
BURSTS = request_calibrate._bursts  # the original, wrapped per use


class _Kept(OpenLoop):
    """The calibration's client, kept so its clock can be turned into unix time."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        CLIENTS.append(self)


def _kept_bursts(keep: list[dict[str, Any]]) -> Any:
    inner = BURSTS

    def bursts(url: str, api: str, payload: PayloadCfg, plan: Any, seed: int,
               timeout_s: float, stopper: Stopper) -> list[list[Any]]:
        groups = inner(url, api, payload, plan, seed, timeout_s, stopper)
        offset = CLIENTS[-1].t0 + (time.time() - time.perf_counter())
        keep.append({"plan": [[float(t), int(n)] for t, n in plan], "bursts": [
            [[o.index, o.sent_s + offset, o.chunk_s[-1] + offset] for o in g]
            for g in groups]})
        return groups
    return bursts


def contention_probe(url: str, window_ms: float, reps: int, seed: int) -> dict[str, Any]:
    """One request on an idle replica, then ``k`` (0..3) more sent ``window + 8 ms`` later
    (its batch is running by then); each k ``reps`` times, shuffled, 0.4 s apart.
    """
    ks = [k for k in range(4) for _ in range(reps)]
    np.random.default_rng(seed).shuffle(ks)
    plan: list[tuple[float, int]] = []
    t = 0.05
    for k in ks:
        plan.append((t, 1))
        if k:
            plan.append((t + (window_ms + 8.0) / 1e3, k))
        t += 0.4
    keep: list[dict[str, Any]] = []
    groups = _kept_bursts(keep)(url, "kserve-v2", PayloadCfg(model="minilm"), plan, seed, 30.0,
                                Stopper())
    del groups
    return {"ks": ks, **keep[0]}


def _stamps(line: dict[str, Any], sent: float, done: float) -> tuple[Any, Any]:
    """The replica's stamps of the request the client sent at ``sent`` and had answered at
    ``done`` (the first one entered after the send), and the batch that answered it.
    """
    mine = [r for r in line["requests"] if sent <= r[1] <= done and r[3] <= done]
    if not mine:
        return None, None
    req = min(mine, key=lambda r: r[1] - sent)
    runs = [b for b in line["batches"] if b[1] >= req[2] - 1e-4 and b[2] <= req[3] + 1e-4]
    return req, (min(runs, key=lambda b: b[1]) if runs else None)


def report(path: Path) -> None:
    """Each lone-request pair of the overhead split, its parts from the replica's stamps
    (ms): send -> user code, body read, wait in the batcher, batch, answer -> client.
    """
    for raw in path.read_text().splitlines():
        line = json.loads(raw)
        window_ms = float(line["setting"].split("/")[1])
        pairs = line["calibration"][-1]  # the overhead split's bursts, in pairs
        print(f"== {line['setting']} (window {window_ms:g} ms): calibrated outside "
              f"{line['overhead']['request_ms']:.1f} ms")
        for k in range(0, len(pairs["plan"]), 2):
            if pairs["plan"][k][1] != 1:
                continue
            (_, a_sent, a_done), (_, b_sent, b_done) = pairs["bursts"][k][0], \
                pairs["bursts"][k + 1][0]
            (ra, ba), (rb, bb) = _stamps(line, a_sent, a_done), _stamps(line, b_sent, b_done)
            if ba is None or bb is None:
                continue
            outside = (a_done - a_sent) - (b_done - a_done) - window_ms / 1e3
            print(f"  B sent +{(b_sent - a_sent) * 1e3:5.1f}: A in {(ra[1] - a_sent) * 1e3:4.1f} "
                  f"body {(ra[2] - ra[1]) * 1e3:4.1f} batch {(ba[2] - ba[1]) * 1e3:5.1f} "
                  f"out {(a_done - ra[3]) * 1e3:4.1f} | B waited "
                  f"{(bb[1] - rb[2]) * 1e3:5.1f} batch {(bb[2] - bb[1]) * 1e3:5.1f}, "
                  f"idle before it {(bb[1] - ba[2]) * 1e3:4.1f} | gap "
                  f"{(b_done - a_done) * 1e3:5.1f} -> outside {outside * 1e3:5.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default="16/10,8/5")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--report", action="store_true",
                    help="print the pairs of the committed raw file (no server)")
    args = ap.parse_args()
    if args.report:
        report(RESULTS / "rayserve_calib_diag-raw.json")
        return
    setattr(request_calibrate, "OpenLoop", _Kept)  # noqa: B010 - a test double
    app = start_minilm()
    lines = []
    try:
        for setting in args.settings.split(","):
            max_batch, window_ms = int(setting.split("/")[0]), float(setting.split("/")[1])
            _call(f"{app.url}/servelab/config", {"max_batch_size": max_batch,
                                                 "batch_wait_timeout_s": window_ms / 1e3})
            seen = len(_call(f"{app.url}/servelab/batches")["batches"])
            seen_req = len(_call(f"{app.url}/servelab/requests")["requests"])
            keep: list[dict[str, Any]] = []
            setattr(request_calibrate, "_bursts", _kept_bursts(keep))  # noqa: B010
            sizes = [b for b in (1, 2, 4, 8, 16) if b <= max_batch]
            profile = request_calibrate.calibrate_endpoint(
                app.url, api="kserve-v2", sizes=sizes, reps=args.reps, model="minilm",
                window_ms=window_ms, server_max_batch=max_batch)
            setattr(request_calibrate, "_bursts", BURSTS)  # noqa: B010
            probe = contention_probe(f"{app.url}/v2/models/minilm/infer", window_ms,
                                     args.reps, 5)
            lines.append({"setting": setting, "calibration": keep, "probe": probe,
                          "overhead": profile.meta["endpoint"]["request_overhead"],
                          "batches": _call(f"{app.url}/servelab/batches")["batches"][seen:],
                          "requests": _call(f"{app.url}/servelab/requests")["requests"][
                              seen_req:]})
            print(f"{setting}: {json.dumps(lines[-1]['overhead'])[:400]}", flush=True)
    finally:
        app.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rayserve_calib_diag-raw.json").write_text(
        "\n".join(json.dumps(x, separators=(",", ":")) for x in lines) + "\n")


if __name__ == "__main__":
    main()
