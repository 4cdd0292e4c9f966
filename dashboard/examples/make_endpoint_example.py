"""Regenerate the endpoint comparison shipped with the Verify page, against the stub server.

``servelab compare --endpoint`` writes the same ``compare.json`` as the live compare, with
``bench-i/`` run directories whose ``meta.json`` names the server measured. This script makes
a small one with the project's own code (no number in it is written by hand): it starts the
stub server (``executor.endpoint.stub``, a fixed 60 ms TTFT and 10 ms per token) on a
loopback port, calibrates a step profile from it (``calibrate --endpoint``), runs the
compare twice with probes and stops the server.

Usage: python dashboard/examples/make_endpoint_example.py [OUT]
(default OUT: dashboard/examples/compare-endpoint-stub)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODEL = "timed:60:10"  # the stub's timing: TTFT 60 ms, then a token every 10 ms
SCENARIO = {
    "name": "compare-endpoint-stub", "seed": 3,
    "service": {"kind": "llm_linear", "base_ms": 5, "per_prefill_token_ms": 0.01,
                "per_decode_seq_ms": 0.1},
    "workload": {"kind": "poisson", "rate_rps": 8, "n_requests": 32, "prompt_tokens": 40,
                 "output_tokens": 16},
    "policy": {"kind": "vllm", "max_num_seqs": 16, "max_num_batched_tokens": 512,
               "block_size": 16, "num_gpu_blocks": 1024},
    "warmup_s": 0}


def relative_paths(out: Path) -> None:
    """Paths in the written text files relative to the repository (where the pages run), as
    in the other shipped examples, so the example reads the same in any checkout.
    """
    prefix = f"{ROOT}/"
    for path in [*out.rglob("*.json"), *out.rglob("*.yaml")]:
        text = path.read_text()
        if prefix in text:
            path.write_text(text.replace(prefix, ""))


def main(out: Path) -> None:
    """Start the stub, calibrate, compare into ``out``, stop the stub."""
    from executor.endpoint.calibrate import calibrate_endpoint
    from executor.endpoint.compare_endpoint import compare_endpoint
    from executor.endpoint.servers import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "executor.endpoint.stub", "--port",
                             str(port)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("the stub server did not start")
        url = f"http://127.0.0.1:{port}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        profile = out / "profile.json"
        calibrate_endpoint(url, profile, model=MODEL, reps=5, budget_s=60, say=print)
        scenario = out.parent / f"{out.name}.yaml"
        scenario.write_text("# The endpoint comparison shipped with the Verify page:\n"
                            "#   python dashboard/examples/make_endpoint_example.py\n"
                            + yaml.safe_dump(SCENARIO, sort_keys=False))
        data = compare_endpoint(scenario, url, out, profile=profile.relative_to(ROOT),
                                repeats=2, model=MODEL, progress=print)
        relative_paths(out)
        print(f"wrote {out}: {len(data['rows'])} metrics, server {url}")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "compare-endpoint-stub")
