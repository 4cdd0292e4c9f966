"""The optional compiled build of the simulator's hot path (mypyc), and its pure-Python fallback.

``servelab compile`` runs mypyc over :data:`MODULES` (the serving core, queues, admission,
dispatch, records, the SimPy driver and the built-in policies) and puts one extension module
next to each source file; Python then imports the extension instead of the ``.py``. Nothing
else changes: the same source is the only logic, and the compiled run gives the same output
for the same seed (``tests/sim/test_native.py`` checks the golden scenarios against it).

Without a build, or after ``servelab compile --clean``, everything runs as plain Python. A
build whose sources changed since it was made is never used: :func:`guard` (called by
``import sim`` before anything else) sees the changed source, loads every listed module from
its ``.py`` instead and warns once. Run directories record which modules ran compiled
(``meta.json``: ``compiled``).

This module stays interpreted; it imports nothing of the simulator.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

MODULES = (
    "sim.serving.core", "sim.serving.dispatch", "sim.serving.queues", "sim.serving.admission",
    "sim.serving.records", "sim.serving.sources", "sim.serving.routing", "sim.serving.fleet",
    "sim.serving.invariants", "sim.serving.policies.simple", "sim.serving.policies.dynamic",
    "sim.serving.policies.adaptive", "sim.serving.policies.slo",
    "sim.drivers.engine", "sim.metrics.summary_sink",
)
"""The modules the compiled build covers (each must compile under mypyc)."""

GROUP = "sim.compiled"  # mypyc's shared library: sim/compiled__mypyc.<suffix>
ROOT = Path(__file__).resolve().parent.parent  # the folder that holds sim/
MANIFEST = Path(__file__).with_name("native.json")  # sources' digests at build time

_MYPY_CONFIG = """[mypy]
python_version = {python}
ignore_missing_imports = True
follow_imports = silent
"""


class BuildError(RuntimeError):
    """The compiled build could not be made (no mypyc, no C compiler, a compile error)."""


def source_path(module: str) -> Path:
    """The ``.py`` file of one of :data:`MODULES`."""
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extension_paths() -> list[Path]:
    """The compiled files present now (the modules' extensions and the shared library)."""
    found: list[Path] = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for module in (*MODULES, GROUP + "__mypyc"):
            path = ROOT.joinpath(*module.split("."))
            candidate = path.with_name(path.name + suffix)
            if candidate.exists():
                found.append(candidate)
    return found


def stale_modules() -> list[str]:
    """Modules whose source changed since the build (all of them when the build has no
    manifest, or one made by another Python); empty when there is no build.
    """
    if not extension_paths():
        return []
    try:
        manifest = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return list(MODULES)
    if manifest.get("python") != sys.version.split()[0]:
        return list(MODULES)
    digests = manifest.get("sources", {})
    return [m for m in MODULES if digests.get(m) != _digest(source_path(m))]


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Loads the listed modules from their ``.py`` files even where an extension exists."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        source = source_path(fullname)
        loader = importlib.machinery.SourceFileLoader(fullname, str(source))
        return importlib.util.spec_from_file_location(fullname, source, loader=loader)


_GUARDED = False


def guard() -> None:
    """Use the compiled build only when it matches the sources; otherwise load every listed
    module from source and warn once (``servelab compile`` rebuilds, ``--clean`` removes it).
    Also honours ``SERVELAB_PURE_PYTHON=1``, which runs plain Python with a build present.
    """
    global _GUARDED
    if _GUARDED:
        return
    _GUARDED = True
    if not extension_paths():
        return
    pure = os.environ.get("SERVELAB_PURE_PYTHON", "") not in ("", "0")
    stale = [] if pure else stale_modules()
    if pure or stale:
        sys.meta_path.insert(0, _SourceFirst())
    if stale:
        warnings.warn(f"servelab: the compiled build is older than the source of "
                      f"{', '.join(stale)}; running plain Python (rebuild with "
                      "`servelab compile`, or remove it with `servelab compile --clean`)",
                      RuntimeWarning, stacklevel=2)


def compiled_modules() -> list[str]:
    """The listed modules that are loaded from a compiled extension in this process."""
    out = []
    for name in MODULES:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) or ""
        if origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            out.append(name)
    return out


def clean() -> list[Path]:
    """Remove the compiled build; return what was removed."""
    removed = extension_paths()
    for path in removed:
        path.unlink()
    if MANIFEST.exists():
        MANIFEST.unlink()
        removed.append(MANIFEST)
    return removed


_BUILD_SCRIPT = """
import sys
from setuptools import setup
from mypyc.build import mypycify
build, config, group, *paths = sys.argv[1:]
setup(name="servelab-compiled", script_args=["build_ext", "--inplace", "--build-temp",
      build + "/temp", "--build-lib", build + "/lib"],
      ext_modules=mypycify(["--config-file", config, *paths], group_name=group,
                           target_dir=build + "/c"))
"""


def build(*, verbose: bool = False) -> list[Path]:
    """Compile :data:`MODULES` in place with mypyc; return the extension files.

    Raises:
        BuildError: mypyc or a C compiler is missing, or the compile failed (its output is
            in the message).
    """
    if importlib.util.find_spec("mypyc") is None:
        raise BuildError("servelab compile needs mypyc, which comes with mypy: "
                         "pip install mypy (or the dev extra: pip install -e '.[dev]')")
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        raise BuildError("servelab compile needs a C compiler (cc or gcc) on PATH")
    clean()
    with tempfile.TemporaryDirectory(prefix="servelab-compile-") as tmp:
        config = Path(tmp) / "mypy.ini"
        config.write_text(_MYPY_CONFIG.format(python=f"{sys.version_info[0]}."
                                                     f"{sys.version_info[1]}"))
        paths = [str(source_path(m).relative_to(ROOT)) for m in MODULES]
        proc = subprocess.run([sys.executable, "-c", _BUILD_SCRIPT, tmp, str(config), GROUP,
                               *paths], cwd=ROOT, capture_output=not verbose, text=True,
                              check=False)
        if proc.returncode != 0:
            clean()
            output = (proc.stdout or "") + (proc.stderr or "")
            raise BuildError("mypyc failed; nothing was installed:\n" + output[-4000:])
    MANIFEST.write_text(json.dumps({
        "python": sys.version.split()[0],
        "sources": {m: _digest(source_path(m)) for m in MODULES},
    }, indent=2) + "\n")
    return extension_paths()
