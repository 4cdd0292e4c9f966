"""The CLI a newcomer meets: init, --version, help on every option, CSV tables, replicas --out,
profile show for every builtin that ``scenarios`` lists, one workload bound.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import typer.main
import yaml
from typer.testing import CliRunner

import sim
from servelab import __version__
from servelab.cli import app
from servelab.starter import KINDS
from sim.scenario.schema import builtin_scenarios

RUNNER = CliRunner()


def commands() -> list[tuple[str, Any]]:
    """Every command (groups included) of the CLI, by its words."""
    root = typer.main.get_command(app)
    found: list[tuple[str, Any]] = [("servelab", root)]
    for name, sub in root.commands.items():  # type: ignore[attr-defined]
        found.append((name, sub))
        found += [(f"{name} {n}", c) for n, c in getattr(sub, "commands", {}).items()]
    assert len(found) > 12
    return found


def test_every_option_of_every_command_has_help() -> None:
    missing = [f"{name} {p.name}" for name, cmd in commands() for p in cmd.params
               if not getattr(p, "help", None)]
    assert not missing
    assert all(cmd.help for _, cmd in commands())


def test_version() -> None:
    done = RUNNER.invoke(app, ["--version"])
    assert done.exit_code == 0 and done.output.strip() == f"servelab {__version__}"


@pytest.mark.parametrize("kind", KINDS)
def test_init_writes_a_commented_starter_that_runs_stably(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.yaml"
    done = RUNNER.invoke(app, ["init", "--kind", kind, str(path)])
    assert done.exit_code == 0, done.output
    text = path.read_text()
    assert text.count("#") > 10  # commented for a newcomer
    result = sim.llm.run_any(str(path)) if kind == "llm" else sim.run(str(path))
    assert result.summary["stability"]["verdict"] == "stable"
    again = RUNNER.invoke(app, ["init", "--kind", kind, str(path)])
    assert again.exit_code == 2 and "already exists" in again.output
    bad = RUNNER.invoke(app, ["init", "--kind", "batch", str(tmp_path / "x.yaml")])
    assert bad.exit_code == 2 and "allowed: request, llm, autoscaling" in bad.output


def test_a_workload_has_one_bound_and_set_replaces_it(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump({"workload": {"kind": "poisson", "rate_rps": 50,
                                                 "duration_s": 20, "n_requests": 100},
                                    "policy": {"kind": "greedy"}}))
    done = RUNNER.invoke(app, ["simulate", str(both)])
    assert done.exit_code == 2
    line = done.output.strip()
    assert "\n" not in line and "duration_s" in line and "n_requests" in line
    # --set n_requests on a scenario bounded by duration_s replaces the bound
    result = sim.run("builtin:dyn-demo", overrides=["workload.n_requests=3000",
                                                   "warmup_s=1"])
    assert result.scenario.workload.duration_s is None  # type: ignore[union-attr]
    assert len(result.requests) == 3000


def test_simulate_writes_csv_tables(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = RUNNER.invoke(app, ["simulate", "builtin:dyn-demo", "--out", str(out), "--format",
                               "csv", "-q", "--set", "workload.duration_s=30"])
    assert done.exit_code == 0, done.output
    assert not list(out.glob("*.parquet"))
    requests = pd.read_csv(out / "requests.csv")
    parquet = tmp_path / "parquet"
    RUNNER.invoke(app, ["simulate", "builtin:dyn-demo", "--out", str(parquet), "-q", "--set",
                        "workload.duration_s=30"])
    same = pd.read_parquet(parquet / "requests.parquet")
    assert list(requests.columns) == list(same.columns) and len(requests) == len(same) > 1000
    assert (requests["id"].to_numpy() == same["id"].to_numpy()).all()
    assert (requests["finish_s"] - same["finish_s"]).abs().max() < 1e-12  # full precision
    assert list(requests["status"]) == [str(v) for v in same["status"]]
    bad = RUNNER.invoke(app, ["simulate", "builtin:dyn-demo", "--format", "xlsx"])
    assert bad.exit_code == 2 and "allowed: parquet, csv" in bad.output


def test_profile_show_knows_every_builtin_that_scenarios_lists() -> None:
    listed = RUNNER.invoke(app, ["scenarios"]).output
    profiles = [name for line in listed.splitlines() if "profiles" in line
                for name in re.findall(r"builtin:[\w-]+", line)]
    assert "builtin:llm-small-cpu" in profiles and "builtin:minilm-cpu" in profiles
    for name in profiles:
        done = RUNNER.invoke(app, ["profile", "show", name], terminal_width=80)
        assert done.exit_code == 0, (name, done.output)
        assert "…" not in done.output, (name, done.output)  # no number is cut off


def test_profile_show_of_a_scenario_name_says_it_is_a_scenario() -> None:
    for name in [f"builtin:{n}" for n in builtin_scenarios()] + ["builtin:nope"]:
        done = RUNNER.invoke(app, ["profile", "show", name], terminal_width=300)
        assert done.exit_code != 0, (name, done.output)
        line = done.output.strip()
        assert "\n" not in line and "Traceback" not in line, line
        assert "builtin:llm-small-cpu" in line and "builtin:minilm-cpu" in line, line
        if name != "builtin:nope":
            assert "is a scenario" in line and f"servelab simulate {name}" in line, line


def test_replicas_writes_its_answer(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    done = RUNNER.invoke(app, ["replicas", "builtin:dyn-demo", "--target-rps", "60", "--slo",
                               "p99_ms=300", "--seeds", "1", "--workers", "1", "--set",
                               "workload.duration_s=20", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "candidate 1: replicas=1" in done.output  # progress while it searches
    answer = json.loads((out / "replicas.json").read_text())
    runs = pd.read_parquet(out / "runs.parquet")
    assert answer["replicas"] >= 1 and set(runs["replicas"]) == {
        int(n) for n in answer["tried"]}
