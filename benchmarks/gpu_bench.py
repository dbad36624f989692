"""GPU benchmark at the Llama-3.1-8B shape (bf16, seeded random weights, no checkpoint).

    PYTHONPATH=src python3 benchmarks/gpu_bench.py --out benchmarks/results/gpu_h200.json

Measures, with CUDA events (medians over repeated runs, after warm-up):

- the device's copy bandwidth and bf16 GEMM rate (the two ceilings);
- a fast decode step at batch 1, 8, 32, 64, 128 with ~1K context per sequence,
  eager and replayed from its CUDA graph bucket, against the weight-read floor
  (weight bytes / copy bandwidth) and the weight + K/V floor; the replay also
  with the row ops unfused (plain torch ops, as before the fused kernels);
- the canonical pass at R = 128, 256, 512 rows (windows of 32 rows at ~1K
  context), eager and graph-replayed, and its time per committed token at full
  acceptance (pass time / R);
- the attention kernels alone (one layer, device time inside a CUDA graph), against the bytes they read;
- the top-1/top-2 logit gap of the random model (how peaked its logits are).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

from llm42.kernels import canonical_attention, choose_num_splits, num_sms, paged_decode_attention
from llm42.kv_store import KVStore
from llm42.model.config import llama31_8b_config
from llm42.model.forward import forward
from llm42.model.weights import random_weights
from llm42.params import SamplingParams
from llm42.policies import FastPolicy, FixedShapePolicy
from llm42.runner import ModelRunner, Segment
from llm42.verify.graph import CanonicalGraph, DecodeGraphs, capture_graph

CONTEXT = 1024
WINDOW = 32
DECODE_BATCHES = (1, 8, 32, 64, 128)
CANONICAL_ROWS = (128, 256, 512)
LM_HEAD_STD = 0.2


def median_ms(fn, *, warmup: int = 3, reps: int = 20) -> float:
    """Median wall time of ``fn`` on the device timeline (CUDA events), host launch gaps included."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_us(fn, *, calls: int = 20, reps: int = 10) -> float:
    """Device time of one ``fn()`` in microseconds: ``calls`` launches captured in a CUDA graph, median replay."""
    fn()
    graph, _ = capture_graph(lambda: [fn() for _ in range(calls)], pool=None)
    return median_ms(graph.replay, reps=reps) * 1e3 / calls


def copy_bandwidth_gbps() -> float:
    src = torch.randn(1 << 29, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=10)
    return 2 * src.numel() * src.element_size() / ms / 1e6  # bytes read + written


def matmul_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda: a @ b, reps=10)
    return 2 * 8192**3 / ms / 1e9


def weight_bytes(weights) -> dict[str, int]:
    layers = sum(t.numel() * t.element_size() for lw in weights.layers
                 for t in vars(lw).values() if isinstance(t, torch.Tensor))
    head = weights.lm_head.numel() * weights.lm_head.element_size()
    embed = weights.embed.numel() * weights.embed.element_size()
    return {"total": layers + head + embed + weights.norm.numel() * 2, "read_per_step": layers + head}


class UnfusedFastPolicy:
    """FastPolicy's five ReductionPolicy members alone, so the model runs the unfused torch row ops."""

    name = "fast_unfused"
    is_shape_closed = False

    def __init__(self):
        self._fast = FastPolicy()
        self.linear = self._fast.linear
        self.rms_norm = self._fast.rms_norm
        self.attention = self._fast.attention
        self.process_logits = self._fast.process_logits


def bench_decode(runner, kv, num_seqs_max, bandwidth, bytes_read, kv_bytes_per_token) -> tuple[list, float]:
    cfg = runner.cfg
    fast = FastPolicy()
    params = SamplingParams()
    t0 = time.perf_counter()
    graphs = DecodeGraphs(runner, fast, kv, max_batch_size=num_seqs_max)
    graphs.capture()
    capture_s = time.perf_counter() - t0
    unfused_graphs = DecodeGraphs(runner, UnfusedFastPolicy(), kv, max_batch_size=num_seqs_max)
    rows_out = []
    for batch in DECODE_BATCHES:
        segments = [Segment(rid, (rid * 7 % cfg.vocab_size,), CONTEXT - 1, params, 0) for rid in range(batch)]
        rows = runner.sampling_rows([(params, 0, CONTEXT)] * batch, batch)

        def eager_forward():
            forward(runner.weights, cfg, runner.fast_inputs(segments, kv), kv.layers(), fast)

        runner.decode_graphs = None
        eager_step = median_ms(lambda: runner.run_fast(segments, kv, fast, rows))
        eager_fwd = median_ms(eager_forward)
        runner.decode_graphs = graphs
        graph_step = median_ms(lambda: runner.run_fast(segments, kv, fast, rows))
        graphs.forward(segments, kv)  # stage this batch
        replay = median_ms(lambda: graphs.replay(batch))
        unfused_graphs.forward(segments, kv)
        unfused_replay = median_ms(lambda: unfused_graphs.replay(batch))
        runner.decode_graphs = None
        floor_w = bytes_read / bandwidth / 1e6
        floor_wkv = (bytes_read + batch * CONTEXT * kv_bytes_per_token) / bandwidth / 1e6
        rows_out.append({
            "batch": batch, "bucket": graphs.bucket_for(batch), "context": CONTEXT,
            "eager_step_ms": eager_step, "eager_forward_ms": eager_fwd,
            "graph_step_ms": graph_step, "graph_replay_ms": replay,
            "weight_floor_ms": floor_w, "weight_kv_floor_ms": floor_wkv,
            "replay_over_weight_kv_floor": replay / floor_wkv,
            "graph_replay_unfused_ms": unfused_replay,
            "unfused_replay_over_weight_kv_floor": unfused_replay / floor_wkv,
            "tokens_per_s_graph_step": batch / graph_step * 1e3,
        })
        print(f"decode B={batch:4d}: eager step {eager_step:7.2f} ms  graph step {graph_step:7.2f} ms  "
              f"replay {replay:7.2f} ms (unfused {unfused_replay:7.2f})  floor(w) {floor_w:5.2f}  "
              f"floor(w+kv) {floor_wkv:5.2f}  replay/floor {replay / floor_wkv:4.2f}", flush=True)
    return rows_out, capture_s


