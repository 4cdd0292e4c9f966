"""The request-level side of ``servelab bench`` and ``servelab calibrate --endpoint``
(``--api kserve-v2 | http-json``): the commands dispatch here from
:mod:`servelab.endpoint_cli` and :mod:`servelab.cli`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _cli() -> Any:
    from servelab import cli

    return cli


def bench_requests_cmd(scenario: str, endpoint: str, out: Path | None, api: str,
                       model: str | None, max_concurrency: int | None,
                       set_: list[str] | None, drain_timeout_s: float | None,
                       request_timeout_s: float | None, quiet: bool) -> None:
    """``servelab bench SCENARIO --endpoint URL --api kserve-v2|http-json``."""
    from executor.endpoint.request_bench import bench_requests
    from sim.llm import is_llm_source

    cli = _cli()
    fail, USER_ERRORS = cli.fail, cli.USER_ERRORS  # noqa: N806
    try:
        if is_llm_source(scenario):
            fail(f"{scenario}: --api {api} measures request-level scenarios; LLM scenarios "
                 "take --api openai-completions or openai-chat")
    except USER_ERRORS as exc:
        fail(str(exc))
    from servelab.endpoint_cli import bench_with_progress

    result = bench_with_progress(
        lambda on_done, on_client: bench_requests(
            scenario, endpoint, api=api, model=model, overrides=set_ or None,
            max_concurrency=max_concurrency, drain_timeout_s=drain_timeout_s,
            request_timeout_s=request_timeout_s, handle_signals=True, on_done=on_done,
            on_client=on_client),
        lambda client: f"bench: {len(client.jobs)} requests to {client.url}", quiet)
    if out is not None:
        result.write(out)
    from servelab.endpoint_cli import _report

    _report(result, out, quiet, drain_note=True,
            tail="batches, queues and service times are not visible from outside the server")


def calibrate_endpoint_cmd(endpoint: str, api: str, model: str | None, batch_sizes: str,
                           reps: int, seed: int, out: Path, window_ms: float | None,
                           server_max_batch: int | None, scenario: str | None) -> None:
    """``servelab calibrate --endpoint URL --api kserve-v2|http-json``."""
    from calibration.measure import parse_batch_sizes
    from executor.endpoint.request_calibrate import calibrate_endpoint
    from sim.scenario.schema import load_scenario

    cli = _cli()
    fail, USER_ERRORS, console = cli.fail, cli.USER_ERRORS, cli.console  # noqa: N806
    try:
        payload = load_scenario(scenario).payload if scenario else None
        profile = calibrate_endpoint(endpoint, api=api, sizes=parse_batch_sizes(batch_sizes),
                                     reps=reps, model=model, payload=payload,
                                     window_ms=window_ms, server_max_batch=server_max_batch,
                                     seed=seed, say=lambda line: console.print(
                                         line, highlight=False))
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    path = profile.save(out)
    partial = profile.meta["endpoint"].get("partial")
    if partial:
        console.print(f"[yellow]interrupted — partial profile[/] ({partial['stopped_by']}): "
                      f"{partial['bursts_done']} of {partial['bursts_planned']} bursts")
    console.print(f"profile: {path}")


def request_server_install(name: str) -> None:
    """``servelab server install ray|kserve``: the server's own virtual environment (once)."""
    from executor.endpoint.kserve_server import ensure_kserve
    from executor.endpoint.rayserve import ensure_ray

    cli = _cli()
    try:
        env = ensure_ray() if name == "ray" else ensure_kserve()
    except cli.USER_ERRORS as exc:
        cli.fail(str(exc))
        return
    cli.console.print(f"{'Ray Serve' if name == 'ray' else 'KServe'} environment: {env.root}")


