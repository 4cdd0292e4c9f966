"""``calibrate --endpoint`` and ``compare --endpoint`` against the stub server in ``timed``
mode, whose step times are known: the first token 60 ms after a request arrives, then one
every 10 ms, whatever the prompt length or the number of streams.

Tolerances follow from the stub's timing and from what this run measured: the stub sleeps
until absolute deadlines (``t0 + 60 ms + i × 10 ms``), so its lateness does not accumulate
and cancels in the gaps; the fits' own residuals give their standard errors; and what the
client adds to the TTFT (HTTP, JSON, its own loop; more for longer prompts and on a loaded
machine) is probed in the test against the same stub with no wait.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from calibration.step_profile import StepProfile, load_step_profile
from executor.endpoint import probes
from executor.endpoint.bench import bench
from executor.endpoint.calibrate import calibrate_endpoint
from executor.endpoint.calibrate_budget import SHED_ORDER
from executor.endpoint.calibrate_plan import OUTPUT_TOKENS, PREFILL_TOKENS, decode_order
from executor.endpoint.compare_endpoint import compare_endpoint
from tests.executor.endpoint.conftest import REPO, env, signal_mid_run, write_scenario

TTFT_MS, ITL_MS = 60.0, 10.0
MODEL = f"timed:{TTFT_MS:g}:{ITL_MS:g}"
# the chance that the decode fit's three checks fail one run of a calibration that read the
# stub right (Bonferroni over the three coefficients, Student's t at the fit's degrees of
# freedom): a false failure in 1 of 1,000 runs of this test (1 in 100 was too often for a
# suite with several such checks run on every change: the kv-token term's bound failed once,
# 4.8e-6 against 4.6e-6 ms, in about a dozen runs)
FALSE_ALARM = 0.001


PATH_PROMPTS = PREFILL_TOKENS  # the calibration's prefill lengths (plan_grid's, no budget)


def client_path_ms(stub_url: str, seed: int) -> dict[int, np.ndarray]:
    """What the client path adds to the stub's TTFT at each prompt length: the same
    one-token requests the calibration sends, timed against the stub's known 60 ms."""
    target = probes.Target(f"{stub_url}/v1/completions", MODEL, np.random.default_rng(seed))
    return {p: np.array(probes.prefill_ttft_s(target, p, 5)) * 1e3 - TTFT_MS
            for p in PATH_PROMPTS}


