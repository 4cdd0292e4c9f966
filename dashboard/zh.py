"""Chinese for every English string the dashboard shows (data only; see dashboard.i18n).

Keys are the exact English text of a label, title, axis, table header or note; a string
missing here shows in English. ``tests/dashboard/test_i18n.py`` checks that the bundled
font holds every character used below and in the lessons.
"""

from __future__ import annotations

ZH: dict[str, str] = {
    # the LLM page's roofline pickers (dashboard/llm_roofline_picker.py)
    "Roofline: a model on a device (llm_roofline)": "Roofline：设备上的模型（llm_roofline）",
    "model": "模型", "config.json (path or folder)": "config.json（文件或目录）",
    "device": "设备", "tensor parallel (GPUs)": "张量并行（GPU 数）",
    "Give the path of a Hugging Face config.json.": "请给出 Hugging Face config.json 文件。",
    "{model}: {params:.1f} B parameters on {tp} × {device}; coefficients {coeffs}; KV "
    "cache {blocks} blocks of 16 tokens, as vLLM sizes it":
        "{model}：{params:.1f} B 参数，运行在 {tp} × {device} 上；系数 {coeffs}；KV 缓存 "
        "{blocks} 块（每块 16 个 token），与 vLLM 的计算一样",
    # navigation and page titles
    "Explore": "探索", "Compare": "对比", "LLM": "大模型", "Calibration": "校准",
    "Verify": "验证", "Course": "课程",
    "Compare policies": "对比策略", "LLM serving": "大语言模型服务",
    "Calibration profiles": "校准曲线", "Verify: simulator vs the real model":
        "验证：模拟器与真实模型",
    "Pick a profile, arrivals and a policy; everything re-simulates as you move a knob.":
        "选择性能曲线、到达过程和策略；每调整一个参数都会重新模拟。",
    "Every configuration sees the very same arrivals (same seed); then all of them over a "
    "range of loads.": "每种配置看到完全相同的请求到达（相同随机种子）；然后在一系列负载下比较。",
    "Continuous batching simulated step by step: token budgets, a paged KV cache, "
    "preemption; TTFT, TPOT and where the knee is. Every scheduler sees the same requests.":
        "逐步模拟连续批处理：token 预算、分页 KV 缓存、抢占；TTFT、TPOT 以及拐点位置。"
        "每个调度器看到相同的请求。",
    # KPI labels
    "throughput (req/s)": "吞吐量（请求/秒）", "P50 latency": "P50 延迟",
    "P95 latency": "P95 延迟", "P99 latency": "P99 延迟", "error rate": "错误率",
    "device utilisation": "设备利用率", "mean batch": "平均批大小",
    "batch utilisation": "批利用率", "queue length p95": "队列长度 P95",
    "replicas (mean)": "副本数（平均）", "cost per million": "每百万请求成本",
    "cold starts": "冷启动次数", "waited on a cold start": "等待冷启动的请求",
    "TTFT P50": "TTFT P50", "TTFT P99": "TTFT P99", "TPOT P50": "TPOT P50",
    "TPOT P99": "TPOT P99", "output tokens/s": "输出 token/秒", "preemptions": "抢占次数",
    "one request alone": "单个请求", "stream P50": "请求流 P50", "stream P99": "请求流 P99",
    "stream": "请求流",
    # verdicts
    "stable": "稳定", "unstable": "不稳定", "saturated": "饱和", "This run is": "本次运行",
    "Restored without": "恢复时未包含",
    "no control here; run the file with servelab simulate":
        "此页面没有对应的控件；请用 servelab simulate 运行该文件",
    # figure titles, axes, legends
    "latency CDF": "延迟累积分布", "latency (ms)": "延迟（毫秒）",
    "fraction of requests": "请求占比", "latency percentiles": "延迟分位数",
    "queue length over time": "队列长度随时间变化", "time (s)": "时间（秒）",
    "queued requests": "排队请求数", "batch sizes": "批大小分布",
    "batch size (requests)": "批大小（请求数）", "batches": "批次数",
    "device utilisation per replica": "各副本设备利用率", "busy fraction": "繁忙比例",
    "latency split (queue wait vs service)": "延迟构成（排队等待与服务）",
    "queue wait": "排队等待", "service": "服务", "ms": "毫秒", "mean": "平均",
    "achieved throughput vs offered load": "实际吞吐量与负载",
    "latency vs achieved throughput": "延迟与实际吞吐量",
    "offered load (req/s)": "负载（请求/秒）",
    "achieved throughput (req/s)": "实际吞吐量（请求/秒）",
    "latency P99 (solid), P50 (dotted) (ms)": "延迟 P99（实线）、P50（点线）（毫秒）",
    "throughput = offered": "吞吐量 = 负载", "goodput vs offered load": "有效吞吐与负载",
    "goodput (req/s)": "有效吞吐（请求/秒）", "ideal": "理想",
    "TTFT vs offered load": "TTFT 与负载", "TPOT vs offered load": "TPOT 与负载",
    "ms, P99 solid / P50 dotted": "毫秒，P99 实线 / P50 点线",
    "KV cache and sequences over time": "KV 缓存与序列数随时间变化",
    "KV cache utilisation": "KV 缓存利用率", "running sequences": "运行中的序列",
    "waiting": "等待中", "sequences": "序列数", "step composition": "每步构成",
    "decoding sequences in the step": "本步解码序列数",
    "prefill tokens in the step": "本步预填充 token 数", "step ms": "每步毫秒", "steps": "步",
    "P99 latency per time bin and replica count": "各时间段 P99 延迟与副本数",
    "P99 latency (ms)": "P99 延迟（毫秒）", "replicas": "副本数",
    "batch latency (ms)": "批延迟（毫秒）", "batch size": "批大小",
    # table headers
    "scheduler": "调度器", "TTFT P50 (ms)": "TTFT P50（毫秒）", "TTFT P99 (ms)":
        "TTFT P99（毫秒）", "TPOT P50 (ms)": "TPOT P50（毫秒）", "TPOT P99 (ms)":
        "TPOT P99（毫秒）", "output tok/s": "输出 token/秒", "KV util (mean)":
        "KV 利用率（平均）", "verdict": "结论", "config": "配置", "P50 (ms)": "P50（毫秒）",
    "P99 (ms)": "P99（毫秒）", "utilisation (%)": "利用率（%）",
    "error rate (%)": "错误率（%）", "offered req/s": "负载 请求/秒",
    "throughput req/s": "吞吐 请求/秒", "stable?": "稳定？", "P50 ms": "P50 毫秒",
    "P95 ms": "P95 毫秒", "P99 ms": "P99 毫秒", "mean ms": "平均 毫秒",
    "utilisation %": "利用率 %", "batch utilisation %": "批利用率 %", "error %": "错误率 %",
    "queue p95": "队列 P95", "queue mean / max": "队列 平均 / 最大",
    "goodput req/s": "有效吞吐 请求/秒", "USD / million": "美元 / 百万请求",
    "TTFT P50 ms": "TTFT P50 毫秒", "TTFT P99 ms": "TTFT P99 毫秒",
    "TPOT P50 ms": "TPOT P50 毫秒", "TPOT P99 ms": "TPOT P99 毫秒",
    "seqs per step": "每步序列数", "KV util %": "KV 利用率 %",
    "within SLO %": "满足 SLO %", "replicas mean / max": "副本 平均 / 最大",
    "class": "类别", "priority": "优先级", "SLO (ms)": "SLO（毫秒）", "requests": "请求数",
    # LLM page
    "request source": "请求来源", "Azure conversation trace": "Azure 对话轨迹",
    "token-length distributions": "token 长度分布", "step model": "步时模型",
    "rate × the trace's (5.5 req/s)": "速率 × 轨迹速率（5.5 请求/秒）",
    "rate (req/s)": "速率（请求/秒）", "prompt tokens (mean)": "提示 token 数（平均）",
    "output tokens (mean)": "输出 token 数（平均）", "length CV (lognormal)":
        "长度变异系数（对数正态）", "schedulers (2–4)": "调度器（2–4 个）",
    "KV cache and limits": "KV 缓存与限制", "TTFT SLO (ms)": "TTFT 目标（毫秒）",
    "TPOT SLO (ms)": "TPOT 目标（毫秒）", "Pick at least one scheduler.": "请至少选择一个调度器。",
    "over a load sweep": "负载扫描", "load sweep (× the load above)": "负载扫描（上述负载的倍数）",
    "Requests simulated per run. The default 300 answers a knob in about a second; more "
    "requests narrow the confidence intervals and take longer (about 1 s per 500 requests "
    "and scheduler on one core).":
        "每次运行模拟的请求数。默认 300 个，约一秒内响应参数调整；请求越多，置信区间越窄，"
        "但耗时越长（单核上每个调度器每 500 个请求约 1 秒）。",
    "Simulated on {n} requests: the percentiles are estimates, with their 95% order-statistic "
    "interval under each card (it treats requests as independent; queueing correlates them, "
    "so the real spread is wider). Raise 'requests' for tighter numbers.":
        "基于 {n} 个请求的模拟：分位数是估计值，每张卡片下方给出其 95% 顺序统计置信区间"
        "（假设请求相互独立；排队会使请求相关，实际波动更大）。增大“请求数”可得到更精确的数字。",
    "Offered load around {rate:.2f} req/s × the factors. × marks the knee; hollow red-edged "
    "markers are unstable runs.":
        "负载约为 {rate:.2f} 请求/秒 × 各倍数。× 标记拐点；空心红边标记为不稳定的运行。",
    # widgets (Explore, Compare, Calibration, Verify)
    "SLO for goodput (ms)": "有效吞吐的延迟目标（毫秒）", "configurations": "配置数",
    "duration (s)": "时长（秒）", "duration per point (s)": "每个点的时长（秒）",
    "offered load as a multiple of the rate above": "负载（上述速率的倍数）",
    "autoscaler": "自动扩缩容", "autoscaling and cold starts": "自动扩缩容与冷启动",
    "download this scenario (YAML)": "下载此场景（YAML）",
    "price per replica-hour (USD)": "每副本小时价格（美元）",
    "queue bound (0 = none)": "队列上限（0 = 无）", "queue discipline": "队列规则",
    "queue, replicas, SLO": "队列、副本、延迟目标",
    "request classes (share, priority, own SLO)": "请求类别（占比、优先级、各自的延迟目标）",
    "request classes and queue discipline": "请求类别与队列规则",
    "request timeout ms (0 = none)": "请求超时毫秒（0 = 无）",
    "restore a scenario (YAML)": "恢复场景（YAML）", "routing": "路由", "seed": "随机种子",
    "or upload profile JSON files": "或上传性能曲线 JSON 文件", "profiles": "性能曲线",
    "profile JSON": "性能曲线 JSON", "latency profile": "延迟性能曲线",
    "compare result directory": "对比结果目录", "load": "负载",
    "period (s): a 'day'": "周期（秒）：一“天”",
    "amplitude (share of the mean rate)": "振幅（占平均速率的比例）", "arrivals": "到达过程",
    "batch latency objective (ms)": "批延迟目标（毫秒）",
    "burst rate (req/s)": "突发速率（请求/秒）",
    "burstiness (CV of gaps)": "突发程度（间隔变异系数）", "clients": "客户端数",
    "cold start (s) when the profile has none": "冷启动（秒，性能曲线未给出时）",
    "downscale delay (s)": "缩容延迟（秒）", "flush a partial batch after (ms)":
        "未满批次的发出时间（毫秒）", "look-back period (s)": "回看周期（秒）",
        "look-back reduction": "回看窗口的聚合方式",
    "max batch size": "最大批大小", "max wait (ms)": "最大等待（毫秒）",
    "mean state duration (s)": "平均状态时长（秒）", "panic window (s)": "恐慌窗口（秒）",
    "policy": "策略", "quiet rate (req/s)": "平静速率（请求/秒）",
    "replicas (min, max)": "副本数（最小，最大）", "scale-to-zero grace (s)":
        "缩容到零的宽限（秒）", "stable window (s)": "稳定窗口（秒）",
    "target concurrency per replica": "每副本目标并发", "target ongoing requests per replica":
        "每副本目标进行中请求数", "think time (ms)": "思考时间（毫秒）",
    "timer starts": "计时起点", "upscale delay (s)": "扩容延迟（秒）",
    # calibration figure
    "throughput (items/s)": "吞吐量（条/秒）", "cost per item (ms)": "单条成本（毫秒）",
    "batch size (items)": "批大小（条）", "items/s": "条/秒", "ms per item": "毫秒/条",
    "sim vs live error against load": "模拟与实测误差随负载变化",
    "relative error (%)": "相对误差（%）", "utilisation ρ": "利用率 ρ",
    "Throughput is what finished in the window: it follows the offered load, then flattens "
    "at the capacity while latency climbs. × marks the knee (the first load whose P99 is "
    "more than 3× the lightest load's); hollow red-edged markers are unstable runs (offered "
    "load above capacity: their latency only says how long the run lasted).":
        "吞吐量是窗口内完成的请求：它随负载上升，到达容量后变平，而延迟持续攀升。× 标记拐点"
        "（P99 首次超过最轻负载 P99 三倍的负载）；空心红边标记为不稳定的运行（负载超过容量："
        "其延迟只反映运行了多久）。",
    "{n} of {total} sweep points are unstable: the offered load exceeds what the "
    "configuration can finish.": "{total} 个扫描点中有 {n} 个不稳定：负载超过了该配置能完成的量。",
    "**per request class** (a class whose P99 or error rate runs away is being starved)":
        "**各请求类别**（P99 或错误率失控的类别正在被饿死）",
    # the autoscaling lesson's Ray Serve check (dashboard.lesson_rayserve)
    "Ray Serve replicas": "Ray Serve 副本数",
    "Ray Serve replicas running": "Ray Serve 运行中副本数",
    "servelab predicted replicas": "servelab 预测副本数",
    "Replicas over the burst day: Ray Serve vs servelab":
        "突发的一天中的副本数：Ray Serve 与 servelab",
    "run": "运行", "servelab service time": "servelab 服务时间", "nominal": "设定值",
    "calibrated": "校准值",
    "servelab predicted replicas (calibrated service)": "servelab 预测副本数（校准服务时间）",
    "replica-seconds, Ray / servelab": "副本秒数，Ray / servelab",
    "replica-seconds error %": "副本秒数误差 %",
    "upscales, Ray / servelab": "扩容次数，Ray / servelab",
    "P99 ms, Ray / servelab": "P99 毫秒，Ray / servelab", "P99 error %": "P99 误差 %",
    # this round: the LLM page, prefix caching, Calibration, Verify, lesson row labels
    "KV cache utilisation (mean)": "KV 缓存利用率（平均）", "queue wait mean (ms)":
        "排队等待平均（毫秒）", "mean batch size": "平均批大小", "utilisation": "利用率",
    "replica-seconds": "副本·秒", "cold start p50 (s)": "冷启动 P50（秒）",
    "requests that waited on a cold start": "等待冷启动的请求数",
    "cost per million (USD)": "每百万请求成本（美元）",
    '8B-class GPU (linear, builtin:llm-demo)': '8B 级 GPU（线性，builtin:llm-demo）',
    'CPU decoder, measured (builtin:llm-small-cpu)': 'CPU 解码器，实测（builtin:llm-small-cpu）',
    'vllm, chunked prefill (512)': 'vllm，分块预填充（512）',
    'vllm, chunked prefill (2048)': 'vllm，分块预填充（2048）',
    'vllm, no chunking': 'vllm，不分块',
    'vllm V0 (prefill first)': 'vllm V0（预填充优先）',
    'sarathi (256)': 'sarathi（256）',
    'continuous (Orca)': '连续批处理（Orca）',
    'static (batch 8)': '静态批处理（批 8）',
    'First estimate from the first {first} requests only (the run starts with an empty queu'
    'e, so under heavy load it reads low); refining on {n} requests…':
        '仅由前 {first} 个请求得到的初步估计（运行从空队列开始，重负载下会偏低）；正在基于 {n} '
        '个请求细化…',
    'KV cache and sequences over time (maximum per bin)':
        'KV 缓存与序列数随时间变化（每区间最大值）',
    'queue length over time (maximum per bin)': '队列长度随时间变化（每区间最大值）',
    'Prefix caching': '前缀缓存',
    'simulate prefix caching on a multi-turn chat trace (synthetic)':
        '在多轮对话轨迹（合成）上模拟前缀缓存',
    "vLLM reuses the KV blocks of a prompt's cached prefix: the second turn of a chat prefi"
    'lls only its new tokens. Turn the switch on to compare.':
        'vLLM 复用提示词已缓存前缀的 KV 块：对话的第二轮只需预填充新增的 token。打开开关进行对'
        '比。',
    'routing (caching on)': '路由（开启缓存时）',
    'KV blocks per replica (16 tokens)': '每副本 KV 块数（每块 16 token）',
    'time scale (smaller: more load)': '时间缩放（越小负载越高）',
    'hit rate (tokens)': '命中率（token）',
    'prefill tokens saved': '节省的预填充 token',
    'TTFT P50 off → on': 'TTFT P50 关闭 → 开启',
    'TTFT P99 off → on': 'TTFT P99 关闭 → 开启',
    'caching on': '开启缓存',
    '{evicted} blocks evicted (LRU). The trace is synthetic: 400 chats sharing 8 system pro'
    'mpts, each turn extending the previous one.':
        '{evicted} 个块被逐出（LRU）。该轨迹为合成数据：400 段对话共享 8 个系统提示词，每一轮在'
        '上一轮的基础上延伸。',
    'prefix-cache hit rate over time (tokens)': '前缀缓存命中率随时间变化（token）',
    'arrival time (s)': '到达时间（秒）',
    'hit rate (%)': '命中率（%）',
    'cached tokens (mean)': '缓存 token 数（平均）',
    'Latency of one batch against batch size, as measured (median with p5–p95 band), the th'
    'roughput it gives, and what each item costs.':
        '单个批次的延迟随批大小的变化（实测中位数及 p5–p95 区间）、由此得到的吞吐量，以及每条请'
        '求的成本。',
    'Pick at least one profile.': '请至少选择一个性能曲线。',
    'threads': '线程',
    'measured': '测量于',
    'synthetic': '合成',
    'upload…': '上传…',
    'A `servelab compare` result: the same scenario simulated and run live (or, with `--end'
    'point`, measured against a server: vLLM, Ray Serve, KServe); the prediction is good wh'
    'en its error is inside the measured run-to-run spread.':
        '`servelab compare` 的结果：同一场景分别模拟与实机运行（或用 `--endpoint` 对服务器实测'
        '：vLLM、Ray Serve、KServe）；预测误差落在实测运行间波动之内即为良好。',
    'A `servelab compare` output directory, or a folder holding several: each one found is '
    'listed with what it measured.':
        '`servelab compare` 的输出目录，或包含多个输出目录的文件夹：找到的每一个都会列出并注明'
        '其测量对象。',
    'comparison': '对比结果',
    'runs against the server': '次对服务器的运行',
    'live runs': '次实机运行',
    'LLM scenario': '大模型场景',
    'request-level scenario': '请求级场景',
    'measured by': '测量对象',
    'endpoint': '端点',
    'at': '地址',
    'live': '实机',
    'servelab executor': 'servelab 执行器',
    'on': '运行于',
    'a server': '某服务器',
    'servelab stub server': 'servelab 桩服务器',
    'OpenAI completions': 'OpenAI 补全接口',
    'OpenAI chat': 'OpenAI 对话接口',
    'KServe v2': 'KServe v2 协议',
    'HTTP JSON': 'HTTP JSON 接口',
    'Run `servelab compare SCENARIO --out DIR` and give DIR here (a shipped example is the '
    'default).':
        '运行 `servelab compare SCENARIO --out DIR` 并在此填入 DIR（默认是随附的示例）。',
    'Predictions use the step profile rescaled by the probes around each live run':
        '预测使用经每次实机运行前后的探测重新缩放的步进曲线',
    "Predictions use the profile rescaled to the device's speed, probed around each live ru"
    'n':
        '预测使用按设备当前速度重新缩放的性能曲线（在每次实机运行前后探测）',
    "'stored error' is the stored profile's prediction against the same runs.":
        '“存储曲线误差”是存储的性能曲线对同一组运行的预测误差。',
    'prefill': '预填充',
    'decode': '解码',
    'drift': '漂移',
    'drift during the run': '运行期间的漂移',
    'calibration mismatch': '校准不匹配',
    'Green: within the target (throughput and P50 ±2%, P99 ±5%; LLM: TTFT/TPOT P50 ±5%, P99'
    ' ±10%) or inside the live spread; orange: outside both.':
        '绿色：在目标范围内（吞吐量与 P50 ±2%，P99 ±5%；大模型：TTFT/TPOT P50 ±5%，P99 ±10%）或'
        '在实测波动之内；橙色：两者都不满足。',
    'metric': '指标',
    'label': '名称',
    'sim': '模拟',
    'live_median': '实测中位数',
    'prediction error %': '预测误差 %',
    'live_min': '实测最小值',
    'live_max': '实测最大值',
    'within_spread': '在波动之内',
    'stored error %': '存储曲线误差 %',
    'TTFT CDF, sim vs live': 'TTFT 累积分布：模拟与实测',
    'target (Ray Serve)': '目标进行中请求数（Ray Serve）',
    'concurrency, scale to zero (Knative)': '并发，可缩容到零（Knative）',
    # the figure tabs of Explore and the LLM page (only the open tab runs)
    "latency": "延迟", "over time": "随时间变化", "batches and replicas": "批与副本",
    "Only the open tab's figures are drawn, so a knob move answers quickly; opening a tab "
    "draws its figures for the current settings.":
        "只绘制当前打开的标签页中的图，因此调整参数后很快就有结果；打开一个标签页会按当前设置"
        "绘制其中的图。",
    "this scheduler": "当前调度器", "compare schedulers": "对比调度器", "load sweep": "负载扫描",
    "Only the open tab runs: the default tab needs the first scheduler's run alone, so a knob "
    "move answers within a second; 'compare schedulers' adds one run per other scheduler and "
    "'load sweep' one per scheduler and load factor, for every knob move while it is open "
    "(cached: settings seen before answer at once).":
        "只有打开的标签页会运行：默认标签页只需第一个调度器的一次模拟，因此调整参数后一秒内就有"
        "结果；打开“对比调度器”时，每调整一次参数，其余每个调度器各多模拟一次；打开“负载扫描”"
        "时，每个调度器的每个负载倍数各多模拟一次（有缓存：见过的设置会立即给出结果）。",
    "The {n} chosen schedulers on the same requests.": "所选的 {n} 个调度器处理相同的请求。",
    "Each factor is one more run per scheduler (about 0.2–0.5 s each on one core): while this "
    "tab is open, a knob move takes a few seconds.":
        "每个倍数意味着每个调度器多模拟一次（单核上每次约 0.2–0.5 秒）：此标签页打开时，调整"
        "一次参数需要几秒钟。",
}

# Labels with a number in them (regular expression -> Chinese with the groups in order).
ZH_PATTERNS: list[tuple[str, str]] = [
    (r"batch ≤ (\d+)", "批 ≤ {0}"),
    (r"batch (\d+)", "批大小 {0}"),
    (r"fixed (\d+)", "固定 {0} 个副本"),
    # the comparison metrics (executor.compare, executor.compare_llm)
    (r"(TTFT|TPOT|ITL|E2E) mean \(ms\)", "{0} 平均（毫秒）"),
    (r"(TTFT|TPOT|ITL|E2E) (p\d+) \(ms\)", "{0} {1}（毫秒）"),
    (r"latency mean \(ms\)", "延迟平均（毫秒）"),
    (r"latency (p\d+) \(ms\)", "延迟 {0}（毫秒）"),
]