def request_server_run(name: str, port: int, args: list[str]) -> None:
    """``servelab server run ray|kserve [--arg KEY=VALUE ...]`` until Ctrl-C.

    ``ray``: Ray Serve with the test deployment (default: MiniLM, ``max_batch_size`` 8,
    ``batch_wait_timeout_s`` 0.005; keys as in ``executor/endpoint/ray_app.py``);
    ``kserve``: KServe's model server with MiniLM (default ``max_batch_size`` 8,
    ``window_ms`` 10, ``max_items`` 16; keys as in ``executor/endpoint/kserve_app.py``).
    Values are YAML.
    """
    from executor.endpoint.kserve_server import KServeServer, ensure_kserve
    from executor.endpoint.rayserve import RayServeApp, ensure_ray
    from sim.scenario.schema import cli_value

    cli = _cli()
    config: dict[str, Any] = ({"model": "minilm", "model_name": "minilm", "max_batch_size": 8,
                               "batch_wait_timeout_s": 0.005} if name == "ray" else
                              {"model_name": "minilm", "max_batch_size": 8, "window_ms": 10.0,
                               "max_items": 16})
    for item in args:
        key, sep, value = item.partition("=")
        if not sep or not key:
            cli.fail(f"--arg {item!r}: expected KEY=VALUE, e.g. --arg max_batch_size=16")
        config[key.lstrip("-").replace("-", "_")] = cli_value(value)
    server: RayServeApp | KServeServer
    try:
        if name == "ray":
            server = RayServeApp(ensure_ray(), config, port=port)
            cli.err_console.print("starting Ray Serve (about a minute) …")
        else:
            server = KServeServer(ensure_kserve(), config, port=port)
            cli.err_console.print("starting KServe's model server (about a minute) …")
        server.start()
    except cli.USER_ERRORS as exc:
        cli.fail(str(exc))
        return
    cli.console.print(f"{'Ray Serve' if name == 'ray' else 'KServe'}: "
                      f"{config.get('model', 'minilm')} at {server.url}/v2/models/"
                      f"{config.get('model_name', config.get('model'))}/infer (started in "
                      f"{server.started_s:.0f} s; log {server.log_path}); Ctrl-C stops it")
    from servelab.cli_app import hold_server

    hold_server(server)
    cli.console.print("server stopped")


def compare_requests_cmd(scenario: str, endpoint: str, api: str, profile: Path | None,
                         out: Path, repeats: int, set_: list[str] | None, probe: str,
                         drain_timeout_s: float | None, rhos: list[float],
                         model: str | None, table: Any) -> None:
    """``servelab compare SCENARIO --endpoint URL --api kserve-v2|http-json``."""
    from executor.endpoint.compare_requests import compare_request_endpoint

    cli = _cli()
    fail, USER_ERRORS, console = cli.fail, cli.USER_ERRORS, cli.console  # noqa: N806
    if rhos:
        from executor.endpoint.compare_requests import sweep_request_endpoint
        from servelab.cli_live import REQUEST_FIDELITY_KEYS, _fidelity_table

        try:
            frame = sweep_request_endpoint(scenario, endpoint, out, rhos, api=api,
                                           profile=profile, repeats=repeats,
                                           overrides=set_ or None, model=model,
                                           probe_mode=probe, drain_timeout_s=drain_timeout_s,
                                           progress=lambda m: console.print(f"[dim]{m}[/]"))
        except USER_ERRORS as exc:
            fail(str(exc))
            return
        console.print(_fidelity_table(frame, REQUEST_FIDELITY_KEYS))
        console.print("rho = the replica's utilisation the calibrated profile predicts at "
                      f"the offered rate; one compare.json per point in {out}/rho-R/")
        console.print(f"fidelity curve: {out / 'fidelity.csv'}")
        return
    try:
        data = compare_request_endpoint(scenario, endpoint, out, api=api, profile=profile,
                                        repeats=repeats, overrides=set_ or None, model=model,
                                        probe_mode=probe, drain_timeout_s=drain_timeout_s,
                                        progress=lambda m: console.print(f"[dim]{m}[/]"))
    except USER_ERRORS as exc:
        fail(str(exc))
        return
    console.print(table(data))
    for p in data["probes"]:
        sizes = ", ".join(f"{n}: ×{r:.3f}" for n, r in p["ratio_by_size"].items())
        console.print(f"probe: by batch size {sizes} against the profile (drift "
                      f"{p['drift']:+.1%})")
    console.print(f"comparison: {out / 'compare.json'}\nreport: {out / 'report.html'}")
