"""The scenario fragment beside a ``calibrate --endpoint`` profile
(``PROFILE.scenario.yaml``: the service with its overheads and the server's scheduling knobs
as the ``vllm`` policy), and the overrides that make a scenario use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from executor.endpoint.server_info import EndpointError


def write_fragment(profile_path: Path, meta: dict[str, Any], knobs: dict[str, Any],
                   max_num_seqs: int | None, max_num_batched_tokens: int | None) -> Path:
    """The scenario fragment (``PROFILE.scenario.yaml``): service with the overheads, and the
    server's scheduling knobs as the ``vllm`` policy.
    """
    policy: dict[str, Any] = {"kind": "vllm"}
    if "block_size" in knobs:
        policy["block_size"] = knobs["block_size"]
    if "num_blocks" in knobs:
        policy["num_gpu_blocks"] = knobs["num_blocks"]
    if "enable_prefix_caching" in knobs:
        # vLLM's default is on, the simulator's off: a hash-block trace then hits in both (and
        # the load sweep's capacity is the one at the trace's hits)
        policy["enable_prefix_caching"] = bool(knobs["enable_prefix_caching"])
    if max_num_seqs:
        policy["max_num_seqs"] = max_num_seqs
    if max_num_batched_tokens:
        policy["max_num_batched_tokens"] = max_num_batched_tokens
    fragment = {"service": {"kind": "llm_profile", "path": str(profile_path.resolve()),
                            "overheads": meta["overheads"]},
                "policy": policy}
    path = profile_path.with_suffix(".scenario.yaml")
    caching = knobs.get("enable_prefix_caching")
    head = (f"# from servelab calibrate --endpoint {meta['endpoint']} (model {meta['model']})"
            f"\n# server prefix caching: {caching} (the probes' prompts share no prefix, but "
            "those of the cached-prefix probe)\n")
    path.write_text(head + yaml.safe_dump(fragment, sort_keys=False))
    return path


def endpoint_overrides(profile_path: str | Path) -> dict[str, Any]:
    """Dotted-key overrides that make a scenario use a calibrated endpoint profile: its
    service with overheads and the server's knobs (from the fragment beside it, where the
    user's scenario leaves the policy's kind as vllm).

    Raises:
        EndpointError: the profile has no fragment beside it.
    """
    path = Path(profile_path).with_suffix(".scenario.yaml")
    if not path.is_file():
        raise EndpointError(f"--profile {profile_path}: no {path.name} beside it; write it "
                            "with servelab calibrate --endpoint URL --out PROFILE.json")
    data = yaml.safe_load(path.read_text()) or {}
    out: dict[str, Any] = {"service": data["service"]}
    for key, value in (data.get("policy") or {}).items():
        out[f"policy.{key}"] = value
    return out