def bench_canonical(runner, kv) -> tuple[list, dict]:
    cfg = runner.cfg
    policy = FixedShapePolicy()
    rows_out = []
    gap = {}
    for num_rows in CANONICAL_ROWS:
        group = num_rows // WINDOW
        greedy = SamplingParams(deterministic=True)
        segments = [Segment(rid, tuple((rid * 31 + i) % cfg.vocab_size for i in range(WINDOW)), CONTEXT - WINDOW,
                            greedy, 0) for rid in range(group)]
        per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
        sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=5, deterministic=True)
        per_row_sampled = [(sampled, 5, q) for _, _, q in per_row]

        def eager_pass(per_row=per_row):
            inputs = runner.canonical_inputs(segments, kv, num_rows)
            return runner.run(inputs, kv, policy, runner.sampling_rows(per_row, num_rows))

        graph = CanonicalGraph(runner, policy, num_rows)
        t0 = time.perf_counter()
        graph.canonical_inputs(segments, kv, num_rows)  # binds the K/V store and captures the forward
        graph.sampling_rows(per_row, num_rows)
        graph.replay()  # captures the greedy sampler
        torch.cuda.synchronize()
        capture_s = time.perf_counter() - t0

        def graph_pass(per_row=per_row):
            inputs = graph.canonical_inputs(segments, kv, num_rows)
            return graph.run(inputs, kv, policy, graph.sampling_rows(per_row, num_rows))

        eager_ms = median_ms(eager_pass)
        graph_ms = median_ms(graph_pass)
        replay_ms = median_ms(graph.replay)
        same_greedy = eager_pass() == graph_pass()
        sampled_eager_ms = median_ms(lambda: eager_pass(per_row_sampled))
        sampled_graph_ms = median_ms(lambda: graph_pass(per_row_sampled))
        same_sampled = eager_pass(per_row_sampled) == graph_pass(per_row_sampled)
        flops = 2 * num_rows * sum(t.numel() for lw in runner.weights.layers
                                   for t in vars(lw).values() if isinstance(t, torch.Tensor))
        flops += 2 * num_rows * runner.weights.lm_head.numel()
        rows_out.append({
            "rows": num_rows, "window": WINDOW, "group": group, "context": CONTEXT, "graph_capture_s": capture_s,
            "eager_pass_ms": eager_ms, "graph_pass_ms": graph_ms, "graph_replay_ms": replay_ms,
            "graph_ms_per_committed_token": graph_ms / num_rows,
            "sampled_eager_pass_ms": sampled_eager_ms, "sampled_graph_pass_ms": sampled_graph_ms,
            "graph_equals_eager_greedy": same_greedy, "graph_equals_eager_sampled": same_sampled,
            "gemm_tflop": flops / 1e12,
        })
        print(f"canonical R={num_rows:4d}: eager {eager_ms:7.2f} ms  graph {graph_ms:7.2f} ms  replay "
              f"{replay_ms:7.2f} ms  per token {graph_ms / num_rows:6.3f} ms  graph==eager {same_greedy}"
              f"/{same_sampled}", flush=True)
        if num_rows == CANONICAL_ROWS[-1]:
            logits = forward(runner.weights, cfg, runner.canonical_inputs(segments, kv, num_rows), kv.layers(), policy)
            top2 = logits.float().topk(2, dim=-1).values
            g = top2[:, 0] - top2[:, 1]
            gap = {"median": g.median().item(), "p10": g.quantile(0.1).item(), "p90": g.quantile(0.9).item(),
                   "mean": g.mean().item(), "fraction_below_0.5": (g < 0.5).float().mean().item(),
                   "top1_median": top2[:, 0].median().item(), "lm_head_std": LM_HEAD_STD, "rows": g.numel()}
        del graph
        torch.cuda.empty_cache()
    return rows_out, gap


