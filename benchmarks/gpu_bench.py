"""Kernel benchmark at the Llama-3.1-8B shape (bf16, seeded random weights, no checkpoint).

    PYTHONPATH=src python3 benchmarks/gpu_bench.py --out benchmarks/results/gpu_h200.json
    PYTHONPATH=src python3 benchmarks/gpu_bench.py --device cpu --model tiny --out /tmp/kernels_cpu.json  # smoke

Measures, with CUDA events (medians over repeated runs, after warm-up):

- the device's copy bandwidth and bf16 GEMM rate (the two ceilings);
- a fast decode step at batch 1, 8, 32, 64, 128, 256 with ~1K context per
  sequence, staged through the engine's device-resident ``DecodeState``: eager,
  replayed from its ``DecodeGraphs`` bucket incl. host staging, and the replay
  alone — against the weight-read floor (weight bytes / copy bandwidth) and the
  weight + K/V floor; the replay also with the row ops unfused;
- the canonical pass (``CanonicalPass``) at R = 128, 256, 512 rows (windows of 32
  rows at ~1K context): eager, captured incl. staging, replay alone and
  ``launch`` -> ``wait`` on its own stream, greedy and sampled; its time per
  committed token at full acceptance (captured pass / R);
- the attention kernels alone (one layer, device time inside a CUDA graph), against the bytes they read;
- the top-1/top-2 logit gap of the random model (how peaked its logits are).

Targets (issue 10): decode replay <= 1.25x the weight + K/V floor at batch >= 64;
canonical pass <= 0.05 ms per committed token at R = 512.
On the CPU (``--device cpu``) the same staging runs eagerly with a tiny model and
every graph-only figure is null: a smoke run of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402

from llm42.bench.devicetime import measure_ceilings, median_ms, write_json  # noqa: E402
from llm42.bench.models import tiny_config  # noqa: E402
from llm42.bench.passes import DecodeBench, canonical_segments, filled_kv, time_canonical_pass  # noqa: E402
from llm42.bench.roofline import model_sizes  # noqa: E402
from llm42.cuda_graphs import capture_graph  # noqa: E402
from llm42.model.config import llama31_8b_config  # noqa: E402
from llm42.model.forward import forward  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from llm42.params import SamplingParams  # noqa: E402
from llm42.policies import FastPolicy, FixedShapePolicy  # noqa: E402
from llm42.verify.canonical_pass import CanonicalPass  # noqa: E402

LM_HEAD_STD = 0.2
SIZES = {  # context, window, decode batches, canonical rows
    "8b": (1024, 32, (1, 8, 32, 64, 128, 256), (128, 256, 512)),
    "tiny": (32, 8, (1, 4), (8, 16)),
}


class UnfusedFastPolicy:
    """FastPolicy's five ReductionPolicy members alone, so the model runs the unfused torch row ops."""

    name = "fast_unfused"
    is_shape_closed = False
    is_graph_safe = True

    def __init__(self):
        self._fast = FastPolicy()
        self.linear = self._fast.linear
        self.rms_norm = self._fast.rms_norm
        self.attention = self._fast.attention
        self.process_logits = self._fast.process_logits


def bench_decode(weights, cfg, kv, *, batches, context, bandwidth_GBps, sizes, reps) -> tuple[list, float]:
    num_seqs = max(batches)
    t0 = time.perf_counter()
    fused = DecodeBench(weights, cfg, kv, FastPolicy(), num_seqs=num_seqs, context=context, use_cuda_graphs=True)
    unfused = DecodeBench(weights, cfg, kv, UnfusedFastPolicy(), num_seqs=num_seqs, context=context,
                          use_cuda_graphs=True)
    setup_s = time.perf_counter() - t0
    rows = []
    for batch in batches:
        row = fused.time(batch, reps=reps)
        row["context"] = context
        if fused.graphs is not None:
            unfused.stage(batch)
            row["graph_replay_unfused_ms"] = median_ms(lambda b=batch: unfused.replay(b), weights.device,
                                                       reps=reps, reset=unfused.reset)
        floor_w = sizes["weight_bytes_per_step"] / bandwidth_GBps / 1e6
        floor_wkv = (sizes["weight_bytes_per_step"] + batch * context * sizes["kv_bytes_per_token"]) \
            / bandwidth_GBps / 1e6
        replay, unfused_replay = row["graph_replay_ms"], row.get("graph_replay_unfused_ms")
        row.update({
            "weight_floor_ms": floor_w, "weight_kv_floor_ms": floor_wkv,
            "replay_over_weight_kv_floor": replay / floor_wkv if replay else None,
            "unfused_replay_over_weight_kv_floor": unfused_replay / floor_wkv if unfused_replay else None,
            "tokens_per_s_graph_step": batch / row["graph_step_ms"] * 1e3 if row["graph_step_ms"] else None,
        })
        rows.append(row)
        print(f"decode B={batch:4d}: eager {row['eager_step_ms']:7.2f} ms  graph step "
              f"{_fmt(row['graph_step_ms'])} ms  replay {_fmt(replay)} ms (unfused "
              f"{_fmt(row.get('graph_replay_unfused_ms'))})  floor(w+kv) {floor_wkv:6.3f}  replay/floor "
              f"{_fmt(row['replay_over_weight_kv_floor'])}", flush=True)
    return rows, setup_s


