"""The scenario's ``payload:`` section: what a request sends to a real server.

The simulator ignores it; ``servelab bench`` and ``calibrate --endpoint`` build each request's
body from it:

* ``--api kserve-v2`` (the Open Inference Protocol of KServe, Triton, MLServer):
  ``POST /v2/models/{model}/infer`` with one tensor per ``inputs`` entry (``name``,
  ``datatype``, ``shape``); a ``-1`` in a shape is the request's ``size`` (its items, the
  batch dimension), ``BYTES`` tensors carry sentences from servelab's corpus, numeric ones
  seeded random numbers;
* ``--api http-json``: ``POST {path}`` with ``body``, a JSON template in which the strings
  ``$size`` (the request's items), ``$id`` (its id), ``$text`` (one sentence) and ``$texts``
  (``size`` sentences) are replaced per request.

Example::

    payload:
      model: minilm
      inputs: [{name: input, datatype: BYTES, shape: [-1]}]
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES")
PLACEHOLDERS = ("$size", "$id", "$text", "$texts")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorCfg(_Strict):
    """One input tensor of a KServe v2 request."""

    name: str = Field(min_length=1)
    datatype: Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                      "INT64", "FP16", "FP32", "FP64", "BYTES"] = "BYTES"
    shape: list[int] = Field(default_factory=lambda: [-1], min_length=1)

    @model_validator(mode="after")
    def _shape(self) -> TensorCfg:
        if any(d < -1 or d == 0 for d in self.shape) or self.shape.count(-1) > 1:
            raise ValueError(f"payload.inputs.shape: {self.shape}: positive sizes, with at "
                             "most one -1 (the request's size)")
        return self


class PayloadCfg(_Strict):
    """What each request sends (see the module docstring)."""

    model: str | None = None
    inputs: list[TensorCfg] = Field(default_factory=lambda: [TensorCfg(name="input")],
                                    min_length=1)
    path: str = "/predict"
    body: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _path(self) -> PayloadCfg:
        if not self.path.startswith("/"):
            raise ValueError(f"payload.path: {self.path!r} must start with '/'")
        return self
