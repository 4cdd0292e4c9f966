"""The optional compiled build (``servelab compile``, :mod:`sim.native`).

One slow test builds a copy of ``sim/`` with mypyc in a temporary folder and checks what a
user relies on: the compiled modules are really the ones that run, they give the golden
scenarios' tables and summaries exactly (and the summary-only records the same summary), a
changed source makes ``import sim`` fall back to plain Python with a warning, and
``--clean`` leaves plain Python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from sim import native

ROOT = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter whose ``sim`` is the temporary copy (``tests`` from the repo).
CHECK = """
import json, sys, warnings
warnings.simplefilter("always")
import sim
from sim import native
from tests.sim.golden import GOLDEN, SCENARIOS, outputs
want = json.loads(GOLDEN.read_text())
changed = [name for name, cfg in SCENARIOS.items() if outputs(cfg) != want[name]]
cfg = SCENARIOS["fifo-bound-timeout"]
full = sim.run(cfg).summary
lean = sim.run(cfg, records="summary").summary
same = all(full[k] == lean[k] for k in ("ok", "rejected", "timed_out", "completions"))
same = same and full["latency_ms"]["p99"] == lean["latency_ms"]["p99"]
print(json.dumps({"sim": sim.__file__, "compiled": native.compiled_modules(),
                  "changed": changed, "summary_records_same": same}))
"""

PROBE = """
import json, pathlib, tempfile, sim
from sim import native
result = sim.run("builtin:dyn-demo", overrides={"workload.duration_s": 15})
with tempfile.TemporaryDirectory() as tmp:
    meta = json.loads((result.write(pathlib.Path(tmp) / "run") / "meta.json").read_text())
print(json.dumps({"compiled": native.compiled_modules(), "meta": meta["compiled"],
                  "ok": result.summary["ok"]}))
"""


def _python(code: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "SERVELAB_PURE_PYTHON"}
    environ.update(PYTHONPATH=f"{tmp}{os.pathsep}{ROOT}", **env)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp, env=environ,
                          capture_output=True, text=True, check=False, timeout=600)


def _last_json(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="no C compiler")
def test_the_compiled_build_runs_the_golden_scenarios_and_falls_back_when_stale(
        tmp_path: Path) -> None:
    pytest.importorskip("mypyc")
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "native.json")
    for package in ("sim", "calibration"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=ignore)
    build = _python("from sim import native; native.build()", tmp_path)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]

    got = _last_json(_python(CHECK, tmp_path))
    assert Path(str(got["sim"])).parent == tmp_path / "sim"  # the copy, not the repo
    assert got["compiled"] == list(native.MODULES)  # every listed module ran compiled
    assert got["changed"] == []  # tables and summaries exactly as the golden file
    assert got["summary_records_same"]

    pure = _last_json(_python(PROBE, tmp_path, SERVELAB_PURE_PYTHON="1"))
    assert pure["compiled"] == [] and pure["meta"] == []
    compiled = _last_json(_python(PROBE, tmp_path))
    assert compiled["compiled"] == list(native.MODULES) and compiled["ok"] == pure["ok"]
    assert compiled["meta"] == list(native.MODULES)  # the run directory says it ran compiled

    # a source edited after the build: the build is not used, and the user is told
    queues = tmp_path / "sim" / "serving" / "queues.py"
    queues.write_text(queues.read_text() + "\n# edited after the build\n")
    stale = _python(PROBE, tmp_path)
    assert _last_json(stale)["compiled"] == []
    assert "compiled build is older than the source of sim.serving.queues" in stale.stderr

    cleaned = _python("from sim import native; print(len(native.clean()))", tmp_path)
    assert cleaned.returncode == 0 and int(cleaned.stdout.split()[-1]) > len(native.MODULES)
    assert not list((tmp_path / "sim").rglob("*.so"))
    assert _last_json(_python(PROBE, tmp_path))["compiled"] == []


def test_every_listed_module_has_its_source() -> None:
    for module in native.MODULES:
        assert native.source_path(module).is_file(), module


def test_compile_status_names_the_state_of_the_build() -> None:
    result = CliRunner().invoke(app, ["compile", "--status"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    if not native.extension_paths():
        assert "compiled build: none (plain Python)" in text
    elif native.stale_modules():
        assert "stale, not used" in text
    else:
        assert f"current, {len(native.MODULES)} modules" in text


def test_a_run_directory_records_which_modules_ran_compiled(tmp_path: Path) -> None:
    import sim

    result = sim.run("builtin:dyn-demo", overrides={"workload.duration_s": 12})
    result.write(tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["compiled"] == native.compiled_modules()
    assert set(meta["compiled"]) <= set(native.MODULES)
