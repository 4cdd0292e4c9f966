"""The dependency rules of the design: sim works without torch; the serving core loads
neither simpy nor torch; the role folders import one way, as the README's Architecture
section draws them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


def test_import_sim_and_simulate_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
            "import sim, servelab\n"
            "r = sim.run('builtin:dyn-demo', overrides={'workload.duration_s': 5, 'warmup_s': 0})\n"
            "assert r.summary['ok'] > 0\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sim", "calibration", "executor", "dashboard", "servelab")
ROLES = ("serving", "scenario", "metrics", "drivers", "experiments")

# The arrows between the role folders (README, "Architecture"): each role may import only
# the roles listed, and the graph they make has no circle.
ALLOWED = {
    "sim.base": set(),  # sim/errors.py, sim/builtin.py, sim/native.py
    "calibration": {"sim.base"},
    "sim.serving": {"sim.base"},
    "sim.scenario": {"sim.serving", "calibration", "sim.base"},
    "sim.metrics": {"sim.scenario", "sim.serving", "sim.base"},
    "sim.drivers": {"sim.metrics", "sim.scenario", "sim.serving", "calibration", "sim.base"},
    "sim": {"sim.drivers", "sim.metrics", "sim.scenario", "sim.serving", "sim.base"},
    "sim.experiments": {"sim", "sim.drivers", "sim.metrics", "sim.scenario", "sim.serving",
                        "calibration", "sim.base"},
    "executor": {"sim", "sim.drivers", "sim.experiments", "sim.metrics", "sim.scenario",
                 "sim.serving", "calibration", "sim.base"},
    "dashboard": {"sim", "sim.drivers", "sim.experiments", "sim.metrics", "sim.scenario",
                  "sim.serving", "calibration", "sim.base", "executor"},
    "servelab": {"sim", "sim.drivers", "sim.experiments", "sim.metrics", "sim.scenario",
                 "sim.serving", "calibration", "sim.base", "executor", "dashboard"},
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _role(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "sim":
        return parts[0]
    if module in ("sim", "sim.llm"):  # the public API: sim.run, sim.llm.run, ...
        return "sim"
    return f"sim.{parts[1]}" if parts[1] in ROLES else "sim.base"


def _imports() -> dict[tuple[str, str], str]:
    """(importing role, imported role) -> one example, over every import in the packages
    (function-level ones included)."""
    modules = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    found: dict[tuple[str, str], str] = {}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                           else node.module for a in node.names]
            for target in targets:
                if target.split(".")[0] not in PACKAGES:
                    continue
                while target not in modules:
                    target = target.rsplit(".", 1)[0]
                edge = (_role(name), _role(target))
                if edge[0] != edge[1]:
                    found.setdefault(edge, f"{name} imports {target}")
    return found


def test_the_role_folders_import_one_way_as_documented() -> None:
    edges = _imports()
    wrong = [f"{a} -> {b} ({why})" for (a, b), why in edges.items() if b not in ALLOWED[a]]
    assert not wrong, "imports against the documented arrows:\n" + "\n".join(wrong)
    # and no circle: peel off roles that import no remaining role
    left = {a for a, _ in edges} | {b for _, b in edges}
    while left:
        leaves = {r for r in left if not any(a == r and b in left for a, b in edges)}
        assert leaves, f"import circle among {sorted(left)}"
        left -= leaves


def test_the_arrows_are_what_the_code_does() -> None:
    # the table above is not looser than needed where it matters: the serving core and
    # calibration import nothing but the shared base
    edges = _imports()
    assert {b for a, b in edges if a == "sim.serving"} == {"sim.base"}
    assert {b for a, b in edges if a == "calibration"} == {"sim.base"}


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_importing_the_serving_core_loads_neither_simpy_nor_torch() -> None:
    modules = sorted(_module(p) for p in (ROOT / "sim" / "serving").rglob("*.py"))
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in modules)
            + "loaded = [m for m in ('simpy', 'torch') if m in sys.modules]\n"
              "assert not loaded, loaded\n")
    proc = _fresh(code)
    assert proc.returncode == 0, proc.stderr
    assert len(modules) >= 15  # the core, the policies and the LLM core were all imported


def test_the_live_drivers_do_not_load_simpy() -> None:
    proc = _fresh("import sys\n"
                  "import executor.live_requests, executor.live_llm, executor.lifecycle\n"
                  "assert 'simpy' not in sys.modules\n")
    assert proc.returncode == 0, proc.stderr
