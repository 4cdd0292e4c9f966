"""``builtin:NAME``: files shipped with servelab, found by one resolver.

Scenarios (``servelab/scenarios/NAME.yaml``), latency and step profiles
(``calibration/profiles/NAME.json``) and data files such as traces (``servelab/data/NAME``)
are all named ``builtin:NAME``. This module imports nothing of servelab, so ``sim`` and
``calibration`` both use it (with :mod:`sim.errors`, the modules every part may import).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

BUILTIN_PREFIX = "builtin:"

SCENARIOS = ("servelab", "scenarios", ".yaml")
PROFILES = ("calibration", "profiles", ".json")
DATA = ("servelab", "data", "")


def builtin_name(ref: str | Path) -> str | None:
    """``NAME`` of a ``builtin:NAME`` reference (None: a path)."""
    text = str(ref)
    return text[len(BUILTIN_PREFIX):] if text.startswith(BUILTIN_PREFIX) else None


def _folder(where: tuple[str, str, str]) -> Traversable:
    package, folder, _ = where
    return resources.files(package) / folder


def shipped(where: tuple[str, str, str], keep: Callable[[str], bool] = lambda name: True
            ) -> list[str]:
    """Names of the shipped files in ``where`` (one of :data:`SCENARIOS`, :data:`PROFILES`,
    :data:`DATA`), sorted; ``keep`` filters them.
    """
    suffix = where[2]
    return sorted(p.name.removesuffix(suffix) for p in _folder(where).iterdir()
                  if p.name.endswith(suffix) and keep(p.name.removesuffix(suffix)))


def shipped_path(where: tuple[str, str, str], name: str) -> Path:
    """Where the shipped file ``name`` lies (it need not exist)."""
    return Path(str(_folder(where) / f"{name}{where[2]}"))


def read_shipped(where: tuple[str, str, str], name: str, names: list[str],
                 unknown: Callable[[str], Exception]) -> str:
    """The text of the shipped file ``name``.

    Raises:
        The exception ``unknown(available)`` builds (``available``: the names, comma
        separated) when ``name`` is not one of ``names``.
    """
    if name not in names:
        raise unknown(", ".join(names))
    return (_folder(where) / f"{name}{where[2]}").read_text()
