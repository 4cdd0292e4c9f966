"""The LLM page's roofline pickers: a model (a shipped config or a ``config.json`` path), a
device sheet and a tensor-parallel size switch the page's step model to ``llm_roofline``
(step times from the model's shape, the device's datasheet and the fitted coefficients), and
the KV cache to the size vLLM would give it on that device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import streamlit as st

from dashboard.i18n import t
from sim.errors import UserError
from sim.scenario.roofline.hardware import builtin_devices, kv_cache_blocks, load_device
from sim.scenario.roofline.model import load_coefficients
from sim.scenario.roofline.service import builtin_models, load_shape

ROOFLINE = "Roofline: a model on a device (llm_roofline)"
OWN_CONFIG = "a config.json path…"
TP_SIZES = (1, 2, 4, 8)


def roofline_service(key: str = "llm-rl") -> dict[str, Any] | None:
    """Render the model, device and TP pickers; the ``llm_roofline`` service they make, or
    None (with the reason shown) when the model or the device cannot be used.
    """
    models = [f"builtin:{name}" for name in builtin_models()]
    choice = st.selectbox(t("model"), [*models, OWN_CONFIG], key=f"{key}-model",
                          index=models.index("builtin:llama-3.1-8b")
                          if "builtin:llama-3.1-8b" in models else 0)
    model = st.text_input(t("config.json (path or folder)"), key=f"{key}-path") \
        if choice == OWN_CONFIG else choice
    devices = builtin_devices()
    device = st.selectbox(t("device"), devices, key=f"{key}-device",
                          index=devices.index("h100-sxm") if "h100-sxm" in devices else 0)
    if not model:
        st.info(t("Give the path of a Hugging Face config.json."))
        return None
    try:
        shape, sheet = load_shape(model), load_device(device)
    except UserError as exc:
        st.error(str(exc))
        return None
    sizes = [n for n in TP_SIZES if shape.heads % n == 0 and (
        shape.kv_heads < n or shape.kv_heads % n == 0)]
    tp = st.selectbox(t("tensor parallel (GPUs)"), sizes, key=f"{key}-tp")
    service = {"kind": "llm_roofline", "model": model, "device": device, "tp": int(tp)}
    try:
        blocks = kv_cache_blocks(shape, sheet, int(tp), 16)
    except UserError as exc:
        st.error(str(exc))
        return None
    coeffs = load_coefficients("builtin", sheet.kind)
    st.caption(t("{model}: {params:.1f} B parameters on {tp} × {device}; coefficients "
                 "{coeffs}; KV cache {blocks} blocks of 16 tokens, as vLLM sizes it").format(
        model=shape.name, params=shape.params() / 1e9, tp=tp, device=sheet.name,
        coeffs=coeffs.name, blocks=f"{blocks:,}"))
    return service


def roofline_policy(service: Mapping[str, object] | None, policy: dict[str, Any]
                    ) -> dict[str, Any]:
    """A KV policy for a roofline service loses the page's ``num_gpu_blocks``: the scenario
    loader sizes the cache from the device's memory, as vLLM does.
    """
    if service is None or service.get("kind") != "llm_roofline" or \
            policy.get("kind") == "static":
        return policy
    return {k: v for k, v in policy.items() if k != "num_gpu_blocks"}
