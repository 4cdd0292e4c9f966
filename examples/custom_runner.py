"""Bring your own model: a runner factory for ``servelab calibrate --model examples.custom_runner:make_runner``.

A runner is any object with ``name``, ``device``, ``payloads(n, rng)``, ``run_batch(payloads)``
and ``describe()`` (see ``calibration.model_runners.ModelRunner``). ``run_batch`` must do the whole
served path — collation, forward pass, device synchronisation — because that is what is timed
and what the live executor will call. Raise ``InfeasibleBatch`` when a batch does not fit.

Run: ``servelab calibrate --model examples.custom_runner:make_runner --param hidden=64
--batch-sizes 1-8 --reps 5 --out /tmp/custom.json``
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from calibration.model_runners import (
    InfeasibleBatch,
    environment,
    is_oom,
    resolve_device,
    set_threads,
)


class TinyGRURunner:
    """A one-layer GRU over random token-embedding sequences of varied length."""

    name = "tiny-gru"

    def __init__(self, device: str = "auto", dtype: str = "fp32", threads: int | None = None,
                 compile: bool = False, hidden: int = 128, max_len: int = 32) -> None:
        import torch

        self.torch = torch
        self.device = resolve_device(device)
        set_threads(threads)
        self.dtype = dtype
        torch.manual_seed(0)
        self.model = torch.nn.GRU(hidden, hidden, batch_first=True).to(self.device).eval()
        self.hidden, self.max_len = hidden, max_len

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        lengths = rng.integers(4, self.max_len + 1, size=n)
        return [rng.standard_normal((int(k), self.hidden), dtype=np.float32) for k in lengths]

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        torch = self.torch
        try:
            with torch.inference_mode():
                seqs = [torch.from_numpy(p) for p in payloads]
                x = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True).to(self.device)
                out, _ = self.model(x)
            if self.device.startswith("cuda"):
                torch.cuda.synchronize(self.device)
            return out[:, -1]
        except Exception as exc:
            if is_oom(exc):
                raise InfeasibleBatch(str(exc)) from None
            raise

    def describe(self) -> dict[str, Any]:
        return {"model": {"name": self.name, "hidden": self.hidden, "max_len": self.max_len},
                **environment(self.device, self.dtype)}


def make_runner(**kwargs: Any) -> TinyGRURunner:
    """The factory servelab calls with device=, dtype=, threads=, compile= and --param values."""
    return TinyGRURunner(**kwargs)
