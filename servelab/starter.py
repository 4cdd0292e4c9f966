"""``servelab init``: write a commented starter scenario that runs stably as is."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from sim.errors import UserError

KINDS = ("request", "llm", "autoscaling")
DEFAULT_FILES = {"request": "my.yaml", "llm": "my-llm.yaml", "autoscaling": "my-autoscaling.yaml"}


def starter_text(kind: str) -> str:
    """The commented starter scenario of ``kind`` (request, llm or autoscaling).

    Raises:
        UserError: an unknown kind (naming the allowed ones).
    """
    if kind not in KINDS:
        raise UserError(f"--kind {kind!r}: allowed: {', '.join(KINDS)}")
    return (resources.files("servelab") / "starters" / f"{kind}.yaml").read_text()


def write_starter(kind: str, path: Path | None, *, force: bool = False) -> Path:
    """Write the starter scenario of ``kind`` to ``path`` (default ``my.yaml`` and the like).

    Raises:
        UserError: an unknown kind, or ``path`` exists and ``force`` is not set.
    """
    text = starter_text(kind)
    target = Path(DEFAULT_FILES[kind]) if path is None else path
    if target.exists() and not force:
        raise UserError(f"{target}: already exists; choose another FILE or add --force")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target
