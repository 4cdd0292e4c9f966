"""A small Llama-architecture decoder with a preallocated KV cache, run one engine step at a time.

RMSNorm, rotary position embeddings, grouped-query attention through
``torch.nn.functional.scaled_dot_product_attention`` and a SwiGLU MLP, with random weights
(latency does not depend on weight values; nothing to download). The KV cache is preallocated
per slot (``max_slots × max_len`` tokens per layer), so a step never re-pads or copies the
cache when a sequence joins or leaves, as a padded Hugging Face cache would.

Prefix caching (the live engine's KV reuse): :meth:`LlamaDecoder.attach_block_store` adds a
store of KV blocks beside the slots, addressed by the block ids of the KV manager
(:class:`sim.serving.llm.prefix_cache.PrefixCachingBlockPool`); :meth:`save_blocks` copies a
slot's computed full blocks into it and :meth:`load_blocks` copies cached blocks into a slot
before the sequence computes the rest of its prompt there. Each cached token is copied once
out and once in per reuse, and attention keeps reading one contiguous slot; the alternative,
slots that read shared blocks in place, would gather every block of the context at every
step (``benchmarks/prefix_kv_copy.py`` measures both).

One :meth:`LlamaDecoder.step` runs a step's prefill chunks and decodes together as one
variable-length batch: every token of the step goes through the projections and the MLP in one
matrix multiply; attention runs per prefill chunk (causal within the chunk, over its cached
prefix) and once for all decodes (each over its own cached context, masked to its length).

``torch`` is imported only here and by the runners, never by the simulator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from calibration.llm_shapes import SHAPES, DecoderConfig


class _RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return (x.float() * scale).to(x.dtype) * self.weight


class _Layer(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.norm1 = _RMSNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, (cfg.heads + 2 * cfg.kv_heads) * hd, bias=False)
        self.out = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)
        self.norm2 = _RMSNorm(cfg.hidden)
        self.gate_up = nn.Linear(cfg.hidden, 2 * cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)


@dataclass(frozen=True)
class StepEntry:
    """One sequence's share of a step: ``n_tokens`` new tokens from position ``start``."""

    slot: int
    start: int
    n_tokens: int


