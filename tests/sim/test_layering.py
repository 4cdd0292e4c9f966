"""The dependency rules of the design: sim works without torch; policies stay pure."""

from __future__ import annotations

import subprocess
import sys


def test_import_sim_and_simulate_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
            "import sim, servelab\n"
            "r = sim.run('builtin:dyn-demo', overrides={'workload.duration_s': 5, 'warmup_s': 0})\n"
            "assert r.summary['ok'] > 0\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