def bench_canonical(weights, cfg, kv, *, rows_list, window, context, reps) -> tuple[list, dict]:
    results, gap = [], {}
    for num_rows in rows_list:
        group = num_rows // window
        row = time_canonical_pass(weights, cfg, kv, window=window, group=group, context=context,
                                  use_cuda_graphs=True, reps=reps)
        results.append(row)
        print(f"canonical R={num_rows:4d}: eager {row['eager_pass_ms']:7.2f} ms  graph pass "
              f"{_fmt(row.get('graph_pass_ms'))} ms  replay {_fmt(row.get('graph_replay_ms'))} ms  launch/wait "
              f"{_fmt(row.get('launch_wait_ms'))} ms  per token {row['ms_per_committed_token']:6.4f} ms  "
              f"graph==eager {row.get('graph_equals_eager')}/{row.get('sampled_graph_equals_eager')}", flush=True)
        if num_rows == rows_list[-1]:
            segments = canonical_segments(cfg, window=window, group=group, context=context,
                                          params=SamplingParams(deterministic=True))
            policy = FixedShapePolicy()
            inputs = CanonicalPass(weights, cfg, policy, num_rows, use_graph=False).stage(segments, kv)
            top2 = forward(weights, cfg, inputs, kv.layers(), policy).float().topk(2, dim=-1).values
            g = top2[:, 0] - top2[:, 1]
            gap = {"median": g.median().item(), "p10": g.quantile(0.1).item(), "p90": g.quantile(0.9).item(),
                   "mean": g.mean().item(), "fraction_below_0.5": (g < 0.5).float().mean().item(),
                   "top1_median": top2[:, 0].median().item(), "rows": g.numel()}
        if weights.device.type == "cuda":
            torch.cuda.empty_cache()
    return results, gap


def bench_attention_kernels(kv, cfg, *, batches, rows_list, window, context, bandwidth_GBps) -> list[dict]:
    """One layer's attention alone: the decode kernel per batch, the canonical kernel per R (windows at ~1K)."""
    from llm42.kernels import canonical_attention, choose_num_splits, num_sms, paged_decode_attention

    k_cache, v_cache = kv.layers().k[0], kv.layers().v[0]
    scale = cfg.head_dim**-0.5
    kv_bytes = cfg.kv_size * k_cache.element_size() * 2  # one position's K and V, one layer
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []

    def graph_us(fn, calls: int = 20) -> float:
        fn()
        graph, _ = capture_graph(lambda: [fn() for _ in range(calls)], pool=None)
        return median_ms(graph.replay, torch.device("cuda"), reps=10) * 1e3 / calls

    for batch in batches:
        q = torch.randn(batch, cfg.num_heads, cfg.head_dim, device="cuda", generator=gen).to(k_cache.dtype)
        tables = torch.tensor([kv.block_table(rid) for rid in range(batch)], device="cuda")
        ctx = torch.full((batch,), context, device="cuda")
        us = graph_us(lambda: paged_decode_attention(q, k_cache, v_cache, tables, ctx, block_size=kv.block_size,
                                                     scale=scale, max_context_len=context))
        moved = batch * context * kv_bytes
        results.append({"kernel": "paged_decode", "batch": batch, "context": context, "us": us,
                        "num_splits": choose_num_splits(batch, cfg.num_kv_heads, context, num_sms=num_sms(q.device)),
                        "GBps": moved / us / 1e3, "fraction_of_copy_bw": moved / us / 1e3 / bandwidth_GBps})
    for num_rows in rows_list:
        group = num_rows // window
        q = torch.randn(num_rows, cfg.num_heads, cfg.head_dim, device="cuda", generator=gen).to(k_cache.dtype)
        positions = torch.arange(context - window, context, device="cuda").repeat(group)
        row_seq = torch.arange(group, device="cuda").repeat_interleave(window)
        tables = torch.tensor([kv.block_table(rid) for rid in range(group)], device="cuda")
        us = graph_us(lambda: canonical_attention(q, k_cache, v_cache, positions, row_seq, tables,
                                                  block_size=kv.block_size, scale=scale))
        unique = group * context * kv_bytes
        results.append({"kernel": "canonical", "rows": num_rows, "context": context, "us": us,
                        "unique_kv_GBps": unique / us / 1e3,
                        "kv_read_by_programs_GBps": num_rows * context * kv_bytes / us / 1e3})
    for r in results:
        print(f"attention {r['kernel']:13s} {r.get('batch', r.get('rows')):4d}: {r['us']:8.1f} us/layer", flush=True)
    return results


