"""``calibrate --endpoint`` and ``compare --endpoint`` against the stub server in ``timed``
mode, whose step times are known: the first token 60 ms after a request arrives, then one
every 10 ms, whatever the prompt length or the number of streams.

Tolerances follow from the stub's timing: it sleeps until absolute deadlines
(``t0 + 60 ms + i × 10 ms``), so its lateness (event-loop wake-ups, up to ~1 ms, more on a
loaded machine) does not accumulate and cancels in the gaps; what the client adds to the
TTFT (HTTP, JSON, its own loop) is a few ms on this machine and is what the fitted
per-request overhead must absorb beyond the stub's 60 ms less one decode step.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibration.step_profile import load_step_profile
from executor.endpoint.calibrate import calibrate_endpoint
from executor.endpoint.compare_endpoint import compare_endpoint
from tests.executor.endpoint.conftest import REPO, env, signal_mid_run, write_scenario

TTFT_MS, ITL_MS = 60.0, 10.0
MODEL = f"timed:{TTFT_MS:g}:{ITL_MS:g}"
CLIENT_MS = 20.0  # the most the client + HTTP path may add to a TTFT on a busy machine


@pytest.fixture(scope="module")
def profile_path(stub_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "stub.json"
    calibrate_endpoint(stub_url, out, model=MODEL, reps=5, budget_s=60,
                       say=lambda m: None)
    return out


def test_calibrate_recovers_the_stubs_step_times(profile_path: Path) -> None:
    profile = load_step_profile(profile_path)
    over = profile.meta["overheads"]
    assert over["per_output_token_ms"] == 0.0  # the stub exposes no server-side ITL
    # decode steps: one every 10 ms, at any batch and context
    for d in profile.decode_seqs[1:]:
        for ctx in profile.context_tokens:
            assert profile.step_s(0, d, d * ctx) * 1e3 == pytest.approx(ITL_MS, abs=1.5)
    # TTFT = request overhead + prefill step: 60 ms plus what the client adds, any length
    for p in profile.prefill_tokens[1:]:
        ttft_ms = over["request_ms"] + profile.step_s(p, 0, 0) * 1e3
        assert TTFT_MS - 1.0 <= ttft_ms <= TTFT_MS + CLIENT_MS, (p, ttft_ms)
    assert TTFT_MS - ITL_MS - 2.0 <= over["request_ms"] <= TTFT_MS + CLIENT_MS
    # no growth with prompt length or batch (the stub has none)
    fit = profile.meta["endpoint_fit"]
    assert abs(fit["ms_per_prefill_token"]) * 1024 < 4.0
    assert abs(fit["ms_per_decode_seq"]) * 16 < 2.0
    mixed = profile.meta["mixed_check"]
    assert mixed["samples_s"], "the mixed probe landed no prefill among the decodes"


def test_calibrate_writes_the_servers_knobs_as_a_scenario_fragment(profile_path: Path) -> None:
    fragment = yaml.safe_load(profile_path.with_suffix(".scenario.yaml").read_text())
    assert fragment["policy"] == {"kind": "vllm", "block_size": 16, "num_gpu_blocks": 1024}
    assert fragment["service"]["kind"] == "llm_profile"
    assert Path(fragment["service"]["path"]) == profile_path.resolve()
    assert set(fragment["service"]["overheads"]) == {"request_ms", "per_output_token_ms"}


def test_compare_against_the_stub_predicts_what_bench_measures(
        stub_url: str, profile_path: Path, tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "cmp.yaml", kind="poisson", rate_rps=8,
                              n_requests=24, prompt_tokens=40, output_tokens=16)
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
    # the stub's TTFT is 60 ms + the client path (the overhead absorbs it); its TPOT 10 ms
    assert abs(rows["ttft_ms.p50"]["rel_error"]) < CLIENT_MS / TTFT_MS
    assert abs(rows["tpot_ms.p50"]["rel_error"]) < 0.15
    assert abs(rows["e2e_ms.p50"]["rel_error"]) < 0.15


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
    # stopped during the decode probes, after the second decode point came
    proc, text = signal_mid_run(
        ["calibrate", "--endpoint", stub_url, "--model", MODEL, "--reps", "3", "--budget-s",
         "120", "--out", str(out)], "plan", sig, after="decode   2 seqs", wait_s=0.3,
        stream="stdout")
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "interrupted — partial profile" in text, text
    profile = load_step_profile(out)
    partial = profile.meta["partial"]
    assert partial["stopped_by"] == sig.name
    assert partial["prefill_points"] == partial["planned_prefill_points"]
    assert 2 <= partial["decode_points"] < partial["planned_decode_points"]
    assert profile.decode_seqs[:3] == [0, 1, 2]
    # what was measured is the stub's: one decode step every 10 ms
    assert profile.step_s(0, 2, 2 * profile.context_tokens[0]) * 1e3 == pytest.approx(
        ITL_MS, abs=1.5)
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
    assert offered["0.6"] == pytest.approx(2 * offered["0.3"], rel=0.35)  # 16 requests each
    curve = json.loads((out / "fidelity.json").read_text())
    assert {r["target_rho"] for r in curve["rows"]} == {0.3, 0.6}
    assert curve["capacity_rps"] > 0
    rate = {r["target_rho"]: r["rate_rps"] for r in curve["rows"]}
    assert rate[0.6] == pytest.approx(2 * rate[0.3])
    bad = _cli("compare", str(scenario), "--endpoint", stub_url, "--profile",
               str(profile_path), "--sweep", "2", "--out", str(tmp_path / "bad"))
    _one_line_error(bad, "--sweep rho=2: must lie in (0, 1.5)")
