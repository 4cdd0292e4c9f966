"""Prompt and output token lengths of LLM requests: from distributions or trace columns.

Outputs are generated to exactly their length (as ``vllm bench serve --ignore-eos`` does), so
the output length is also the request's ``max_tokens``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.scenario.llm import (
    ConstantTokens,
    EmpiricalTokens,
    LlmTraceCfg,
    LognormalTokens,
    UniformTokens,
)
from sim.scenario.workloads import (
    ArrivalSchedule,
    WorkloadError,
    columns_text,
    count_column,
    data_path,
)


def _column(path: str | Path, column: str, field: str) -> np.ndarray:
    """A CSV column of positive integers, or a :class:`WorkloadError` naming ``field``."""
    path = data_path(path, field)
    try:
        frame = pd.read_csv(path, usecols=lambda c: c == column)
    except FileNotFoundError:
        raise WorkloadError(f"{field}: file {str(path)!r} not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{field}: {str(path)!r} is not a readable CSV "
                            f"({str(exc).splitlines()[0]})") from None
    if column not in frame.columns:
        header = pd.read_csv(path, nrows=0).columns
        raise WorkloadError(f"{field}: column {column!r} not in {str(path)!r}; "
                            f"{columns_text(header)}")
    return count_column(frame[column], f"{field}: column {column!r}")


def draw_tokens(spec: Any, n: int, rng: np.random.Generator, field: str) -> np.ndarray:
    """``n`` token lengths (int64, >= 1) from a workload's ``prompt_tokens``/``output_tokens``.

    Args:
        spec: A number or one of the token distributions of the scenario.
        n: How many.
        rng: The token-length stream.
        field: The scenario field, for error messages.
    """
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    if isinstance(spec, ConstantTokens):
        return np.full(n, spec.value, dtype=np.int64)
    if isinstance(spec, UniformTokens):
        return rng.integers(spec.low, spec.high + 1, size=n).astype(np.int64)
    if isinstance(spec, LognormalTokens):
        sigma2 = math.log1p(spec.cv ** 2)
        mu = math.log(spec.mean) - sigma2 / 2
        values = np.maximum(1, np.rint(rng.lognormal(mu, math.sqrt(sigma2), size=n)))
        if spec.max is not None:
            values = np.minimum(values, spec.max)
        return values.astype(np.int64)
    if isinstance(spec, EmpiricalTokens):
        pool = _column(spec.path, spec.column, f"{field}.column")
        if pool.size == 0:
            raise WorkloadError(f"{field}.column: {spec.column!r} has no rows")
        return pool[rng.integers(pool.size, size=n)]
    raise WorkloadError(f"{field}: unsupported token specification {spec!r}")


def request_tokens(workload: Any, schedule: ArrivalSchedule,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_tokens, output_tokens) per arrival: trace columns where given (following the
    schedule's trace rows, truncated to ``prompt_tokens_max``/``output_tokens_max`` when set),
    else draws from the distributions.
    """
    n = len(schedule)
    out: list[np.ndarray] = []
    for name in ("prompt_tokens", "output_tokens"):
        column = getattr(workload, f"{name}_column", None)
        if column is not None:
            assert isinstance(workload, LlmTraceCfg)
            assert schedule.rows is not None
            values = _column(workload.path, column, f"workload.{name}_column")[schedule.rows]
            cap = getattr(workload, f"{name}_max")
            out.append(values if cap is None else np.minimum(values, cap))
        else:
            out.append(draw_tokens(getattr(workload, name), n, rng, f"workload.{name}"))
    return out[0], out[1]