@pytest.fixture(scope="module")
def client_ms_per_event(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> float:
    """The client's own cost per streamed token event, measured on this machine now: the
    ``instant`` model writes all 64 events of an answer at once, so the time between the
    first token's arrival and the last's is the client parsing the 63 others (the median
    over the requests: what a typical step's events cost it)."""
    path = write_scenario(tmp_path_factory.mktemp("ev") / "ev.yaml", n_requests=12,
                          output_tokens=64)
    req = bench(path, stub_url, model="instant").requests
    return float(np.median((req["finish_s"] - req["first_token_s"]) / 63)) * 1e3


@pytest.fixture(scope="module")
def profile_path(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "stub.json"
    # the client path just before the calibration (the test probes it again just after: a
    # busy machine's path moves while the calibration runs, and the two bracket it)
    before = client_path_ms(stub_url, 6)
    calibrate_endpoint(stub_url, out, model=MODEL, reps=5, budget_s=60,
                       say=lambda m: None)
    out.with_suffix(".path.json").write_text(json.dumps(
        {str(p): v.tolist() for p, v in before.items()}))
    return out


def _ols_se(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Least squares of y on the columns of x: the coefficients' standard errors and the
    residual standard deviation, from these very points (sigma^2 (X'X)^-1)."""
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = max(len(y) - x.shape[1], 1)
    sigma2 = float(np.sum((y - x @ coef) ** 2)) / dof
    return np.sqrt(np.diag(sigma2 * np.linalg.pinv(x.T @ x))), float(np.sqrt(sigma2))


def _hc3_se(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Standard errors of the least-squares coefficients of y on the columns of x that hold
    when the points scatter unequally (MacKinnon-White HC3 sandwich,
    (X'X)^-1 X' diag(e_i^2 / (1 - h_i)^2) X (X'X)^-1, from these very points): a decode cell
    of 32 streams is one run, a cell of one stream fifteen, so their medians scatter
    unequally, and the context term rests on the large batches at long contexts.
    """
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    bread = np.linalg.pinv(x.T @ x)
    leverage = np.einsum("ij,jk,ik->i", x, bread, x)
    weight = ((y - x @ coef) / np.clip(1 - leverage, 1e-9, None)) ** 2
    return np.sqrt(np.diag(bread @ (x.T * weight) @ x @ bread))


def _se_median(values: list[float]) -> float:
    """Standard error of a sample median (1.2533 sigma / sqrt(n), sigma from the median
    absolute deviation: the stalls of a busy machine do not inflate it)."""
    v = np.asarray(values, float)
    return float(1.2533 * 1.4826 * np.median(np.abs(v - np.median(v))) / np.sqrt(v.size))


def _decode_fit_se(profile: StepProfile) -> tuple[np.ndarray, float]:
    """The decode fit's HC3 standard errors (base, per sequence, per KV token) over the
    profile's decode cells' medians, and Student's t for FALSE_ALARM (Bonferroni over the
    three coefficients, at the fit's degrees of freedom)."""
    cells = [(d, ctx, float(np.median(profile.samples_s[StepProfile.key(0, d, ctx)])))
             for d in profile.decode_seqs[1:] for ctx in profile.context_tokens]
    x = np.array([[1.0, d, d * ctx] for d, ctx, _ in cells])
    y = np.array([v for *_, v in cells]) * 1e3
    k = float(stats.t.ppf(1 - FALSE_ALARM / (2 * x.shape[1]), len(y) - x.shape[1]))
    return _hc3_se(x, y), k


def test_calibrate_recovers_the_stubs_step_times(profile_path: Path, stub_url: str,
                                                 client_ms_per_event: float) -> None:
    profile = load_step_profile(profile_path)
    over, fit = profile.meta["overheads"], profile.meta["endpoint_fit"]
    assert over["per_output_token_ms"] == 0.0  # the stub exposes no server-side ITL
    # every decode cell was probed, once, in the order seed 0 shuffles the grid into (a
    # machine whose speed drifts during the probe then scatters the cells about the fit,
    # where the residuals below show it, instead of tilting the context term)
    order = [tuple(c) for c in profile.meta["decode_order"]]
    grid = {"decode_prompts": [c - OUTPUT_TOKENS // 2 for c in profile.context_tokens],
            "decode_seqs": profile.decode_seqs[1:]}
    context_of = dict(zip(grid["decode_prompts"], profile.context_tokens, strict=True))
    assert profile.meta["decode_order_seed"] == 0
    assert order == [(d, context_of[p]) for p, d in decode_order(grid, 0)]
    assert len(set(order)) == len(profile.decode_seqs[1:]) * len(profile.context_tokens)
    # decode steps: one every 10 ms, at any batch and context. Each cell's median is a
    # replicate of that 10 ms; how far they scatter (a busy machine stalls a whole probe run,
    # every stream of it at once; a drift of its speed, shuffled over the cells) is measured
    # here, by the decode fit's residuals: the fitted base is 10 ms and the growth with
    # sequences and context nil within the fit's standard errors (HC3: the cells scatter
    # unequally) times Student's t for FALSE_ALARM (a calibration that misreads the steps,
    # say counts the tokens between two lengths wrongly, or takes the start-up into a step,
    # is off by several ms)
    se, k = _decode_fit_se(profile)
    # plus what the client itself adds per step and per stream: each running sequence is
    # one more SSE event per step that the client parses before the next one is timed, and
    # the small batches (1-4 streams), timed from their own chunks, carry that cost in the
    # base as much as in the slope (seen once: base 10.0093 ms against 3 standard errors
    # of 0.0054 ms, well inside one event's cost): one event's cost, measured in this test
    # (client_ms_per_event: the instant model's 64 events parsed back to back)
    assert fit["decode_base_ms"] == pytest.approx(ITL_MS, abs=k * se[0] + client_ms_per_event)
    # with decode grids up to 32 sequences the slope shows it (0.0034 ms per sequence
    # measured once against 3 standard errors of 0.0023)
    assert abs(fit["ms_per_decode_seq"]) <= k * se[1] + client_ms_per_event, (
        fit, se, k, client_ms_per_event)
    # the client's cost does not grow with context (one event per stream and step whatever
    # its length), and any cost of the batch size alone is orthogonal to this term on the
    # full grid (every size at every context): no allowance beyond the fit's own scatter
    assert abs(fit["ms_per_kv_token"]) <= k * se[2] + 1e-12, (fit, se, k)
    # TTFT = request overhead + prefill step: the stub's 60 ms plus what the client path and
    # the stub's wake-up add, which grows with the prompt sent (the JSON of the token ids)
    # and with the machine's load: a probe taken here, the same one-token requests at each
    # prompt length, measures it; the calibration's TTFT scatters about its fit by the
    # residual deviation (or its own samples' median error, where larger); the path is probed
    # just before and just after the calibration, and the slower of the two bounds it
    prefill = profile.prefill_tokens[1:]
    assert tuple(prefill) == PATH_PROMPTS
    before = json.loads(profile_path.with_suffix(".path.json").read_text())
    after = client_path_ms(stub_url, 7)
    path = {p: np.concatenate([before[str(p)], after[p]]) for p in prefill}
    ttft = {p: over["request_ms"] + profile.step_s(p, 0, 0) * 1e3 for p in prefill}
    se_ttft, sigma_ms = _ols_se(np.column_stack([np.ones(len(prefill)), prefill]),
                                np.array([ttft[p] for p in prefill]))
    for p in prefill:
        spread = max(sigma_ms, _se_median([v * 1e3 for v in profile.samples_s[
            StepProfile.key(p, 0, profile.context_tokens[0])]]))
        # never before the stub's deadline; at most the slowest path seen for that length
        assert TTFT_MS - 3 * spread <= ttft[p] <= TTFT_MS + path[p].max() + 3 * spread, (
            p, ttft[p], path[p])
    # the request overhead is the TTFT intercept less one decode step: 50 ms plus the path;
    # the growth with prompt length is the path's (the stub has none); both within three
    # standard errors of the TTFT fit (a calibration that took the stub's 60 ms for prefill
    # work, or the decode step for overhead, is off by 10 ms or more)
    lowest = min(c.min() for c in path.values())
    highest = max(c.max() for c in path.values())
    base = TTFT_MS - fit["decode_base_ms"]
    assert base + min(lowest, 0.0) - 3 * se_ttft[0] <= over["request_ms"] <= base + highest \
        + 3 * se_ttft[0]
    span = max(prefill) - min(prefill)
    growth_ms = fit["ms_per_prefill_token"] * span
    assert abs(growth_ms) <= highest - min(lowest, 0.0) + 3 * se_ttft[1] * span, (
        growth_ms, path)
    mixed = profile.meta["mixed_check"]
    assert mixed["samples_s"], "the mixed probe landed no prefill among the decodes"


def _kept_its_budget(meta: dict[str, Any], budget_s: float) -> list[dict[str, Any]]:
    """The rule the command keeps: no probe step starts once the budget is spent (so the
    wall time is the budget plus at most the last step and the fit). Returns the steps.
    """
    steps: list[dict[str, Any]] = meta["budget"]["steps"]
    assert steps and all(s["start_s"] < budget_s for s in steps), steps
    return steps


# a stand-in whose answers slow 2.5-fold after the calibration's first look (its first seven
# requests: the pre-flight, the warm-up's two, the long prefill's three, one decode stream):
# sleeps, so the slowdown is the stand-in's, not the CPU's. The plan sized from the first look
# underestimates the rest by about that much
SLOWING = "slowing:30:5:{factor}:8#{tag}"


def test_calibrate_sheds_work_to_keep_its_budget_when_the_server_slows(
        stub_url: str, tmp_path: Path) -> None:
    budget_s = 25.0
    out = tmp_path / "slow.json"
    lines: list[str] = []
    meta = calibrate_endpoint(stub_url, out, model=SLOWING.format(factor=2.5, tag="shed"),
                              reps=3, budget_s=budget_s, say=lines.append)
    _kept_its_budget(meta, budget_s)
    # work was shed, in the stated order, each piece said with why: the rest, at the
    # ratios of measured to planned time so far, would have ended past the budget
    shed = meta["budget"]["shed"]
    assert shed, lines
    ranks = [SHED_ORDER.index(e["shed"]) for e in shed]
    assert ranks == sorted(ranks), shed
    said = [line for line in lines if line.startswith("budget: ")]
    assert len(said) == len(shed) and all(e["what"] in s for e, s in zip(shed, said,
                                                                         strict=True))
    # shedding sufficed: a whole profile, every decode size kept measured at every context
    assert "partial" not in meta
    profile = load_step_profile(out)
    for d in profile.decode_seqs[1:]:
        for ctx in profile.context_tokens:
            assert StepProfile.key(0, d, ctx) in profile.samples_s, (d, ctx)
    gone = {int(e["what"].split()[3]) for e in shed if e["shed"] == "decode_size"}
    assert not gone & set(profile.decode_seqs)
    # what was measured is the slowed stand-in's: decode steps 2.5 × 5 ms, not 5 (every
    # decode cell comes after its first seven requests): the base no lower than 12.5 ms less
    # the decode fit's own error (HC3 over this profile's cells, Student's t for
    # FALSE_ALARM); a calibration that kept the first look's 5 ms is 7.5 ms short
    se, k = _decode_fit_se(profile)
    assert profile.meta["endpoint_fit"]["decode_base_ms"] >= 2.5 * 5.0 - k * se[0], (
        profile.meta["endpoint_fit"], se, k)


def test_calibrate_stops_at_its_budget_with_the_points_measured(stub_url: str,
                                                                tmp_path: Path) -> None:
    # six times slower: even the smallest plan (two decode sizes) does not fit, so the probe
    # stops when the budget is spent and keeps what it measured, as a stop signal does
    budget_s = 20.0
    out = tmp_path / "stop.json"
    lines: list[str] = []
    meta = calibrate_endpoint(stub_url, out, model=SLOWING.format(factor=6, tag="stop"),
                              reps=3, budget_s=budget_s, say=lines.append)
    steps = _kept_its_budget(meta, budget_s)
    assert meta["partial"]["stopped_by"] == "budget"
    assert meta["partial"]["decode_points"] < meta["partial"]["planned_decode_points"]
    assert any(line.startswith(f"budget: {budget_s:g} s spent") for line in lines), lines
    # it stopped because the budget was spent, at the next step's start
    assert meta["budget"]["stopped_at_s"] >= budget_s > steps[-1]["start_s"]
    assert out.exists() or out.with_suffix(".partial.json").exists()


def test_calibrate_writes_the_servers_knobs_as_a_scenario_fragment(profile_path: Path) -> None:
    fragment = yaml.safe_load(profile_path.with_suffix(".scenario.yaml").read_text())
    assert fragment["policy"] == {"kind": "vllm", "block_size": 16, "num_gpu_blocks": 1024,
                                  "enable_prefix_caching": False}  # the stub's cache_config
    assert fragment["service"]["kind"] == "llm_profile"
    assert Path(fragment["service"]["path"]) == profile_path.resolve()
    assert set(fragment["service"]["overheads"]) == {"request_ms", "per_output_token_ms"}


OUTPUT = 16  # output tokens of the compare scenario


def test_compare_against_the_stub_predicts_what_bench_measures(
        stub_url: str, profile_path: Path, tmp_path: Path, client_ms_per_event: float) -> None:
    scenario = write_scenario(tmp_path / "cmp.yaml", kind="poisson", rate_rps=8,
                              n_requests=24, prompt_tokens=40, output_tokens=OUTPUT)
    data = compare_endpoint(scenario, stub_url, tmp_path / "out", profile=profile_path,
                            repeats=1)
    rows = {r["metric"]: r for r in data["rows"]}
    written = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert [r["metric"] for r in written["rows"]] == [r["metric"] for r in data["rows"]]
    assert data["driver"] == "bench" and data["model"] == MODEL
    assert (tmp_path / "out" / "bench-1" / "requests.parquet").is_file()
    assert (tmp_path / "out" / "bench-1" / "probe.json").is_file()
    assert len(data["probes"]) == 1 and set(data["probes"][0]) == {
        "prefill_scale", "decode_scale", "drift"}
    # The stub answers each request alone: its TTFT is 60 ms + the client path, its TPOT
    # 10 ms (absolute deadlines: the gaps average exactly that). The simulator's engine runs
    # in steps, so a request that becomes ready while others decode waits for the running
    # step (between 0 and one step: the stub has no such wait). That wait is read off the
    # prediction's own steps, request by request on the shared schedule, and taken out; what
    # is left must match the bench within what the calibration and this run could not know:
    # the client path's range over the probes (before and after the calibration; the
    # prediction's TTFT at 40 tokens interpolates the 16- and 64-token cells), the probe's
    # rescaling, and the sampling error of the medians (normal quantile for FALSE_ALARM,
    # Bonferroni over the three metrics)
    z = float(stats.norm.ppf(1 - FALSE_ALARM / (2 * 3)))
    profile = load_step_profile(profile_path)
    live = pd.read_parquet(tmp_path / "out" / "bench-1" / "requests.parquet")
    pred = pd.read_parquet(tmp_path / "out" / "sim-1" / "requests.parquet")
    steps = pd.read_parquet(tmp_path / "out" / "sim-1" / "steps.parquet")
    probe = json.loads((tmp_path / "out" / "bench-1" / "probe.json").read_text())
    assert sorted(live["id"]) == sorted(pred["id"])  # one seeded schedule, the same ids
    request_s = data["overheads_ms"]["request_ms"] / 1e3
    ends = (steps["start_s"] + steps["duration_s"]).to_numpy()
    wait_s = []
    for arrival, first in zip(pred["arrival_s"], pred["first_token_s"], strict=True):
        i = int(np.argmin(np.abs(ends - first)))  # the step that ran its prefill
        wait_s.append(float(steps["start_s"].iloc[i]) - (arrival + request_s))
    longest_s = float(steps["duration_s"].max())
    assert min(wait_s) >= -1e-9 and max(wait_s) <= longest_s * (1 + 1e-9), (wait_s, longest_s)
    wait_ms = np.asarray(wait_s) * 1e3

    def ms(frame: pd.DataFrame) -> dict[str, np.ndarray]:
        ttft = (frame["first_token_s"] - frame["arrival_s"]).to_numpy() * 1e3
        e2e = (frame["finish_s"] - frame["arrival_s"]).to_numpy() * 1e3
        return {"ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / (OUTPUT - 1)}

    got, want = ms(live), ms(pred)
    before = json.loads(profile_path.with_suffix(".path.json").read_text())
    after = client_path_ms(stub_url, 8)
    ends_p = (16, 64)  # the prefill cells the prediction's 40-token TTFT lies between
    path = np.concatenate([np.r_[before[str(p)], after[p]] for p in ends_p])
    path_range_ms = float(path.max() - min(path.min(), 0.0))
    cal_se = [_se_median([v * 1e3 for v in profile.samples_s[StepProfile.key(
        p, 0, profile.context_tokens[0])]]) for p in ends_p]
    scales = [*probe["prefill_scale_by_tokens"].values(), *probe["decode_scale_by_seqs"].values()]
    moved = max(abs(s - 1) for s in scales)
    ttft_bound = path_range_ms + moved * ITL_MS + z * math.hypot(_se_median(got["ttft"]), *cal_se)
    # TPOT: the prediction's decode steps are the cells' medians (sizes up to the largest
    # batch its steps ran), each within the decode fit's scatter of 10 ms, plus the client's
    # cost per event of that many streams; the live TPOT is 10 ms plus how much later its
    # last chunk came than its first, at most the path's range over the 15 gaps
    most = int(steps["decode_seqs"].max())
    sizes = [d for d in profile.decode_seqs[1:] if d <= most] + [
        min(d for d in profile.decode_seqs if d >= most)]
    cells = np.array([np.median(profile.samples_s[StepProfile.key(0, d, c)])
                      for d in set(sizes) for c in profile.context_tokens]) * 1e3
    cell_rms = float(np.sqrt(np.mean((cells - ITL_MS) ** 2)))
    tpot_bound = (z * math.hypot(_se_median(got["tpot"]), cell_rms) + moved * ITL_MS
                  + client_ms_per_event * most + path_range_ms / (OUTPUT - 1))
    bounds = {"ttft": ttft_bound, "tpot": tpot_bound,
              "e2e": ttft_bound + (OUTPUT - 1) * tpot_bound}
    for metric, bound in bounds.items():
        # the prediction less its step waits (TPOT has none) against the bench, and the
        # compare's own row: off by at most the bound, plus the waits on the high side
        less = want[metric] - (0.0 if metric == "tpot" else wait_ms)
        assert abs(np.median(less) - np.median(got[metric])) <= bound, (
            metric, np.median(less), np.median(got[metric]), bound)
        row = rows[f"{metric}_ms.p50"]
        assert row["live_median"] == pytest.approx(np.median(got[metric]), rel=1e-9)
        high = bound + (wait_ms.max() if metric != "tpot" else 0.0)
        assert -bound <= row["sim"] - row["live_median"] <= high, (metric, row, bound, high)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env(), cwd=REPO)


def _one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    text = " ".join((proc.stderr + proc.stdout).split())
    for needle in needles:
        assert needle in text, text


def test_calibrate_unreachable_endpoint_is_one_line(tmp_path: Path) -> None:
    from executor.endpoint.servers import free_port

    proc = _cli("calibrate", "--endpoint", f"http://127.0.0.1:{free_port()}",
                "--out", str(tmp_path / "p.json"))
    _one_line_error(proc, "cannot reach", "connection refused")
    assert not (tmp_path / "p.json").exists()


def test_calibrate_budget_too_small_is_one_line(stub_url: str, tmp_path: Path) -> None:
    proc = _cli("calibrate", "--endpoint", stub_url, "--model", MODEL, "--budget-s", "0.5",
                "--out", str(tmp_path / "p.json"))
    _one_line_error(proc, "--budget-s 0.5: too small")


def test_calibrate_bad_flags_are_one_line(stub_url: str, tmp_path: Path) -> None:
    _one_line_error(_cli("calibrate", "--endpoint", stub_url, "--reps", "2", "--out",
                         str(tmp_path / "p.json")), "--reps 2")
    _one_line_error(_cli("calibrate", "--endpoint", "localhost:8000", "--out",
                         str(tmp_path / "p.json")), "--endpoint", "http")


def test_compare_endpoint_needs_a_profile(stub_url: str, tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "s.yaml")
    _one_line_error(_cli("compare", str(scenario), "--endpoint", stub_url, "--out",
                         str(tmp_path / "o")), "--profile")
    _one_line_error(_cli("compare", str(scenario), "--endpoint", stub_url, "--profile",
                         str(tmp_path / "none.json"), "--out", str(tmp_path / "o")),
                    "--profile", "none.json")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_calibrate_writes_the_points_measured(stub_url: str, tmp_path: Path,
                                                              sig: signal.Signals) -> None:
    out = tmp_path / "p.json"
    # stopped during the decode probes, after the fourth decode cell came: the cells come in
    # a shuffled order, and four of them on three contexts hold two at one context at least
    proc, text = signal_mid_run(
        ["calibrate", "--endpoint", stub_url, "--model", MODEL, "--reps", "3", "--budget-s",
         "120", "--out", str(out)], "plan", sig, after="seqs at context", wait_s=0.3,
        stream="stdout", after_lines=4)
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "interrupted — partial profile" in text, text
    profile = load_step_profile(out)
    partial = profile.meta["partial"]
    assert partial["stopped_by"] == sig.name
    assert partial["prefill_points"] == partial["planned_prefill_points"]
    assert 4 <= partial["decode_points"] < partial["planned_decode_points"]
    # the cells measured are the first of the seeded order, each one's samples kept
    done = [tuple(c) for c in partial["decode_cells_done"]]
    assert done == [tuple(c) for c in profile.meta["decode_order"]][:len(done)]
    assert set(partial["decode_itl_s"]) == {f"{d},{c}" for d, c in done}
    # the profile is the largest block of them: every size it holds measured at every
    # context it holds, and no larger block among the cells done
    block = [(d, c) for d in profile.decode_seqs[1:] for c in profile.context_tokens]
    assert set(block) <= set(done) and len(profile.decode_seqs) >= 3
    for c in {c for _, c in done}:
        assert len([d for d, cc in done if cc == c]) <= len(block)
    # what was measured is the stub's: one decode step every 10 ms (its deadlines are
    # absolute, so a cell's gaps average exactly that). How far a cell's median may stray is
    # read from the other cells done, each a replicate of the same 10 ms: their root mean
    # square deviation from it, times Student's t at as many degrees of freedom (the mean is
    # known) for FALSE_ALARM (not the cell's own samples' spread: the streams of one run
    # share its stalls, so they are no independent replicates). A calibration that took the
    # first token's 60 ms into a step, or counted the tokens between two lengths wrong, is
    # off by a millisecond or more
    d, ctx = block[0]
    others = np.array([np.median(v) for key, v in partial["decode_itl_s"].items()
                       if key != f"{d},{ctx}"]) * 1e3
    rms_ms = float(np.sqrt(np.mean((others - ITL_MS) ** 2)))
    t = float(stats.t.ppf(1 - FALSE_ALARM / 2, others.size))
    assert profile.step_s(0, d, d * ctx) * 1e3 == pytest.approx(ITL_MS, abs=t * rms_ms), (
        others, rms_ms)
    fragment = yaml.safe_load(out.with_suffix(".scenario.yaml").read_text())
    assert fragment["service"]["kind"] == "llm_profile"


def test_a_signal_before_enough_points_keeps_the_samples(stub_url: str,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    proc, text = signal_mid_run(
        ["calibrate", "--endpoint", stub_url, "--model", MODEL, "--reps", "3", "--budget-s",
         "120", "--out", str(out)], "plan", signal.SIGINT, wait_s=0.0, stream="stdout")
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "not a usable profile" in text, text
    assert not out.exists()
    raw = json.loads(out.with_suffix(".partial.json").read_text())
    assert raw["partial"]["stopped_by"] == "SIGINT"
    assert raw["partial"]["decode_points"] == 0


def test_compare_endpoint_sweep_writes_one_comparison_per_load(
        stub_url: str, profile_path: Path, tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "sw.yaml", kind="poisson", rate_rps=8,
                              n_requests=16, prompt_tokens=40, output_tokens=16)
    out = tmp_path / "sweep"
    proc = _cli("compare", str(scenario), "--endpoint", stub_url, "--profile",
                str(profile_path), "--sweep", "0.3,0.6", "--repeats", "1", "--probe", "off",
                "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "fidelity curve" in proc.stdout and "Traceback" not in proc.stderr
    offered = {}
    for rho in ("0.3", "0.6"):
        data = json.loads((out / f"rho-{rho}" / "compare.json").read_text())
        assert data["driver"] == "bench" and data["model"] == MODEL
        assert (out / f"rho-{rho}" / "bench-1" / "requests.parquet").is_file()
        offered[rho] = data["offered_rps"]
    # one seeded Poisson schedule at twice the rate (the same capacity, no probe): every
    # arrival time halves, so the offered rate doubles exactly
    assert offered["0.6"] == pytest.approx(2 * offered["0.3"], rel=1e-9)
    curve = json.loads((out / "fidelity.json").read_text())
    assert {r["target_rho"] for r in curve["rows"]} == {0.3, 0.6}
    assert curve["capacity_rps"] > 0
    rate = {r["target_rho"]: r["rate_rps"] for r in curve["rows"]}
    assert rate[0.6] == pytest.approx(2 * rate[0.3])
    bad = _cli("compare", str(scenario), "--endpoint", stub_url, "--profile",
               str(profile_path), "--sweep", "2", "--out", str(tmp_path / "bad"))
    _one_line_error(bad, "--sweep rho=2: must lie in (0, 1.5)")
