"""Course lessons: text in English and Chinese, each with an experiment and a question.

The experiments are small functions that build scenarios, simulate them (cached) and show live
numbers; the text is data here so translations sit side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from calibration.profile import load_profile
from calibration.report import profile_figure
from dashboard import figures, lesson_loop, lesson_rayserve
from dashboard.i18n import chart, frame
from dashboard.state import fmt, run_scenario


@dataclass(frozen=True)
class Lesson:
    """One lesson: title, explanation and question per language, and its experiment."""

    key: str
    title: dict[str, str]
    text: dict[str, str]
    question: dict[str, str]
    experiment: Callable[[str], None]


def _scenario(policy: dict[str, Any], workload: dict[str, Any], profile: str = "builtin:mlp-cpu",
              **extra: Any) -> dict[str, Any]:
    return {"name": "lesson", "seed": 1, "service": {"kind": "profile", "path": profile},
            "workload": workload, "policy": policy, "warmup_s": 1, **extra}


def _row(label: str, result: Any) -> dict[str, Any]:
    s = result.summary
    return {"": label, "offered req/s": fmt(s["offered_rps"]),
            "throughput req/s": fmt(s["throughput_rps"]),
            "stable?": s["stability"]["verdict"],
            "P50 ms": fmt(s["latency_ms"]["p50"]), "P99 ms": fmt(s["latency_ms"]["p99"]),
            "mean batch": fmt(s["mean_batch_size"], 2),
            "utilisation %": fmt(100 * s["utilization"]),
            "error %": fmt(100 * s["error_rate"], 2),
            "queue p95": fmt(s["queue_len"]["p95"], 0)}


def _table(rows: list[dict[str, Any]]) -> None:
    st.dataframe(frame(pd.DataFrame(rows)), hide_index=True)


# -- experiments ---------------------------------------------------------------------------------
def exp_runs_vs_serves(lang: str) -> None:
    profile = load_profile("builtin:minilm-cpu")
    alone_ms = profile.median_s(1) * 1e3
    rate = st.slider("requests per second" if lang == "en" else "每秒请求数", 5, 70, 40,
                     key="l1-rate")
    result = run_scenario(_scenario({"kind": "none"}, {"kind": "poisson", "rate_rps": rate,
                                                       "duration_s": 120},
                                    profile="builtin:minilm-cpu"))
    if result is None:
        return
    cols = st.columns(3)
    cols[0].metric("one request alone" if lang == "en" else "单个请求", fmt(alone_ms, 1, " ms"))
    cols[1].metric("stream P50" if lang == "en" else "请求流 P50",
                   fmt(result.summary["latency_ms"]["p50"], 1, " ms"))
    cols[2].metric("stream P99" if lang == "en" else "请求流 P99",
                   fmt(result.summary["latency_ms"]["p99"], 1, " ms"))
    fig = figures.latency_cdf({("stream" if lang == "en" else "请求流"): result})
    fig.add_vline(x=alone_ms, line_dash="dash",
                  annotation_text="one request alone" if lang == "en" else "单个请求")
    chart(fig)


def exp_latency_vs_throughput(lang: str) -> None:
    rate = st.slider("offered load (req/s)" if lang == "en" else "负载（请求/秒）", 200, 6000,
                     2000, 100, key="l2-rate")
    rows = []
    for b in (1, 8, 32):
        result = run_scenario(_scenario({"kind": "greedy", "max_batch_size": b},
                                        {"kind": "poisson", "rate_rps": rate, "duration_s": 10}))
        if result is not None:
            rows.append(_row(f"batch ≤ {b}", result))
    _table(rows)
    curve = []
    for b in (1, 8, 32):
        for load in (250, 500, 1000, 1500, 2500, 4000, 6000):
            result = run_scenario(_scenario({"kind": "greedy", "max_batch_size": b},
                                            {"kind": "poisson", "rate_rps": load,
                                             "duration_s": 4}))
            if result is not None:
                curve.append(figures.sweep_row(f"batch ≤ {b}", result.summary))
    if curve:
        chart(figures.load_curves(pd.DataFrame(curve)))


def exp_why_batching(lang: str) -> None:
    name = st.selectbox("profile" if lang == "en" else "性能曲线",
                        ["mlp-cpu", "cnn-cpu", "minilm-cpu"], key="l3-profile")
    chart(profile_figure([load_profile(f"builtin:{name}")], [name]))


def exp_why_queues(lang: str) -> None:
    cv = st.slider("burstiness (CV)" if lang == "en" else "突发程度（CV）", 1.0, 8.0, 4.0, 0.5,
                   key="l4-cv")
    bound = st.slider("queue bound" if lang == "en" else "队列上限", 4, 256, 32, key="l4-bound")
    rows = []
    for label, max_len in (("no bound" if lang == "en" else "无上限", None),
                           (f"bound {bound}" if lang == "en" else f"上限 {bound}", bound)):
        result = run_scenario(_scenario(
            {"kind": "dynamic", "max_batch_size": 16, "max_wait_ms": 1},
            {"kind": "gamma", "rate_rps": 2500, "cv": cv, "duration_s": 20},
            queue={"max_len": max_len}))
        if result is not None:
            rows.append(_row(label, result))
    _table(rows)


def exp_concurrency_vs_batching(lang: str) -> None:
    clients = st.slider("closed-loop clients" if lang == "en" else "闭环客户端数", 1, 64, 16,
                        key="l5-clients")
    rows = []
    closed = run_scenario(_scenario({"kind": "none"}, {"kind": "closed", "clients": clients,
                                                       "think_ms": 5, "duration_s": 10},
                                    replicas=4))
    if closed is not None:
        rows.append(_row(f"{clients} clients, 4 replicas, no batching" if lang == "en"
                         else f"{clients} 个客户端，4 副本，不批处理", closed))
        rate = closed.summary["throughput_rps"]
        batched = run_scenario(_scenario({"kind": "dynamic", "max_batch_size": 32,
                                          "max_wait_ms": 2},
                                         {"kind": "poisson", "rate_rps": max(rate, 1.0),
                                          "duration_s": 10}))
        if batched is not None:
            rows.append(_row("open loop, 1 replica, dynamic batching" if lang == "en"
                             else "开环，1 副本，动态批处理", batched))
    _table(rows)


def exp_balance(lang: str) -> None:
    slo = st.slider("latency SLO (ms)" if lang == "en" else "延迟目标（毫秒）", 5, 200, 20,
                    key="l6-slo")
    rows = []
    for b in (4, 32):
        result = run_scenario(_scenario({"kind": "fixed", "batch_size": b, "timeout_ms": 50},
                                        {"kind": "poisson", "rate_rps": 1500, "duration_s": 10},
                                        slo_ms=slo))
        if result is not None:
            row = _row(f"batch {b}", result)
            row["goodput req/s"] = fmt(result.summary["goodput_rps"])
            rows.append(row)
    for n in (1, 2, 4):
        result = run_scenario(_scenario({"kind": "none"}, {"kind": "poisson", "rate_rps": 1500,
                                                           "duration_s": 10},
                                        replicas=n, slo_ms=slo, price_per_replica_hour=1.0))
        if result is not None:
            row = _row(f"{n} replica(s), no batching" if lang == "en"
                       else f"{n} 个副本，不批处理", result)
            row["goodput req/s"] = fmt(result.summary["goodput_rps"])
            row["USD / million"] = fmt(result.summary["cost_per_million_usd"], 3)
            rows.append(row)
    _table(rows)


def exp_metrics(lang: str) -> None:
    en = lang == "en"
    load = st.slider("load as % of capacity" if en else "负载占容量百分比", 30, 99, 90,
                     key="l7-load")
    capacity = 1 / load_profile("builtin:minilm-cpu").median_s(1)
    workload = {"kind": "poisson", "rate_rps": capacity * load / 100, "duration_s": 300}
    setups: list[tuple[str, dict[str, Any], dict[str, Any]]] = [  # the same arrivals: no batching, dynamic batching, a bounded queue
        ("no batching" if en else "不批处理", {"kind": "none"}, {}),
        ("dynamic, max batch 32" if en else "动态批处理，最大批 32",
         {"kind": "dynamic", "max_batch_size": 32, "max_wait_ms": 2}, {}),
        ("no batching, queue bound 4" if en else "不批处理，队列上限 4", {"kind": "none"},
         {"queue": {"max_len": 4}}),
    ]
    rows = []
    for label, policy, extra in setups:
        result = run_scenario(_scenario(policy, workload, profile="builtin:minilm-cpu",
                                        **extra))
        if result is None:
            continue
        s = result.summary
        rows.append({"": label, "mean ms": fmt(s["latency_ms"]["mean"]),
                     "P95 ms": fmt(s["latency_ms"]["p95"]),
                     "P99 ms": fmt(s["latency_ms"]["p99"]),
                     "queue mean / max": f"{fmt(s['queue_len']['mean'])} / "
                                         f"{fmt(s['queue_len']['max'], 0)}",
                     "utilisation %": fmt(100 * s["utilization"]),
                     "mean batch": fmt(s["mean_batch_size"], 2),
                     "batch utilisation %": fmt(100 * s["batch_utilization"]),
                     "error %": fmt(100 * s["error_rate"], 2)})
    big = run_scenario(_scenario({"kind": "fixed", "batch_size": 64, "timeout_ms": 1000},
                                 {"kind": "poisson", "rate_rps": 200, "duration_s": 20}))
    _table(rows)
    if big is not None:
        st.markdown(("Mistake 2, batch too large: fixed batches of 64 at 200 req/s wait "
                     if lang == "en" else "错误二，批次过大：在每秒 200 个请求时固定 64 的批次要等待 ")
                    + f"**{fmt(big.summary['queue_ms']['mean'])} ms**"
                    + (" on average before running." if lang == "en" else "（平均）才开始执行。"))


def exp_continuous_batching(lang: str) -> None:
    from dashboard.state import run_llm_scenario

    en = lang == "en"
    scale = st.slider("load (× the Azure trace's 5.5 req/s)" if en else
                      "负载（Azure 轨迹 5.5 请求/秒 的倍数）", 0.25, 3.0, 1.0, 0.25, key="l8-scale")
    budget = st.select_slider("chunk size: max_num_batched_tokens" if en else
                              "分块大小：max_num_batched_tokens", [256, 512, 1024, 2048, 8192],
                              value=2048, key="l8-budget")
    blocks = st.select_slider("KV cache blocks (16 tokens each)" if en else
                              "KV 缓存块数（每块 16 个 token）", [512, 1024, 2048, 8192],
                              value=8192, key="l8-blocks")
    service = {"kind": "llm_linear", "base_ms": 6.0, "per_prefill_token_ms": 0.03,
               "per_decode_seq_ms": 0.08, "per_kv_token_ms": 0.00002}
    workload = {"kind": "trace", "path": "builtin:azure_llm_2023_conv.csv",
                "rate_scale": scale, "n_requests": 1200,
                "prompt_tokens_column": "ContextTokens", "output_tokens_column": "GeneratedTokens"}
    policies = {
        "static, batch 16" if en else "静态批处理，批 16":
            {"kind": "static", "max_batch_size": 16, "max_wait_ms": 50},
        "continuous (vLLM)" if en else "连续批处理（vLLM）":
            {"kind": "vllm", "max_num_batched_tokens": budget, "num_gpu_blocks": blocks,
             "max_num_seqs": 64},
    }
    rows = []
    for label, policy in policies.items():
        result = run_llm_scenario({"name": "lesson-llm", "seed": 0, "service": service,
                                   "workload": workload, "policy": policy})
        if result is None:
            continue
        s = result.summary
        rows.append({"": label, "TTFT P50 ms": fmt(s["ttft_ms"]["p50"]),
                     "TTFT P99 ms": fmt(s["ttft_ms"]["p99"]),
                     "TPOT P50 ms": fmt(s["tpot_ms"]["p50"], 2),
                     "TPOT P99 ms": fmt(s["tpot_ms"]["p99"], 2),
                     "output tok/s": fmt(s["output_tokens_per_s"], 0),
                     "seqs per step": fmt(s["seqs_per_step"]["mean"], 1),
                     "KV util %": fmt(100 * (s["kv_cache_utilization"]["mean"] or 0.0)),
                     "preemptions": str(s["preemptions"]),
                     "stable?": s["stability"]["verdict"]})
    _table(rows)


def exp_resident_vs_on_demand(lang: str) -> None:
    from sim.experiments.day import DAY_CONFIGS, day_row, day_scenario

    en = lang == "en"
    cold = st.slider("cold start (s): load weights, move to the device, first forward" if en
                     else "冷启动（秒）：加载权重、搬到设备、第一次前向", 0.0, 60.0, 10.0, 1.0,
                     key="l9-cold")
    mean = st.slider("mean load (req/s; night 0, peak twice this)" if en else
                     "平均负载（请求/秒；夜间为 0，高峰为两倍）", 20.0, 120.0, 60.0, 10.0,
                     key="l9-mean")
    rows, runs = [], {}
    for name, fleet in DAY_CONFIGS.items():
        result = run_scenario(day_scenario(fleet, mean_rps=mean, cold_start_s=cold))
        if result is None:
            continue
        runs[name] = result
        r = day_row(name, result)
        rows.append({"": name, "USD / million": fmt(r["cost_per_million_usd"], 2),
                     "P50 ms": fmt(r["p50_ms"]), "P99 ms": fmt(r["p99_ms"]),
                     "within SLO %": fmt(100 * r["goodput_share"], 1),
                     "replicas mean / max": f"{fmt(r['replicas_mean'], 2)} / "
                                            f"{r['replicas_max']}",
                     "cold starts": str(r["cold_starts"]),
                     "waited on a cold start": str(r["cold_start_waits"]),
                     "stable?": r["verdict"]})
    _table(rows)
    if runs:
        chart(figures.latency_and_replicas(runs, bin_s=10.0))
    lesson_rayserve.ray_autoscale_panel(lang)


def exp_exercises(lang: str) -> None:
    with st.expander("one possible set of answers" if lang == "en" else "参考答案"):
        st.markdown(ANSWERS[lang])


ANSWERS = {
    "en": ("1. Concurrency (many clients, replicas) decides how many requests are in the system; "
           "batching decides how many the model runs per call. Lesson 5 shows both.\n"
           "2. A low-latency product wants small batches (or a short max_wait) and enough "
           "replicas; lesson 6 shows large batches missing a tight SLO.\n"
           "3. P50/P95/P99 latency, throughput, error rate by cause, queue length, batch size "
           "and batch utilisation, device utilisation.\n"
           "4. Because every knob trades latency against throughput and cost: the knee in the "
           "Compare page's load curves is where a little more load costs a lot of latency."),
    "zh": ("1. 并发（客户端、副本数量）决定系统中同时有多少请求；批处理决定模型每次调用处理多少"
           "请求。第 5 课同时展示两者。\n"
           "2. 低延迟产品应使用小批次（或很短的最大等待时间）并配足副本；第 6 课显示大批次会错过"
           "严格的延迟目标。\n"
           "3. P50/P95/P99 延迟、吞吐量、按原因分类的错误率、队列长度、批大小与批利用率、设备"
           "利用率。\n"
           "4. 因为每个参数都在延迟、吞吐量和成本之间取舍：对比页负载曲线上的拐点处，多一点负载"
           "就会带来大量延迟。"),
}

LESSONS: list[Lesson] = [
    Lesson("serving-loop", lesson_loop.TITLE, lesson_loop.TEXT, lesson_loop.QUESTION,
           lesson_loop.exp_serving_loop),
    Lesson("serves",
           {"en": "1. A model that runs is not yet a service",
            "zh": "1. 模型能运行，不等于能提供服务"},
           {"en": "A benchmark of one request measures the model alone. In production requests "
                  "arrive at random and wait for each other: the same model, fed a stream, shows "
                  "a latency distribution whose tail grows quickly as the stream approaches the "
                  "model's capacity.",
            "zh": "单个请求的基准测试只衡量模型本身。生产环境中请求随机到达、相互等待：同一个模型"
                  "面对请求流时，延迟呈分布，且当请求速率接近模型容量时尾部延迟迅速增长。"},
           {"en": "At what rate does P99 reach five times the single-request latency?",
            "zh": "请求速率达到多少时，P99 达到单个请求延迟的五倍？"},
           exp_runs_vs_serves),
    Lesson("latency-throughput",
           {"en": "2. Latency vs throughput: batch 1, 8, 32", "zh": "2. 延迟与吞吐：批大小 1、8、32"},
           {"en": "With batches the device does more work per call, so throughput rises; each "
                  "request may wait for its batch, so latency can rise too. Below the knee small "
                  "batches win on latency; above it only batching keeps up at all. Throughput "
                  "is what *finishes* per second: it follows the offered load until the "
                  "capacity, then flattens there while the queue and the latency grow without "
                  "bound (the run is *unstable*: its P99 only says how long it ran). *Saturated* means the "
                  "offered load is close to that capacity (within 5%): no slack is left. A "
                  "device that is busy most of the time at a lower load is not saturated: "
                  "greedy batching keeps it busy with small batches, and as the load grows the "
                  "batches grow with it, so there is headroom left.",
            "zh": "批处理让设备每次调用做更多工作，因此吞吐量上升；但请求可能要等待凑批，延迟也可能"
                  "上升。拐点以下小批次延迟更低；拐点以上只有批处理才能跟上负载。吞吐量是每秒"
                  "*完成*的请求数：它随负载上升直到容量，然后停在容量处，而队列和延迟无限增长"
                  "（此时运行*不稳定*：其 P99 只反映运行了多久）。*饱和*是指负载已接近容量（相差"
                  "不到 5%）：没有余量了。负载较低时设备大部分时间繁忙并不等于饱和：贪心批处理"
                  "用小批次让设备一直忙着，负载上升时批次随之变大，所以仍有余量。"},
           {"en": "Find the load where batch ≤ 1 stops keeping up: where does its throughput "
                  "flatten, and what is that capacity? What does batch ≤ 32 cost at low load?",
            "zh": "找到批大小为 1 时跟不上负载的临界点：它的吞吐量在哪里变平，容量是多少？"
                  "低负载时批大小 32 付出了什么代价？"},
           exp_latency_vs_throughput),
    Lesson("why-batching",
           {"en": "3. Why batching pays: per-item cost", "zh": "3. 为什么批处理划算：单条成本"},
           {"en": "A batch shares fixed costs (kernel launches, weight reads, Python overhead) "
                  "among its items, so the cost per item falls with batch size — on some "
                  "hardware. These are real measurements: compare the MLP with MiniLM on one CPU "
                  "thread, where padding to the longest sentence eats the gain.",
            "zh": "一个批次中的各条请求分摊固定开销（内核启动、读取权重、Python 开销），所以单条成本"
                  "随批大小下降——但只在部分硬件上成立。这些都是真实测量：比较单线程 CPU 上的 MLP "
                  "与 MiniLM，后者按最长句子填充抵消了收益。"},
           {"en": "Which model gains most from batching here, and why might a GPU differ?",
            "zh": "哪个模型从批处理中获益最多？为什么在 GPU 上可能不同？"},
           exp_why_batching),
    Lesson("why-queues",
           {"en": "4. Why queues: bursts", "zh": "4. 为什么需要队列：突发流量"},
           {"en": "The same mean rate with burstier arrivals builds longer queues and longer "
                  "tails. A queue bound trades waiting for rejections: the error rate rises, "
                  "but the requests that are served stay fast.",
            "zh": "平均速率相同但到达更突发时，队列更长、尾延迟更大。队列上限用拒绝换取等待："
                  "错误率上升，但被服务的请求仍然快速。"},
           {"en": "With CV 8, which bound keeps P99 under 20 ms, and what error rate does it "
                  "cost?", "zh": "CV 为 8 时，多大的队列上限能让 P99 低于 20 毫秒？代价是多少"
                                 "错误率？"},
           exp_why_queues),
    Lesson("concurrency",
           {"en": "5. Concurrency is not batching", "zh": "5. 并发不等于批处理"},
           {"en": "Concurrency lives in the scheduling layer: how many requests are in flight "
                  "(clients, replicas). Batching lives in the model-execution layer: how many "
                  "requests one forward pass serves. Closed-loop clients on four replicas "
                  "without batching reach a throughput that one replica with batching can "
                  "match.",
            "zh": "并发属于调度层：系统中同时有多少请求（客户端、副本）。批处理属于模型执行层："
                  "一次前向计算服务多少请求。四个副本、无批处理的闭环客户端所达到的吞吐量，"
                  "一个使用批处理的副本也能达到。"},
           {"en": "How many devices does each setup use for the same throughput?",
            "zh": "达到相同吞吐量，两种方案各用了多少设备？"},
           exp_concurrency_vs_batching),
    Lesson("balance",
           {"en": "6. The balance: SLO, batch size, replicas, cost",
            "zh": "6. 平衡：延迟目标、批大小、副本与成本"},
           {"en": "Under a low-latency SLO, large batches wait too long to fill and miss their "
                  "deadlines: goodput (requests within the SLO) collapses while throughput "
                  "looks fine. More replicas buy latency with money.",
            "zh": "在低延迟目标下，大批次凑批时间过长而错过期限：有效吞吐（满足延迟目标的请求）"
                  "崩溃，而吞吐量看起来正常。更多副本则是用金钱换延迟。"},
           {"en": "Below which SLO does batch 32 lose to batch 4 on goodput? What does the "
                  "cheapest replica count that holds it cost?",
            "zh": "延迟目标低于多少时，批大小 32 的有效吞吐不如批大小 4？满足目标的最便宜副本数"
                  "的成本是多少？"},
           exp_balance),
    Lesson("metrics",
           {"en": "7. The metrics to watch and three common mistakes",
            "zh": "7. 需要关注的指标与三个常见错误"},
           {"en": "Mean latency hides the tail: watch P95/P99, queue length, batch utilisation, "
                  "error rate and device utilisation together. Three mistakes: (1) trusting a "
                  "single-request benchmark only (lesson 1); (2) a batch too large for the load; "
                  "(3) not watching the queue and resources — at 90%+ utilisation the queue and "
                  "the tail explode while the mean still looks acceptable.",
            "zh": "平均延迟掩盖了尾部：要同时关注 P95/P99、队列长度、批利用率、错误率和设备利用率。"
                  "三个常见错误：（1）只相信单请求基准（第 1 课）；（2）批次相对负载过大；（3）不监控"
                  "队列与资源——利用率超过 90% 时，队列和尾延迟急剧增长，而平均值看起来仍可接受。"},
           {"en": "At 95% load, how far apart are the mean and the P99? How full are the "
                  "dynamic batches (batch utilisation), and what share of the requests does "
                  "the queue bound of 4 reject (error rate)?",
            "zh": "负载为 95% 时，平均延迟与 P99 相差多少？动态批处理的批次有多满（批利用率）？"
                  "队列上限为 4 时有多少比例的请求被拒绝（错误率）？"},
           exp_metrics),
    Lesson("continuous-batching",
           {"en": "8. Continuous batching for LLMs", "zh": "8. 大语言模型的连续批处理"},
           {"en": "An LLM answers token by token, and outputs differ in length: on the Azure "
                  "conversation trace some requests want 10 tokens, others 1,000. Request-level "
                  "(static) batching holds every slot of a batch until its longest output ends, "
                  "and a newcomer waits for the whole batch: slots idle while requests queue. "
                  "Continuous (iteration-level) batching reschedules at every step: a finished "
                  "sequence leaves, a waiting one joins at once. Then the **KV cache** is the "
                  "real capacity: every running sequence holds its context's keys and values, and "
                  "when the blocks run out the scheduler must preempt (and later recompute) a "
                  "request. Finally the **chunk size** (the per-step token budget) trades TTFT "
                  "against TPOT: a big budget prefills a long prompt in one step and the decodes "
                  "sharing it stall; a small one spreads the prompt over many steps, so tokens "
                  "keep flowing but the first token comes later.",
            "zh": "大语言模型逐个 token 生成答案，而输出长度差别很大：在 Azure 对话轨迹中，有的请求"
                  "只要 10 个 token，有的要 1000 个。请求级（静态）批处理让一批中的每个位置都等到最"
                  "长的输出结束，新请求要等整批完成：位置空闲，请求却在排队。连续（迭代级）批处理在每"
                  "一步重新调度：完成的序列离开，等待的序列立即加入。这时 **KV 缓存** 才是真正的容量："
                  "每个运行中的序列都占着其上下文的键和值，块用完时调度器必须抢占（之后重算）某个请求。"
                  "最后，**分块大小**（每步 token 预算）在 TTFT 与 TPOT 之间权衡：预算大时长提示一步"
                  "完成预填充，同一步里的解码被拖慢；预算小时提示分散到多步，token 持续输出，但首个 "
                  "token 来得更晚。"},
           {"en": "Shrink max_num_batched_tokens from 8192 to 256: which of TTFT and TPOT P99 "
                  "gets better, which worse? Then cut the KV cache to 512 blocks: what happens "
                  "to preemptions and TTFT?",
            "zh": "把 max_num_batched_tokens 从 8192 降到 256：TTFT 与 TPOT 的 P99 哪个变好、哪个"
                  "变差？再把 KV 缓存降到 512 块：抢占次数和 TTFT 会怎样？"},
           exp_continuous_batching),
    Lesson("resident-vs-on-demand",
           {"en": "9. Resident vs on demand: autoscaling and cold starts",
            "zh": "9. 常驻还是按需：自动扩缩容与冷启动"},
           {"en": "Traffic follows the day: nothing at night, a peak in the afternoon. A "
                  "**resident** fleet sized for the peak answers fast all day and pays for "
                  "idle replicas all night; one sized for the mean is cheap and drowns at the "
                  "peak. An **autoscaler** adds replicas when the ongoing requests per replica "
                  "pass a target (Ray Serve's `target_ongoing_requests`) or when concurrency "
                  "does (Knative), and removes them after a quiet delay. But a new replica is "
                  "not free: before it serves it must load its weights, move them to the device "
                  "and run a first forward — the **cold start**, seconds for a small model, "
                  "minutes for a large one. During it the queue keeps growing, so the requests "
                  "of a burst wait; with **scale to zero** the first request after a quiet "
                  "spell waits for a whole cold start. Cost comes from the replica-seconds "
                  "actually held (cold starts and draining included), not from the maximum.",
            "zh": "流量随一天变化：夜里几乎没有，下午达到高峰。按高峰配置的**常驻**副本整天响应都快，"
                  "却整夜为空闲副本付费；按平均值配置的便宜，却在高峰时被压垮。**自动扩缩容**在每个"
                  "副本的进行中请求数超过目标（Ray Serve 的 `target_ongoing_requests`）或并发超过"
                  "目标（Knative）时增加副本，在安静一段时间后再减少。但新副本不是免费的：开始服务前"
                  "它要加载权重、搬到设备上并做第一次前向——这就是**冷启动**，小模型几秒，大模型几分钟。"
                  "冷启动期间队列继续增长，突发中的请求只能等待；若**缩容到零**，安静之后的第一个请求"
                  "要等完整的一次冷启动。成本按实际占用的副本秒数计算（含冷启动和排空），而不是按最大"
                  "副本数。"},
           {"en": "Which fleet is cheapest with P99 under 500 ms? Raise the cold start to 60 s: "
                  "which autoscaler suffers more, and why does scale to zero show it first?",
            "zh": "哪种配置在 P99 低于 500 毫秒时最便宜？把冷启动调到 60 秒：哪种自动扩缩容受影响"
                  "更大？为什么缩容到零最先暴露问题？"},
           exp_resident_vs_on_demand),
    Lesson("exercises",
           {"en": "11. Four exercises", "zh": "11. 四道练习"},
           {"en": "1) Explain the difference between batching and concurrency, with numbers "
                  "from lesson 5. 2) For a low-latency product, small or large batches? Show it "
                  "in lesson 6 or the Compare page. 3) Write a minimal monitoring list for a "
                  "model server. 4) Why is serving a balance rather than a single best setting?",
            "zh": "1）用第 5 课的数据解释批处理与并发的区别。2）低延迟产品应选小批次还是大批次？在第"
                  " 6 课或对比页中说明。3）为模型服务写一份最小监控清单。4）为什么模型服务是一种"
                  "平衡，而不是存在单一最佳配置？"},
           {"en": "Answer each with an experiment in this app.",
            "zh": "请用本应用中的实验回答每一题。"},
           exp_exercises),
]


def _second_turn() -> Lesson:
    from dashboard.lesson_prefix import LESSON

    return LESSON


LESSONS.insert(len(LESSONS) - 1, _second_turn())  # before the exercises
