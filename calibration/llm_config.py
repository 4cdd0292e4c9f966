"""A decoder shape from a Hugging Face ``config.json`` (Llama, Qwen2, Mistral and the like).

``servelab calibrate --model llm --config config.json`` measures a decoder of that shape with
random weights (latency does not depend on weight values): layers, width, query and KV heads,
MLP width and vocabulary come from the config; the KV cache's slots and length from the
named base shape (they bound the measured grid, not the model). No torch import here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.errors import UserError

# decoder field -> the config keys that may hold it, first found wins
FIELDS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "intermediate": ("intermediate_size", "ffn_dim"),
    "vocab": ("vocab_size",),
}


def _config_dict(path: Path) -> dict[str, Any]:
    """The config of a ``config.json`` file, or of a directory holding one (a text model's
    config may sit under ``text_config``).
    """
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"--config {path}: no such file (give a config.json or a model "
                        "directory holding one)")
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--config {path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: must hold a JSON object")
    text = data.get("text_config")
    return {**data, **text} if isinstance(text, dict) else data


def decoder_sizes(path: str | Path) -> tuple[dict[str, int], str]:
    """Decoder sizes (``layers, hidden, heads, kv_heads, intermediate, vocab``) from a
    config, and an honest label for the shape, e.g. ``qwen2 config (24 layers, hidden 896,
    14/2 heads)``.

    Raises:
        UserError: a missing or bad file, or a size it does not give (named, with the keys
            looked for).
    """
    data = _config_dict(Path(path))
    sizes: dict[str, int] = {}
    for name, keys in FIELDS.items():
        value = next((data[k] for k in keys if data.get(k) is not None), None)
        if value is None and name == "kv_heads":
            value = sizes.get("heads")  # multi-head attention: as many KV heads as heads
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"--config {path}: {name} needs a positive integer in one of "
                            f"{', '.join(keys)} (found {value!r})")
        sizes[name] = value
    head_dim = data.get("head_dim")
    if isinstance(head_dim, int) and head_dim * sizes["heads"] != sizes["hidden"]:
        raise UserError(f"--config {path}: head_dim {head_dim} × heads {sizes['heads']} != "
                        f"hidden_size {sizes['hidden']}; servelab's decoder derives the head "
                        "width from hidden_size / num_attention_heads")
    kind = str(data.get("model_type") or "decoder")
    label = (f"{kind} config ({sizes['layers']} layers, hidden {sizes['hidden']}, "
             f"{sizes['heads']}/{sizes['kv_heads']} heads)")
    return sizes, label