def bench_attention_kernels(kv, cfg, bandwidth) -> list[dict]:
    """One layer's attention alone: the decode kernel per batch, the canonical kernel per R (windows at ~1K)."""
    k_cache, v_cache = kv.layers().k[0], kv.layers().v[0]
    scale = cfg.head_dim**-0.5
    kv_bytes = cfg.kv_size * k_cache.element_size() * 2  # one position's K and V, one layer
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for batch in DECODE_BATCHES:
        q = torch.randn(batch, cfg.num_heads, cfg.head_dim, device="cuda", generator=gen).to(torch.bfloat16)
        tables = torch.tensor([kv.block_table(rid) for rid in range(batch)], device="cuda")
        ctx = torch.full((batch,), CONTEXT, device="cuda")
        us = graph_us(lambda: paged_decode_attention(q, k_cache, v_cache, tables, ctx, block_size=kv.block_size,
                                                     scale=scale, max_context_len=CONTEXT))
        moved = batch * CONTEXT * kv_bytes
        results.append({"kernel": "paged_decode", "batch": batch, "context": CONTEXT, "us": us,
                        "num_splits": choose_num_splits(batch, cfg.num_kv_heads, CONTEXT, num_sms=num_sms(q.device)),
                        "GBps": moved / us / 1e3, "fraction_of_copy_bw": moved / us / 1e3 / bandwidth})
    for num_rows in CANONICAL_ROWS:
        group = num_rows // WINDOW
        q = torch.randn(num_rows, cfg.num_heads, cfg.head_dim, device="cuda", generator=gen).to(torch.bfloat16)
        positions = torch.arange(CONTEXT - WINDOW, CONTEXT, device="cuda").repeat(group)
        row_seq = torch.arange(group, device="cuda").repeat_interleave(WINDOW)
        tables = torch.tensor([kv.block_table(rid) for rid in range(group)], device="cuda")
        us = graph_us(lambda: canonical_attention(q, k_cache, v_cache, positions, row_seq, tables,
                                                  block_size=kv.block_size, scale=scale))
        unique = group * CONTEXT * kv_bytes
        results.append({"kernel": "canonical", "rows": num_rows, "context": CONTEXT, "us": us,
                        "unique_kv_GBps": unique / us / 1e3,
                        "kv_read_by_programs_GBps": num_rows * CONTEXT * kv_bytes / us / 1e3})
    for r in results:
        print(f"attention {r['kernel']:13s} {r.get('batch', r.get('rows')):4d}: {r['us']:8.1f} us/layer", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (32 = the real depth)")
    parser.add_argument("--out", default="benchmarks/results/gpu_h200.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_bench.py needs a CUDA device")
    props = torch.cuda.get_device_properties(0)
    result = {
        "command": "PYTHONPATH=src python3 " + " ".join(shlex.quote(a) for a in sys.argv),
        "device": torch.cuda.get_device_name(0), "num_sms": props.multi_processor_count,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    bandwidth = copy_bandwidth_gbps()
    result["copy_bandwidth_GBps"] = bandwidth
    result["bf16_matmul_tflops"] = matmul_tflops()
    print(f"{result['device']}: copy {bandwidth:.0f} GB/s, bf16 GEMM {result['bf16_matmul_tflops']:.0f} TFLOP/s",
          flush=True)

    cfg = llama31_8b_config(max_position_embeddings=2048, num_layers=args.layers)
    t0 = time.perf_counter()
    weights = random_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda", lm_head_std=LM_HEAD_STD)
    torch.cuda.synchronize()
    sizes = weight_bytes(weights)
    result["model"] = {"shape": "Llama-3.1-8B", "layers": cfg.num_layers, "dtype": "bfloat16",
                       "weight_init_s": time.perf_counter() - t0, "weight_bytes": sizes["total"],
                       "weight_bytes_read_per_decode_step": sizes["read_per_step"]}

    num_seqs = max(DECODE_BATCHES)
    block_size = 16
    blocks_per_seq = -(-(CONTEXT + 64) // block_size)
    kv = KVStore(cfg, num_blocks=num_seqs * blocks_per_seq + 16, block_size=block_size, num_scratch_slots=512,
                 dtype=torch.bfloat16, device="cuda")
    for layer in range(cfg.num_layers):  # random K/V, never zeros
        kv.layers().k[layer].normal_()
        kv.layers().v[layer].normal_()
    for rid in range(num_seqs):
        kv.allocate(rid, CONTEXT + 64)
        kv.append(rid, CONTEXT)
    runner = ModelRunner(weights, cfg)
    kv_bytes_per_token = 2 * cfg.num_layers * cfg.kv_size * 2

    result["decode"], result["decode_graph_capture_s"] = bench_decode(
        runner, kv, num_seqs, bandwidth, sizes["read_per_step"], kv_bytes_per_token)
    result["attention_kernels"] = bench_attention_kernels(kv, cfg, bandwidth)
    result["canonical"], result["logit_gap"] = bench_canonical(runner, kv)
    result["fast_ms_per_token_at_batch_128"] = result["decode"][-1]["graph_step_ms"] / result["decode"][-1]["batch"]

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("decode", "canonical", "attention_kernels")},
                     indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