class LlamaDecoder(nn.Module):
    """The decoder and its KV cache (see the module docstring)."""

    def __init__(self, cfg: DecoderConfig, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg.check()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.layers))
        self.norm = _RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.to(device=device, dtype=dtype)
        self.eval()
        self.device_name = device
        # CPU: each decode attends to a view of its own cache (no copy); CUDA: one batched
        # attention call over the gathered contexts (launch overhead dominates there)
        self.batched_decode = str(device).startswith("cuda")
        hd = cfg.head_dim
        shape = (cfg.layers, cfg.max_slots, cfg.kv_heads, cfg.max_len, hd)
        self.k_cache = torch.zeros(shape, device=device, dtype=dtype)
        self.v_cache = torch.zeros(shape, device=device, dtype=dtype)
        # commit every page now (zeros may be lazily mapped): otherwise the first steps that
        # reach a fresh part of the cache pay page faults that no later step pays
        self.k_cache.fill_(1.0).zero_()
        self.v_cache.fill_(1.0).zero_()
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=device).float() / hd))
        angles = torch.outer(torch.arange(cfg.max_len, device=device).float(), inv)
        self.cos = angles.cos().to(dtype)
        self.sin = angles.sin().to(dtype)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` [T, heads, hd] by positions ``pos`` [T]."""
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    @torch.inference_mode()
    def step(self, entries: list[StepEntry], token_ids: torch.Tensor | None = None,
             return_logits: bool = False) -> torch.Tensor:
        """Run one engine step; return the next token of every entry (greedy), or with
        ``return_logits`` the last position's logits of every entry.

        Args:
            entries: The step's sequences (prefill chunks and decodes).
            token_ids: The step's input tokens in entry order (default: random ids; latency
                does not depend on them).
            return_logits: Return logits instead of tokens.

        Raises:
            ValueError: an entry does not fit the cache (slot or length).
        """
        cfg = self.cfg
        for e in entries:
            if not 0 <= e.slot < cfg.max_slots or e.start + e.n_tokens > cfg.max_len \
                    or e.n_tokens < 1:
                raise ValueError(f"step entry {e} does not fit the KV cache "
                                 f"({cfg.max_slots} slots × {cfg.max_len} tokens)")
        device = self.k_cache.device
        total = sum(e.n_tokens for e in entries)
        tokens = token_ids if token_ids is not None else torch.randint(
            0, cfg.vocab, (total,), device=device)
        pos = torch.cat([torch.arange(e.start, e.start + e.n_tokens, device=device)
                         for e in entries])
        prefills = list(enumerate(entries)) if not self.batched_decode else [
            (i, e) for i, e in enumerate(entries) if e.n_tokens > 1 or e.start == 0]
        decodes = [] if not self.batched_decode else [
            (i, e) for i, e in enumerate(entries) if e.n_tokens == 1 and e.start > 0]
        offsets = [0]
        for e in entries:
            offsets.append(offsets[-1] + e.n_tokens)
        dec_rows = torch.tensor([offsets[i] for i, _ in decodes], device=device,
                                dtype=torch.long)
        dec_slots = torch.tensor([e.slot for _, e in decodes], device=device, dtype=torch.long)
        dec_len = torch.tensor([e.start + 1 for _, e in decodes], device=device)
        max_ctx = int(dec_len.max()) if decodes else 0
        dec_mask = (torch.arange(max_ctx, device=device)[None, :] < dec_len[:, None]) \
            if decodes else None
        hd, heads, kvh = cfg.head_dim, cfg.heads, cfg.kv_heads
        x = self.embed(tokens)
        for li, layer in enumerate(cast(list[_Layer], list(self.layers))):
            h = layer.norm1(x)
            qkv = layer.qkv(h).view(total, heads + 2 * kvh, hd)
            q = self._rope(qkv[:, :heads], pos)
            k = self._rope(qkv[:, heads:heads + kvh], pos)
            v = qkv[:, heads + kvh:]
            kc, vc = self.k_cache[li], self.v_cache[li]
            for e, lo in zip(entries, offsets, strict=False):
                kc[e.slot, :, e.start:e.start + e.n_tokens] = k[lo:lo + e.n_tokens].transpose(0, 1)
                vc[e.slot, :, e.start:e.start + e.n_tokens] = v[lo:lo + e.n_tokens].transpose(0, 1)
            attn = torch.empty(total, heads, hd, device=device, dtype=x.dtype)
            for i, e in prefills:
                lo, n, end = offsets[i], e.n_tokens, e.start + e.n_tokens
                qi = q[lo:lo + n].transpose(0, 1)[None]  # [1, heads, n, hd]
                ki = kc[e.slot, :, :end][None]
                vi = vc[e.slot, :, :end][None]
                mask = (torch.arange(end, device=device)[None, :]
                        <= torch.arange(e.start, end, device=device)[:, None])
                out = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask,
                                                     enable_gqa=True)
                attn[lo:lo + n] = out[0].transpose(0, 1)
            if decodes:
                qd = q[dec_rows][:, :, None, :]  # [D, heads, 1, hd]
                kd = kc[dec_slots, :, :max_ctx]  # [D, kv_heads, L, hd]
                vd = vc[dec_slots, :, :max_ctx]
                assert dec_mask is not None
                out = F.scaled_dot_product_attention(qd, kd, vd,
                                                     attn_mask=dec_mask[:, None, None, :],
                                                     enable_gqa=True)
                attn[dec_rows] = out[:, :, 0]
            x = x + layer.out(attn.reshape(total, heads * hd))
            gate, up = layer.gate_up(layer.norm2(x)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        last = torch.tensor([offsets[i + 1] - 1 for i in range(len(entries))], device=device)
        logits: torch.Tensor = self.lm_head(self.norm(x[last]))
        return logits if return_logits else logits.argmax(-1)

    def attach_block_store(self, num_blocks: int, block_size: int) -> None:
        """Add a store of ``num_blocks`` KV blocks of ``block_size`` tokens (every layer),
        for prefix caching. Its pages are committed now, as the slots' are: a first write to
        a fresh page costs 3-5x a later one here, and would land inside a measured step.
        """
        cfg = self.cfg
        shape = (cfg.layers, num_blocks, cfg.kv_heads, block_size, cfg.head_dim)
        self.block_size = block_size
        self.k_blocks = torch.zeros(shape, device=self.k_cache.device, dtype=self.k_cache.dtype)
        self.v_blocks = torch.zeros(shape, device=self.k_cache.device, dtype=self.k_cache.dtype)
        self.k_blocks.fill_(1.0).zero_()
        self.v_blocks.fill_(1.0).zero_()

    def _block_pairs(self, pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.k_cache.device
        index = torch.tensor([b for _, b in pairs], device=device, dtype=torch.long)
        pos = torch.tensor([j for j, _ in pairs], device=device, dtype=torch.long)
        return pos, index

    @torch.inference_mode()
    def save_blocks(self, slot: int, pairs: list[tuple[int, int]]) -> None:
        """Copy ``slot``'s block ``j`` (tokens ``j*B .. j*B+B-1``) into store block ``b``,
        for each ``(j, b)`` in ``pairs``.
        """
        if not pairs:
            return
        pos, index = self._block_pairs(pairs)
        bs = self.block_size
        whole = self.cfg.max_len // bs * bs  # a full block always lies within
        for cache, store in ((self.k_cache, self.k_blocks), (self.v_cache, self.v_blocks)):
            # [layers, kv_heads, tokens, hd] -> [layers, kv_heads, blocks, B, hd] -> picked
            part = cache[:, slot, :, :whole]
            view = part.reshape(part.shape[0], part.shape[1], whole // bs, bs, part.shape[3])
            store[:, index] = view[:, :, pos].transpose(1, 2)

    @torch.inference_mode()
    def load_blocks(self, slot: int, block_ids: list[int]) -> None:
        """Copy store blocks ``block_ids`` into ``slot``'s first ``len(block_ids)`` blocks
        (a sequence's cached prefix, in order).
        """
        if not block_ids:
            return
        bs, n = self.block_size, len(block_ids)
        index = torch.tensor(block_ids, device=self.k_cache.device, dtype=torch.long)
        for cache, store in ((self.k_cache, self.k_blocks), (self.v_cache, self.v_blocks)):
            got = store[:, index]  # [layers, n, kv_heads, B, hd]
            cache[:, slot, :, :n * bs] = got.transpose(1, 2).flatten(2, 3)

    def describe(self) -> dict[str, Any]:
        """The shape and parameter count (for profiles)."""
        params = sum(p.numel() for p in self.parameters())
        return {"name": "llm", "params": {**asdict(self.cfg)}, "parameters": int(params),
                "kv_bytes_per_token": self.cfg.kv_bytes_per_token(self.k_cache.element_size()),
                "architecture": "llama (RMSNorm, RoPE, GQA via SDPA, SwiGLU), random init"}


def dtype_of(name: str) -> torch.dtype:
    """Torch dtype for fp32 / fp16 / bf16."""
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def reference_check(decoder: LlamaDecoder, prompt_len: int = 12) -> float:
    """Max |difference| between the last token's logits after a whole-prompt prefill and
    after the same prompt fed as a chunk and then one token per step (the cache's
    correctness): about 0 when the cache and the positions are right.
    """
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, decoder.cfg.vocab, (prompt_len,), generator=gen).to(
        decoder.k_cache.device)
    whole = decoder.step([StepEntry(0, 0, prompt_len)], token_ids=ids, return_logits=True)
    split = prompt_len // 2
    decoder.step([StepEntry(1, 0, split)], token_ids=ids[:split])
    last = None
    for j in range(split, prompt_len):
        last = decoder.step([StepEntry(1, j, 1)], token_ids=ids[j:j + 1], return_logits=True)
    assert last is not None
    return float((whole - last).abs().max())


__all__ = ["SHAPES", "DecoderConfig", "LlamaDecoder", "StepEntry", "dtype_of",
           "reference_check"]
