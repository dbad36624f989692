"""The fast decode attention's launch (key block, warps, stages) against its K/V bandwidth, at the 8B shape's decode
batches (round 47's profile: 44-47 % of a decode step at 2.2-2.5 TB/s, 0.72-0.83 of the copy rate).

    PYTHONPATH=src python3 benchmarks/device/decode_attention_sweep.py --out sweep.json
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/device/decode_attention_sweep.py --out s.json --smoke  # CPU

For each batch (sequences, their contexts drawn uniformly around a mean, shuffled pages of 16; 32 query heads,
8 kv heads, head dim 128, bf16) and each launch configuration, ``paged_decode_attention`` at its own split count
(``choose_num_splits``, as the engine calls it) is timed with CUDA events (median of ``--reps``), after the copy
ceiling is measured in the same process (``devicetime.measure_ceilings``). Per configuration: ms, K/V TB/s (every
visible key's K and V of one layer, once), its fraction of the copy rate, and how many rows' outputs differ in
any bit from the default launch's (its one-split bits are the canonical tile's: a new launch is measured for
rollbacks too before it is adopted). A diagnostic: the engine's constants are set by hand from it, not by it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench import devicetime  # noqa: E402
from llm42.kernels import attention  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
# (label, sequences, mean context): round 47's decode windows (309 / 354 / 256 rows at 475-543 positions), a full
# seat count, and the tail (37 rows at 1,325)
BATCHES = (("mid", 309, 475), ("mixed", 354, 534), ("full", 1024, 500), ("tail", 37, 1325))
SMOKE_BATCHES = (("smoke", 3, 40),)  # --smoke: the code path on the CPU under Triton's interpreter, two configs


def batch(num_seqs: int, mean_context: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    contexts = torch.randint(max(1, mean_context // 3), 2 * mean_context - mean_context // 3 + 1, (num_seqs,),
                             generator=g)
    max_blocks = -(-int(contexts.max()) // PAGE)
    pages = torch.randperm(num_seqs * max_blocks, generator=g).view(num_seqs, max_blocks)
    slots = num_seqs * max_blocks * PAGE
    k_cache = torch.randn(slots, NUM_KV_HEADS, HEAD_DIM, generator=g).to(device, torch.bfloat16)
    v_cache = torch.randn(slots, NUM_KV_HEADS, HEAD_DIM, generator=g).to(device, torch.bfloat16)
    q = torch.randn(num_seqs, NUM_HEADS, HEAD_DIM, generator=g).to(device, torch.bfloat16)
    return q, k_cache, v_cache, pages.to(device), contexts.to(device), int(contexts.sum()), int(contexts.max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--block-n", default="32,64,128")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    ceilings = devicetime.measure_ceilings(device)
    default = (attention.DECODE_BLOCK_N, attention.DECODE_WARPS, attention.DECODE_STAGES)
    configs = [default] + [c for c in itertools.product(*(map(int, a.split(",")) for a in (
        args.block_n, args.warps, args.stages))) if c != default]
    if args.smoke:
        configs = configs[:2]
    results: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                     "torch": torch.__version__, "ceilings": ceilings,
                     "default": default, "batches": {}}
    for label, num_seqs, mean_context in SMOKE_BATCHES if args.smoke else BATCHES:
        q, k_cache, v_cache, tables, contexts, num_keys, max_context = batch(num_seqs, mean_context, device)
        kv_bytes = num_keys * NUM_KV_HEADS * HEAD_DIM * 2 * 2  # K and V, bf16, one layer
        rows, reference = [], None
        for block_n, warps, stages in configs:
            attention.DECODE_BLOCK_N, attention.DECODE_WARPS, attention.DECODE_STAGES = block_n, warps, stages
            splits = attention.choose_num_splits(num_seqs, NUM_KV_HEADS, max_context, num_sms=attention.num_sms(device),
                                                 block_n=block_n)

            def run():
                return attention.paged_decode_attention(q, k_cache, v_cache, tables, contexts, block_size=PAGE,
                                                        scale=HEAD_DIM ** -0.5, num_splits=splits)
            try:
                out = run()
                ms = devicetime.median_ms(run, device, reps=2 if args.smoke else args.reps)
            except Exception as e:  # a launch the card cannot take (shared memory): recorded, not fatal
                rows.append({"block_n": block_n, "warps": warps, "stages": stages, "error": repr(e)[:200]})
                continue
            if reference is None:
                reference = out
            differ = int((out.view(torch.int16) != reference.view(torch.int16)).flatten(1).any(1).sum())
            tbps = kv_bytes / (ms * 1e-3) / 1e12
            rows.append({"block_n": block_n, "warps": warps, "stages": stages, "splits": splits, "ms": round(ms, 4),
                         "kv_TBps": round(tbps, 3), "of_copy": round(tbps * 1e3 / ceilings["copy_GBps"], 3),
                         "rows_with_other_bits": differ})
            print(json.dumps({"batch": label, **rows[-1]}), flush=True)
        attention.DECODE_BLOCK_N, attention.DECODE_WARPS, attention.DECODE_STAGES = default
        timed = [r for r in rows if "ms" in r]
        best = min(timed, key=lambda r: r["ms"])
        results["batches"][label] = {"num_seqs": num_seqs, "mean_context": mean_context, "kv_bytes": kv_bytes,
                                     "configs": rows, "best": best, "default_ms": timed[0]["ms"],
                                     "best_speedup": round(timed[0]["ms"] / best["ms"], 3)}
        Path(args.out).write_text(json.dumps(results, indent=1))
        print(json.dumps({"batch": label, "default_ms": timed[0]["ms"], "best": best}), flush=True)


if __name__ == "__main__":
    main()
