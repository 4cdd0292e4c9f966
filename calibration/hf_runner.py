"""``--model hf:DIR_OR_CONFIG``: a Hugging Face encoder or decoder as a batched model runner.

``DIR_OR_CONFIG`` is a local model directory (``config.json``, optionally weights and a
tokenizer) or a ``config.json`` file. With no weights the model is built from the config with
random weights (seeded): latency does not depend on weight values, so nothing needs to be
downloaded. Nothing is fetched from the network (offline, local files only).

* An **encoder** (BERT, RoBERTa, MiniLM, ...) runs one forward pass and mean-pools, as the
  ``minilm`` runner does.
* A **decoder** (``architectures`` ending in ``ForCausalLM``, or ``is_decoder``) runs greedy
  generation of ``new_tokens`` tokens (default 16) for the batch, left-padded: one request is
  one prompt and its completion.

Payloads are sentences from the bundled corpus, tokenised inside ``run_batch`` (so the
measured time includes tokenisation, as served) when the directory has a tokenizer; without
one, token ids drawn at random with the corpus's lengths (about 1.3 tokens per word).

Needs ``transformers`` (the ``hf`` extra: ``pip install 'servelab[hf]'``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calibration.model_runners import RunnerError, _TorchRunner, load_corpus

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
TOKENS_PER_WORD = 1.3


def read_config(spec: str) -> tuple[dict[str, Any], Path | None]:
    """The config dict of ``hf:SPEC`` and the model directory (None for a bare config file).

    Raises:
        RunnerError: no such file or directory, no config.json, bad JSON, no model_type.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        folder: Path | None = path
        config_path = path / "config.json"
    elif path.is_file():
        folder, config_path = None, path
    else:
        raise RunnerError(f"--model hf:{spec}: no such directory or config.json file")
    if not config_path.is_file():
        raise RunnerError(f"--model hf:{spec}: the directory has no config.json")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise RunnerError(f"--model hf:{spec}: {config_path} is not valid JSON ({exc})") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise RunnerError(f"--model hf:{spec}: {config_path} has no model_type (a Hugging "
                          "Face config.json names one, e.g. bert, llama, qwen2)")
    return config, folder


def is_decoder(config: dict[str, Any]) -> bool:
    """Whether the config describes a causal language model (generates tokens)."""
    archs = config.get("architectures") or []
    return bool(config.get("is_decoder")) or any(str(a).endswith("ForCausalLM") for a in archs)


class HfRunner(_TorchRunner):
    """A Hugging Face encoder (forward + mean pool) or decoder (greedy generation)."""

    name = "hf"

    def __init__(self, spec: str, device: str = "auto", dtype: str = "fp32",
                 threads: int | None = None, compile: bool = False, max_length: int = 128,
                 new_tokens: int = 16, seed: int = 0) -> None:
        super().__init__(device, dtype, threads, compile)
        for key, value in (("max_length", max_length), ("new_tokens", new_tokens)):
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or int(value) != value or value < 1):
                raise RunnerError(f"--param {key}={value}: must be an integer >= 1")
        max_length, new_tokens = int(max_length), int(new_tokens)  # 1e3 reads as 1000.0
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import transformers
        except ImportError:
            raise RunnerError("--model hf:...: needs the package transformers "
                              "(pip install 'servelab[hf]')") from None
        config_dict, folder = read_config(spec)
        self.decoder = is_decoder(config_dict)
        auto = transformers.AutoModelForCausalLM if self.decoder else transformers.AutoModel
        weights = folder is not None and any((folder / f).is_file() for f in WEIGHT_FILES)
        try:
            config = transformers.AutoConfig.for_model(**config_dict)
            if weights:
                model = auto.from_pretrained(str(folder), local_files_only=True)
            else:
                self._torch.manual_seed(seed)
                model = auto.from_config(config)  # type: ignore[no-untyped-call]
        except (ValueError, KeyError, OSError, TypeError) as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise RunnerError(f"--model hf:{spec}: transformers cannot build it ({text})") \
                from None
        self.tokenizer = None
        if folder is not None and any((folder / f).is_file() for f in (
                "tokenizer.json", "tokenizer_config.json", "vocab.txt")):
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(folder), local_files_only=True)
        self.model = self._finish_model(model)
        self.vocab = int(config_dict.get("vocab_size") or 1000)
        self.pad_id = int(self._pad_id(config_dict))
        self.max_length = int(max_length)
        self.new_tokens = int(new_tokens)
        self.corpus = load_corpus()
        self.params = {"max_length": self.max_length, "new_tokens": self.new_tokens,
                       "seed": seed}
        self.info = {"source": f"hf:{spec}", "model_type": config_dict["model_type"],
                     "kind": "decoder" if self.decoder else "encoder",
                     "weights": "loaded" if weights else "random (from config.json)",
                     "tokenizer": self.tokenizer is not None,
                     "parameters": int(sum(p.numel() for p in model.parameters()))}
        self.spec = spec

    def _pad_id(self, config: dict[str, Any]) -> int:
        if self.tokenizer is not None and self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
            value = config.get(key)
            if isinstance(value, list) and value:
                value = value[0]
            if isinstance(value, int):
                return value
        return 0

    def describe(self) -> dict[str, Any]:
        """Name, parameters (``spec`` included, so the live executor rebuilds the same
        model) and environment.
        """
        described = super().describe()
        described["model"]["name"] = f"hf:{self.spec}"
        return described

    def payloads(self, n: int, rng: np.random.Generator) -> list[Any]:
        """``n`` sentences (with a tokenizer) or token-id lists of the corpus's lengths."""
        sentences = [self.corpus[int(i)] for i in rng.integers(len(self.corpus), size=n)]
        if self.tokenizer is not None:
            return sentences
        out: list[Any] = []
        for text in sentences:
            length = min(self.max_length, max(1, round(len(text.split()) * TOKENS_PER_WORD)))
            out.append(rng.integers(min(5, self.vocab - 1), self.vocab, size=length).tolist())
        return out

    def _collate(self, payloads: Sequence[Any]) -> dict[str, Any]:
        torch = self._torch
        side = "left" if self.decoder else "right"  # generation continues at the right edge
        if self.tokenizer is not None:
            self.tokenizer.padding_side = side
            if self.tokenizer.pad_token_id is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token
            enc = self.tokenizer(list(payloads), padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt")
            return {k: v.to(self.device) for k, v in enc.items()}
        width = max(len(p) for p in payloads)
        ids = torch.full((len(payloads), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(payloads), width), dtype=torch.long)
        for row, seq in enumerate(payloads):
            span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
            ids[row, span] = torch.tensor(seq, dtype=torch.long)
            mask[row, span] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def run_batch(self, payloads: Sequence[Any]) -> Any:
        """Encoder: mean-pooled embeddings (batch × hidden). Decoder: the generated token ids
        (batch × ``new_tokens``).
        """

        def forward() -> Any:
            enc = self._collate(payloads)
            if self.decoder:
                out = self.model.generate(**enc, max_new_tokens=self.new_tokens,
                                          min_new_tokens=self.new_tokens, do_sample=False,
                                          pad_token_id=self.pad_id)
                return out[:, enc["input_ids"].shape[1]:]
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

        return self._forward(forward)
