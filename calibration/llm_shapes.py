"""The decoder's shape (:class:`DecoderConfig`) and the named shapes, without torch: the
live run's memory check (:mod:`executor.live_budget`) sizes a decoder from them before torch
is imported or anything is built. :mod:`calibration.llm_decoder` builds the decoder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class DecoderConfig:
    """Shape of the decoder (a reduced Llama/Qwen3-like ratio by default).

    Attributes:
        hidden: Model width.
        layers: Decoder layers.
        heads: Query heads.
        kv_heads: Key/value heads (grouped-query attention: ``heads`` divisible by it).
        intermediate: MLP width (SwiGLU).
        vocab: Vocabulary size.
        max_slots: Sequences the KV cache holds at once.
        max_len: Tokens per sequence the KV cache holds.
    """

    hidden: int = 512
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    intermediate: int = 1536
    vocab: int = 8192
    max_slots: int = 64
    max_len: int = 2048

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes per token: 2 × layers × kv_heads × head_dim × dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def check(self) -> DecoderConfig:
        """Validate the shape; raise ValueError naming the parameter."""
        for name, value in asdict(self).items():
            # NaN raised ValueError and inf OverflowError from int() here, a text TypeError
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or int(value) != value or value < 1:
                raise ValueError(f"--param {name}={value}: must be an integer >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"--param hidden={self.hidden}: must be divisible by heads "
                             f"({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"--param heads={self.heads}: must be divisible by kv_heads "
                             f"({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"--param hidden/heads = {self.head_dim}: the head width must "
                             "be even (rotary embeddings)")
        return self


SHAPES: dict[str, DecoderConfig] = {
    # CPU: a reduced Qwen3-0.6B-like ratio (GQA 2:1, MLP 3x hidden)
    "small": DecoderConfig(),
    # CUDA, bf16: Llama-3.2-1B-like and Llama-3.1-8B-like
    "1b": DecoderConfig(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192,
                        vocab=32000, max_slots=128, max_len=4096),
    "8b": DecoderConfig(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                        vocab=32000, max_slots=64, max_len=4096),
}


def config_for(params: Mapping[str, Any] | None) -> DecoderConfig:
    """The shape ``model.params`` asks for: the named ``shape`` (default ``small``) with the
    :class:`DecoderConfig` fields it gives, checked, each an int. The one reading of them:
    the live run's memory check sizes the decoder that
    :func:`executor.llm_driver.decoder_for` builds (``hidden: 64.5`` was built as 64 and
    priced as 64.5; NaN was priced as NaN bytes).

    Raises:
        ValueError: an unknown shape, or a field that :meth:`DecoderConfig.check` refuses.
    """
    given = dict(params or {})
    shape = str(given.pop("shape", "small"))
    if shape not in SHAPES:
        raise ValueError(f"model.params.shape {shape!r}: allowed: {', '.join(SHAPES)}")
    fields = {k: v for k, v in given.items() if k in DecoderConfig.__dataclass_fields__}
    cfg = replace(SHAPES[shape], **fields).check()
    return replace(cfg, **{k: int(v) for k, v in asdict(cfg).items()})
