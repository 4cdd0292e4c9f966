"""Write the tiny random-weight Llama and its tokenizer that the test server serves.

Run by the *server's* Python (``VENV/bin/python tiny_model.py OUT_DIR``), not servelab's:
transformers and tokenizers are vLLM's pins there. Nothing is downloaded: the weights are
random (seeded) and the byte-level BPE tokenizer is trained here on a few KB of generated
text. Shape: 4 layers, hidden 256, 8 heads / 4 KV heads, intermediate 688, vocab 2,000.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SHAPE: dict[str, Any] = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
         "num_key_value_heads": 4, "intermediate_size": 688, "vocab_size": 2000,
         "max_position_embeddings": 4096}
WORDS = ("the a queue batch token server request arrives waits prefill decode step cache "
         "block latency throughput replica policy model serves prompt output stream chunk "
         "time first last every each scheduler engine runs sequence length measure predict")


VOCAB = WORDS.split()


def corpus(n_lines: int = 400) -> list[str]:
    """A few KB of deterministic text (a linear congruential walk over a word list)."""
    state, lines = 7, []
    for _ in range(n_lines):
        words = []
        for _ in range(12):
            state = (1103515245 * state + 12345) % 2**31
            words.append(VOCAB[state % len(VOCAB)])
        lines.append(" ".join(words) + ".")
    return lines


def write(out: Path) -> None:
    """Write config, weights, generation config and tokenizer files into ``out``."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(), vocab_size=SHAPE["vocab_size"], min_frequency=1,
                            special_tokens=["<s>", "</s>", "<unk>"], show_progress=False)
    tok = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(out)
    (out / "servelab_tokenizer_vocab.json").write_text(json.dumps(
        {"tokenizer_vocab": len(tok), "model_vocab": SHAPE["vocab_size"]}))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
