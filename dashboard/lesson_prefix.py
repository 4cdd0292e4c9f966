"""Course lesson: why the second turn of a chat is faster (prefix caching), English / 中文."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from dashboard.i18n import frame
from dashboard.lessons import Lesson
from dashboard.state import fmt, run_llm_scenario
from sim.scenario.workloads import data_path

TRACE = "builtin:synthetic_chat_blksz_16.jsonl"
N_REQUESTS = 300


def exp_second_turn(lang: str) -> None:
    """TTFT and cached tokens of first and later turns, prefix caching off and on."""
    en = lang == "en"
    blocks = st.select_slider("KV cache blocks (16 tokens each)" if en else
                              "KV 缓存块数（每块 16 个 token）", [256, 512, 1024, 4096],
                              value=4096, key="l-prefix-blocks")
    turns = pd.read_json(data_path(TRACE), lines=True)["turn"].to_numpy()[:N_REQUESTS]
    rows = []
    for caching in (False, True):
        result = run_llm_scenario({
            "name": "lesson-prefix", "seed": 0,
            "service": {"kind": "llm_linear", "base_ms": 6.0, "per_prefill_token_ms": 0.12,
                        "per_decode_seq_ms": 0.3, "per_kv_token_ms": 0.00008},
            "workload": {"kind": "hash_trace", "path": TRACE, "n_requests": N_REQUESTS},
            "policy": {"kind": "vllm", "max_num_batched_tokens": 2048,
                       "num_gpu_blocks": int(blocks), "enable_prefix_caching": caching}})
        if result is None:
            return
        req = result.requests
        ttft_ms = (req["first_token_s"] - req["arrival_s"]).to_numpy() * 1e3
        cached = req["cached_tokens"].to_numpy() if caching else np.zeros(len(req))
        for first in (True, False):
            pick = (turns[: len(req)] == 1) if first else (turns[: len(req)] > 1)
            label = ("turn 1" if first else "turns 2+") if en else (
                "第 1 轮" if first else "第 2 轮及以后")
            rows.append({"": f"{'caching on' if caching else 'caching off'}, {label}" if en
                         else f"{'开启缓存' if caching else '关闭缓存'}，{label}",
                         "requests": int(pick.sum()),
                         "prompt tokens (mean)": fmt(float(req['prompt_tokens'][pick].mean()), 0),
                         "cached tokens (mean)": fmt(float(cached[pick].mean()), 0),
                         "TTFT P50 ms": fmt(float(np.median(ttft_ms[pick])), 1)})
    st.dataframe(frame(pd.DataFrame(rows), lang), hide_index=True)


LESSON = Lesson(
    "second-turn",
    {"en": "10. Why the second turn of a chat is faster",
     "zh": "10. 为什么聊天的第二轮更快"},
    {"en": "A chat's second prompt is its first prompt, the answer, and a new question. The "
           "server already computed the KV of the first part for turn 1, so with **prefix "
           "caching** (on by default in vLLM) it keeps those blocks after the request ends "
           "and reuses every full block of the longest matching prefix: turn 2 prefills only "
           "its new tokens (the last prompt token is always computed). Cached blocks are "
           "evicted least recently used, and only when a new block is needed, so a small "
           "cache forgets a chat between turns. The trace here is synthetic: 400 chats sharing "
           "8 system prompts.",
     "zh": "聊天的第二轮提示词 = 第一轮提示词 + 回答 + 新问题。第一轮时服务器已经算过前一部分的 "
           "KV，开启**前缀缓存**（vLLM 默认开启）后，请求结束时这些块被保留，下一次按最长匹配前缀"
           "复用其中的每个完整块：第二轮只需预填充新增的 token（最后一个提示词 token 总要计算）。"
           "缓存块按最近最少使用淘汰，且只在需要新块时才淘汰，所以缓存太小会在两轮之间把对话忘掉。"
           "这里的轨迹是合成的：400 个对话共享 8 个系统提示词。"},
    {"en": "How many tokens does turn 2+ reuse on average, and what does that do to its TTFT? "
           "Shrink the cache to 256 blocks: what happens to the reuse, and why?",
     "zh": "第 2 轮及以后平均复用多少个 token，对 TTFT 有什么影响？把缓存缩小到 256 块：复用发生"
           "了什么变化？为什么？"},
    exp_second_turn)
