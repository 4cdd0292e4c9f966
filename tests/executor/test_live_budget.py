"""``servelab live`` refuses a run that would not fit the memory budget before any model is
loaded (issue 28): one line naming the field, exit 2, and the refusing process stays small.

Each case runs the CLI in a subprocess under an address-space limit (``RLIMIT_AS``), so
that without the check the allocation fails inside the limit instead of taking the machine,
and reports its own peak RSS, which must stay far below the budget.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# torch alone maps ~0.9 GB of address space; the refusals import neither it nor a model
ADDRESS_LIMIT_BYTES = 3 * 2**30
PEAK_RSS_LIMIT_BYTES = 512 * 2**20
# The peak is this process's own (VmHWM: the high-water mark of its address space, new at
# exec), not ru_maxrss: Linux carries the forking parent's peak across fork and exec into
# ru_maxrss, so under a full suite's pytest (about 1 GB) every case read 990 MB
WRAPPER = """
import os, runpy, sys
sys.argv = ["servelab", *sys.argv[1:]]
try:
    runpy.run_module("servelab.cli", run_name="__main__", alter_sys=True)
finally:
    with open("/proc/self/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(os.environ["PEAK_RSS_FILE"], "w") as fh:
        fh.write(str(kib * 1024))
"""

REQUESTS = {"seed": 1, "service": {"kind": "constant", "ms": 1},
            "workload": {"kind": "poisson", "rate_rps": 100, "n_requests": 50},
            "policy": {"kind": "greedy", "max_batch_size": 4},
            "model": {"name": "mlp", "params": {"width": 32, "depth": 1, "in_features": 8}}}
LLM = {"seed": 1,
       "service": {"kind": "llm_linear", "base_ms": 5, "per_prefill_token_ms": 0.01,
                   "per_decode_seq_ms": 0.05},
       "workload": {"kind": "poisson", "rate_rps": 5, "n_requests": 20, "prompt_tokens": 10,
                    "output_tokens": 5},
       "policy": {"kind": "vllm", "num_gpu_blocks": 64},
       "model": {"params": {"shape": "small", "layers": 1, "hidden": 64, "heads": 2,
                            "kv_heads": 1, "intermediate": 64, "vocab": 128}}}


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_LIMIT_BYTES, ADDRESS_LIMIT_BYTES))


def live_cli(tmp_path: Path, scenario: dict, *args: str, command: str = "live"
             ) -> tuple[subprocess.CompletedProcess[str], int]:
    """``servelab live`` (or ``command``) on ``scenario`` in a subprocess: (the process, its
    peak RSS)."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    peak_file = tmp_path / "peak"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250",
           "PEAK_RSS_FILE": str(peak_file)}
    proc = subprocess.run([sys.executable, "-c", WRAPPER, command, str(path), *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
                          preexec_fn=_limit_address_space)
    peak = int(peak_file.read_text()) if peak_file.exists() else -1
    return proc, peak


CASES = [
    # the request-level run simulated its 1e9 requests first (the bounds check): a
    # MemoryError with a traceback; with --force it built the runner, then the 7.5 GiB
    # schedule
    ("1e9 requests", REQUESTS, ["--set", "workload.n_requests=1000000000"],
     "workload.n_requests: this live run would take"),
    ("1e9 requests, --force", REQUESTS, ["--force", "--set", "workload.n_requests=1000000000"],
     "workload.n_requests: this live run would take"),
    ("rate x duration", REQUESTS, ["--force", "--set", "workload.rate_rps=1e9", "--set",
                                   "workload.duration_s=10"],
     "workload.duration_s: this live run would take"),
    # 4096 runners of 2 x 1.3e5 weights each (4.1 GiB with their build temporaries) were
    # built one by one until the allocation failed
    ("4096 replicas", REQUESTS, ["--force", "--set", "replicas=4096", "--set",
                                 "model.params={width: 128, depth: 8}"], "replicas: "),
    # an mlp of 1e8 inputs: 24 GiB of weights before the first request
    ("model input size", REQUESTS, ["--force", "--set",
                                    "model.params={in_features: 100000000}"],
     "model.params: this live run would take"),
    # 1e4 requests of 6.5e4 inputs in one batch: 7.4 GiB of payloads in a worker
    ("batch of huge inputs", {**REQUESTS, "workload": {"kind": "poisson", "rate_rps": 1e6,
                                                       "n_requests": 10_000}},
     ["--force", "--set", "policy.max_batch_size=10000", "--set",
      "model.params={in_features: 65536, width: 64, depth: 1}"],
     "policy.max_batch_size: this live run would take"),
    # the LLM plan (arrivals, token counts) was drawn first: a MemoryError
    ("llm 1e9 requests", LLM, ["--set", "workload.n_requests=1000000000"],
     "workload.n_requests: this live run would take"),
    # 1e6 KV slots: torch.zeros of 488 GiB
    ("llm max_num_seqs 1e6", LLM, ["--force", "--set", "policy.max_num_seqs=1000000",
                                   "--set", "policy.max_num_batched_tokens=2000000"],
     "policy.max_num_seqs: this live run would take"),
    # a 1e6-wide decoder: 11 TiB of weights
    ("llm hidden 1e6", LLM, ["--force", "--set", "model.params.hidden=1000000"],
     "model.params: this live run would take"),
    # 64 engines with their KV caches of 64 x 2048 tokens: 16 GiB
    ("llm 64 engines", LLM, ["--force", "--set", "replicas=64"], "replicas: this live run"),
    # the prefix caches' per-block lists of 1e9 blocks (the simulator's too): 22 GiB
    ("llm 1e9 cached blocks", LLM, ["--force", "--set", "policy.enable_prefix_caching=true",
                                    "--set", "policy.num_gpu_blocks=1000000000"],
     "policy.num_gpu_blocks: this live run would take"),
]


@pytest.mark.parametrize(("label", "scenario", "args", "needle"), CASES,
                         ids=[c[0] for c in CASES])
def test_live_beyond_the_memory_budget_is_refused_before_any_model_loads(
        tmp_path: Path, label: str, scenario: dict, args: list[str], needle: str) -> None:
    proc, peak_bytes = live_cli(tmp_path, scenario, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], lines[0]
    assert "pass --yes" in lines[0] and "beyond the budget of 4 GiB of memory" in lines[0]
    # refused before any model (or torch) was loaded and before the schedule was drawn
    assert 0 < peak_bytes < PEAK_RSS_LIMIT_BYTES, peak_bytes


COMPARE_CASES = [c for c in CASES if c[0] in (
    "1e9 requests", "1e9 requests, --force", "model input size", "llm 1e9 requests")]


@pytest.mark.parametrize(("label", "scenario", "args", "needle"), COMPARE_CASES,
                         ids=[c[0] for c in COMPARE_CASES])
def test_compare_beyond_the_memory_budget_is_refused_before_it_simulates(
        tmp_path: Path, label: str, scenario: dict, args: list[str], needle: str) -> None:
    # compare simulated the scenario before anything else (its bounds check and the
    # prediction): 1e9 requests held the process in "simulating" past a minute, growing,
    # with or without --force; an mlp of 1e8 inputs was built after the simulation
    proc, peak_bytes = live_cli(tmp_path, scenario, *args, "--repeats", "1",
                                command="compare")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0] and "pass --yes" in lines[0], lines[0]
    assert 0 < peak_bytes < PEAK_RSS_LIMIT_BYTES, peak_bytes
