"""A decode step whole, against the same step cut in two halves with one half's attention beside the other half's
GEMMs (``FastPolicy(overlap_decode=True)``, ``model.forward.forward_layers_overlapped``), at the 8B shape.

    PYTHONPATH=src python3 benchmarks/device/decode_overlap_ab.py --out overlap.json
    PYTHONPATH=src python3 benchmarks/device/decode_overlap_ab.py --out o.json --smoke   # the CPU, a tiny model

Round 47's profile: an 8B decode step at ~300 rows spends 7.3-8.1 ms in GEMMs (compute-bound, 543-595 TFLOP/s)
and 7.7-7.9 ms in the decode attention (K/V reads at 2.4 TB/s), one after the other. Per batch (ShareGPT-like
running contexts, pages shuffled, random K/V; random bf16 weights), three forwards, each captured in a CUDA graph
and replayed in turn (ABC ABC ..., CUDA events, medians of ``--reps``): ``whole`` (the tree's step),
``overlap`` (the halves, the attentions on a second stream), ``split_serial`` (the same halves and schedule on one
stream: what cutting the batch costs the GEMMs, without the overlap). The bits: the overlapped graph's logits
against the halves run eagerly alone (must be equal), and whether they equal the whole step's (not required:
the fast path's bits follow the batch). A diagnostic for the engine's switch, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench import devicetime, workloads  # noqa: E402
from llm42.cuda_graphs import capture_graph  # noqa: E402
from llm42.inputs import StepInputs  # noqa: E402
from llm42.model.config import llama31_8b_config  # noqa: E402
from llm42.model.forward import KVLayers, forward  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from llm42.policies import FastPolicy  # noqa: E402

PAGE = 16


class _SerialOverlap(FastPolicy):
    """``overlap_decode`` with the halves' attentions on the caller's stream: the schedule without the overlap."""

    def overlap_stream(self, device):
        return torch.cuda.current_stream(device)


def contexts_for(num_seqs: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [workloads.SHAREGPT_INPUT.sample(rng) + rng.randint(1, workloads.SHAREGPT_OUTPUT.sample(rng))
            for _ in range(num_seqs)]


def decode_step(cfg, contexts: list[int], device, seed: int) -> tuple[StepInputs, KVLayers]:
    g = torch.Generator().manual_seed(seed)
    num_seqs = len(contexts)
    max_blocks = -(-max(contexts) // PAGE)
    tables = torch.randperm(num_seqs * max_blocks, generator=g).view(num_seqs, max_blocks)
    ctx = torch.tensor(contexts)
    positions = ctx - 1
    slots = tables.gather(1, (positions // PAGE).unsqueeze(1)).squeeze(1) * PAGE + positions % PAGE
    num_slots = num_seqs * max_blocks * PAGE
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kv = KVLayers([torch.randn(num_slots, cfg.num_kv_heads, cfg.head_dim, generator=g).to(device, dtype)
                   for _ in range(cfg.num_layers)],
                  [torch.randn(num_slots, cfg.num_kv_heads, cfg.head_dim, generator=g).to(device, dtype)
                   for _ in range(cfg.num_layers)], PAGE)
    inputs = StepInputs(
        token_ids=torch.randint(0, cfg.vocab_size, (num_seqs,), generator=g).to(device),
        positions=positions.to(device), slot_mapping=slots.to(device), row_seq=torch.arange(num_seqs, device=device),
        block_tables=tables.to(device), context_lens=ctx.to(device), seq_starts=tuple(range(num_seqs + 1)),
        max_context_len=max(contexts),
    )
    return inputs, kv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="128,256,320,384,512")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="the CPU, a two-layer model, eager (no graphs)")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:
        from llm42.model.config import ModelConfig, RopeConfig

        cfg = ModelConfig(family="llama", vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=4096,
                          rms_norm_eps=1e-5, rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1)
        weights = random_weights(cfg, seed=0)
    else:
        cfg = llama31_8b_config(max_position_embeddings=4096)
        weights = random_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    policies = {"whole": FastPolicy(), "overlap": FastPolicy(overlap_decode=True, overlap_min_rows=2),
                "split_serial": _SerialOverlap(overlap_decode=True, overlap_min_rows=2)}
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "model": "llama31_8b shape (random bf16 weights)" if not args.smoke else "tiny (smoke)",
           "ceilings": devicetime.measure_ceilings(device), "batches": {}}
    print(json.dumps(out["ceilings"]), flush=True)
    pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
    for num_seqs in [int(b) for b in args.batches.split(",")]:
        contexts = contexts_for(num_seqs, seed=num_seqs)
        inputs, kv = decode_step(cfg, contexts, device, seed=num_seqs)
        runs, logits = {}, {}
        for name, policy in policies.items():
            if device.type == "cuda":
                graph, static = capture_graph(lambda p=policy: forward(weights, cfg, inputs, kv, p), pool)
                runs[name], logits[name] = graph.replay, static
            else:
                runs[name] = lambda p=policy: logits.__setitem__(p, forward(weights, cfg, inputs, kv, p))
                logits[name] = forward(weights, cfg, inputs, kv, policy)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.reps):  # in turn: the three see the same device state, rep by rep
            for name, run in runs.items():
                times[name].append(devicetime.median_ms(run, device, warmup=0, reps=1))
        first, second = inputs.split_decode(num_seqs // 2)
        alone = torch.cat([forward(weights, cfg, half, kv, FastPolicy()) for half in (first, second)])
        if device.type == "cuda":
            runs["overlap"]()
            torch.cuda.synchronize()
        ms = {name: statistics.median(t) for name, t in times.items()}
        row = {"num_seqs": num_seqs, "mean_context": sum(contexts) / num_seqs, "max_context": max(contexts),
               "ms": ms, "ms_all": times, "whole_over_overlap": ms["whole"] / ms["overlap"],
               "whole_over_split_serial": ms["whole"] / ms["split_serial"],
               "overlap_equals_halves_alone": bool(torch.equal(logits["overlap"], alone)),
               "split_serial_equals_halves_alone": bool(torch.equal(logits["split_serial"], alone)),
               "overlap_equals_whole": bool(torch.equal(logits["overlap"], logits["whole"]))}
        out["batches"][str(num_seqs)] = row
        print(json.dumps({k: v for k, v in row.items() if k != "ms_all"}), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        del runs, logits, kv, inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
