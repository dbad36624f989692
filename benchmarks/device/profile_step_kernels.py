"""Where a fast step's device time goes, by kernel class, in the mixed phase and in the decode tail of a run.

    PYTHONPATH=src python3 benchmarks/device/profile_step_kernels.py --out kernels.json [--model 8b|smollm2]
        [--max-num-seqs 512] [--max-fast-tokens 2048] [--windows 40:50,700:710] [--admission arrival|budget]

``--admission`` is ``DefaultScheduler(admission=...)``; the K/V store is sized as ``benchmarks/serving.py`` sizes it
(any ``max_num_seqs`` of the requests at once, capped at 60 % of the free memory), so a run profiles the steps the
benchmark's run of the same set takes.

The ShareGPT-like offline set (nondet, random weights of the model's shape) runs once to capture every graph
it needs, then again; in the second run each window of steps (``start:end``, step indices) runs under
``torch.profiler``. Per window: the steps' plans (decode rows, prompt rows, rows the graphs ran), wall time
per step, and the kernels' device time per step by class (GEMM, decode attention, prompt attention, row ops,
sampler, copies, other) with the top kernels by name. The GEMM class's achieved TFLOP/s is its FLOPs (rows run
x 2 x the layers' matrix parameters, plus the head's rows) over its time. Kernels replayed from CUDA graphs are
seen by the profiler only where CUPTI reports graph nodes; where a window sees none, it is run again on a
generator without graphs (``graph_kernels_visible`` says which). A diagnostic, not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm42 import DVRGenerator  # noqa: E402
from llm42.bench.models import BenchModel  # noqa: E402
from llm42.bench.serving import kv_tokens_for  # noqa: E402
from llm42.bench.workloads import sharegpt_like  # noqa: E402
from llm42.scheduler import DefaultScheduler  # noqa: E402
from llm42.model.config import llama31_8b_config  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from profile_serving import requests, smollm2_shape  # noqa: E402
from profile_steps import record_plans, run_rows  # noqa: E402

# first match wins; names are CUDA kernel names as the profiler reports them
CLASSES = (
    ("decode_attention", re.compile(r"_decode_partial|_decode_combine|flash_fwd_splitkv|chunked_canonical_decode")),
    ("prompt_attention", re.compile(r"prefill|_tiled_|canonical_attention")),
    ("gemm", re.compile(r"gemm|nvjet|sm90_xmma|cutlass|xmma|cublas|matmul|_mm_", re.IGNORECASE)),
    ("row_ops", re.compile(r"rms|rope|swiglu|silu|_add_norm|_fused", re.IGNORECASE)),
    ("sampler", re.compile(r"sampl|gumbel|argmax|row_stats|topk|top_k|logsumexp|softmax|_noise", re.IGNORECASE)),
    ("copies", re.compile(r"memcpy|memset|copy|index|gather|scatter|fill|cat", re.IGNORECASE)),
)


def kernel_class(name: str) -> str:
    for label, pattern in CLASSES:
        if pattern.search(name):
            return label
    return "other"


def matrix_params(cfg) -> tuple[int, int]:
    """(per-token matrix parameters of all layers, the head's)."""
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    layer = h * (q + 2 * kv) + q * h + h * 2 * inter + inter * h
    return cfg.num_layers * layer, cfg.vocab_size * h


def record_decode_context(gen: DVRGenerator) -> list[int]:
    """Each step's decode rows' summed context (prompt + generated tokens: the keys its decode attention reads),
    appended from now on; wraps whatever ``gen.scheduler.schedule`` is (``record_plans``' instance attribute)."""
    contexts: list[int] = []
    schedule = gen.scheduler.schedule

    def recording(state):
        plan = schedule(state)
        views = {v.rid: v for v in state.requests}
        contexts.append(sum(views[r].num_prompt_tokens + views[r].num_generated for r in plan.fast_decode))
        return plan

    gen.scheduler.schedule = recording
    return contexts


def profile_window(gen: DVRGenerator, steps: int, plans: list, contexts: list, cfg) -> dict:
    from torch.profiler import ProfilerActivity, profile

    first = len(plans)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            if not gen.has_unfinished():
                break
            gen.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    window = plans[first:]
    n = max(1, len(window))
    by_class: dict[str, float] = defaultdict(float)
    by_name: dict[str, list] = {}
    for e in prof.key_averages():
        ms = e.self_device_time_total / 1e3
        if ms <= 0:
            continue
        by_class[kernel_class(e.key)] += ms
        by_name[e.key[:110]] = [round(ms / n, 4), e.count]
    fast = gen.fast_step
    rows_run = sum(run_rows(fast, d, p) for d, p, _ in window)
    layer_params, head_params = matrix_params(cfg)
    logits_rows = sum(d + (1 if p else 0) for d, p, _ in window)  # decode rows + about one row per prompt chunk
    gemm_flops = 2 * (rows_run * layer_params + logits_rows * head_params)
    gemm_ms = by_class.get("gemm", 0.0)
    kernel_ms = sum(by_class.values())
    # the decode rows' K and V reads: every layer reads K and V of each visible key once (bytes per key: layers x
    # kv_size x 2 tensors x the element size)
    decode_keys = sum(contexts[first:first + len(window)])
    kv_bytes = decode_keys * cfg.num_layers * cfg.kv_size * 2 * torch.bfloat16.itemsize
    attn_ms = by_class.get("decode_attention", 0.0)
    return {
        "steps": len(window),
        "mean_decode_rows": round(sum(x[0] for x in window) / n, 1),
        "mean_prompt_rows": round(sum(x[1] for x in window) / n, 1),
        "mean_rows_run": round(rows_run / n, 1),
        "wall_ms_per_step": round(1e3 * wall / n, 3),
        "kernel_ms_per_step": round(kernel_ms / n, 3),
        "by_class_ms_per_step": {k: round(v / n, 3) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "gemm_tflops": round(gemm_flops / (gemm_ms * 1e9), 1) if gemm_ms else None,
        "mean_decode_context": round(decode_keys / max(1, sum(x[0] for x in window)), 1),
        "decode_kv_gb_per_step": round(kv_bytes / n / 1e9, 3),
        "decode_attention_tb_per_s": round(kv_bytes / (attn_ms * 1e9), 2) if attn_ms else None,
        "top_kernels_ms_per_step": dict(sorted(by_name.items(), key=lambda kv: -kv[1][0])[:20]),
    }


def run(gen: DVRGenerator, prompts, params, windows, cfg) -> dict:
    plans = record_plans(gen)
    contexts = record_decode_context(gen)
    for p, s in zip(prompts, params):
        gen.submit(p, s)
    out = {}
    for start, end in windows:
        while gen.has_unfinished() and len(plans) < start:
            gen.step()
        if not gen.has_unfinished():
            break
        out[f"{start}:{end}"] = profile_window(gen, end - start, plans, contexts, cfg)
        print(json.dumps({f"{start}:{end}": {k: v for k, v in out[f"{start}:{end}"].items()
                                             if k != "top_kernels_ms_per_step"}}), flush=True)
    while gen.has_unfinished():
        gen.step()
    del gen.scheduler.schedule
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=("smollm2", "8b"), default="8b")
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-fast-tokens", type=int, default=2048)
    ap.add_argument("--windows", default="40:50,700:710")
    ap.add_argument("--admission", choices=("arrival", "budget"), default="arrival")
    args = ap.parse_args()
    cfg = smollm2_shape() if args.model == "smollm2" else llama31_8b_config(max_position_embeddings=4096)
    weights = random_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    prompts, params = requests(args.num_requests, cfg.vocab_size)
    windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]
    # the requests' workload (the one requests() turns into prompts), for the benchmark's K/V sizing
    workload = sharegpt_like(args.num_requests, vocab_size=cfg.vocab_size, seed=0, length_scale=1.0)
    kv_tokens = kv_tokens_for(BenchModel(args.model, cfg, weights, description=""), workload, args.max_num_seqs)
    result: dict = {"args": vars(args), "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for use_graphs in (True, False):
        gen = DVRGenerator(weights, cfg, max_num_seqs=args.max_num_seqs, max_fast_tokens=args.max_fast_tokens,
                           use_cuda_graphs=use_graphs, kv_cache_tokens=kv_tokens,
                           scheduler=DefaultScheduler(admission=args.admission))
        if use_graphs:  # captures every graph the set needs, outside the profiled run
            for p, s in zip(prompts, params):
                gen.submit(p, s)
            while gen.has_unfinished():
                gen.step()
        key = "graphs" if use_graphs else "eager"
        result[key] = run(gen, prompts, params, windows, cfg)
        gen.close()
        del gen
        torch.cuda.empty_cache()
        seen = all(w["by_class_ms_per_step"].get("gemm", 0.0) > 0 for w in result[key].values())
        if use_graphs:
            result["graph_kernels_visible"] = seen
            if seen:
                break
        Path(args.out).write_text(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