def _fmt(value) -> str:
    return "   -   " if value is None else f"{value:7.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", choices=sorted(SIZES), default=None, help="default: 8b on cuda, tiny on cpu")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers of the 8B shape (default 32)")
    parser.add_argument("--reps", type=int, default=None, help="timed calls per figure (default: 20 on cuda, 3 on cpu)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "gpu_h200.json")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_bench.py: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    model = args.model or ("8b" if device.type == "cuda" else "tiny")
    context, window, batches, rows_list = SIZES[model]
    reps = args.reps or (20 if device.type == "cuda" else 3)
    result = {
        "command": "PYTHONPATH=src python3 benchmarks/gpu_bench.py "
                   + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "is_smoke": device.type != "cuda",
    }
    if device.type == "cuda":
        import triton

        result["triton"] = triton.__version__
        result["num_sms"] = torch.cuda.get_device_properties(device).multi_processor_count
    ceilings = measure_ceilings(device)
    result["ceilings"] = ceilings
    result["copy_bandwidth_GBps"] = ceilings["copy_GBps"]
    result["bf16_matmul_tflops"] = ceilings["matmul_TFLOPs"]
    print(f"{result['device']}: copy {ceilings['copy_GBps']:.0f} GB/s, GEMM {ceilings['matmul_TFLOPs']:.1f} TFLOP/s",
          flush=True)

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    max_positions = 2 * context
    if model == "8b":
        cfg = llama31_8b_config(max_position_embeddings=max_positions, num_layers=args.layers or 32)
    else:
        cfg = tiny_config(max_positions)
    t0 = time.perf_counter()
    lm_head_std = LM_HEAD_STD if model == "8b" else None
    weights = random_weights(cfg, seed=0, dtype=dtype, device=device, lm_head_std=lm_head_std)
    if device.type == "cuda":
        torch.cuda.synchronize()
    sizes = model_sizes(weights, cfg)
    result["model"] = {"shape": "Llama-3.1-8B" if model == "8b" else "tiny", "layers": cfg.num_layers,
                       "dtype": str(dtype).removeprefix("torch."), "weight_init_s": time.perf_counter() - t0,
                       "lm_head_std": lm_head_std, **sizes}

    kv = filled_kv(cfg, weights, num_seqs=max(batches), context=context)
    result["decode"], result["decode_setup_s"] = bench_decode(
        weights, cfg, kv, batches=batches, context=context, bandwidth_GBps=ceilings["copy_GBps"], sizes=sizes,
        reps=reps)
    if device.type == "cuda":
        result["attention_kernels"] = bench_attention_kernels(
            kv, cfg, batches=[b for b in batches if b <= 128], rows_list=rows_list, window=window, context=context,
            bandwidth_GBps=ceilings["copy_GBps"])
    result["canonical"], result["logit_gap"] = bench_canonical(weights, cfg, kv, rows_list=rows_list, window=window,
                                                               context=context, reps=reps)
    result["logit_gap"]["lm_head_std"] = result["model"]["lm_head_std"]
    at_128 = next((r for r in result["decode"] if r["batch"] == 128), None)
    if at_128 is not None and at_128["graph_step_ms"]:
        result["fast_ms_per_token_at_batch_128"] = at_128["graph_step_ms"] / 128
    result["targets"] = {
        "decode_replay_over_floor_at_batch_ge_64": {
            str(r["batch"]): r["replay_over_weight_kv_floor"] for r in result["decode"] if r["batch"] >= 64},
        "decode_replay_over_floor_goal": 1.25,
        "canonical_ms_per_committed_token_at_max_R": result["canonical"][-1]["ms_per_committed_token"],
        "canonical_ms_per_committed_token_goal": 0.05,
    }
    write_json(args.out, result)
    print(json.dumps(result["targets"], indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
