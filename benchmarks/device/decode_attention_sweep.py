"""The fast decode attention's launch (key block, warps, stages, program order) against its K/V bandwidth, at the 8B
shape's decode batches (round 47's profile: 44-47 % of a decode step at 2.2-2.5 TB/s, 0.72-0.83 of the copy rate).

    PYTHONPATH=src python3 benchmarks/device/decode_attention_sweep.py --out sweep.json
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/device/decode_attention_sweep.py --out s.json --smoke  # CPU

For each batch (sequences, their contexts drawn uniformly around a mean, or as a ShareGPT-like running batch: a
prompt and part of an output from the serving workload's log-normals; shuffled pages of 16; 32 query heads,
8 kv heads, head dim 128, bf16) and each launch configuration and program order (``--orders``: ``seq``, the
grid sequence-major, the engine's default until round 49; ``head``, a sequence's kv heads adjacent;
``head_longest``, also the longest contexts dispatched first, ``inputs.longest_first`` as
``StepInputs.decode_order``: round 48's, the engine's default since round 49; ``kernels.attention.DECODE_ORDERS``),
``paged_decode_attention`` at its own split count
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
import random
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench import devicetime, workloads  # noqa: E402
from llm42.inputs import longest_first  # noqa: E402
from llm42.kernels import attention  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
# (label, sequences, mean context): round 47's decode windows (309 / 354 / 256 rows at 475-543 positions), a full
# seat count, and the tail (37 rows at 1,325); then ShareGPT-like running batches (mean_context None)
BATCHES = (("mid", 309, 475), ("mixed", 354, 534), ("full", 1024, 500), ("tail", 37, 1325),
           ("sharegpt_320", 320, None), ("sharegpt_1024", 1024, None), ("sharegpt_64", 64, None))
SMOKE_BATCHES = (("smoke", 3, 40), ("smoke_sharegpt", 3, None))  # --smoke: the CPU under the interpreter
# --batches tails: small batches of long contexts, the launches with several splits (round 50: at round 47's tail,
# 37 sequences, longest-first took 0.180 ms against 0.129 for the sequence-major grid; is that the rule there?)
TAIL_BATCHES = (("tail", 37, 1325), ("tail_seed1", 37, 1325, 1), ("tail_seed2", 37, 1325, 2), ("tail_16", 16, 1500),
                ("tail_24", 24, 1400), ("tail_48", 48, 1200), ("tail_96", 96, 1000), ("sharegpt_32", 32, None),
                ("sharegpt_64", 64, None), ("sharegpt_128", 128, None))


def sharegpt_contexts(num_seqs: int, seed: int) -> torch.Tensor:
    """Contexts of a running ShareGPT-like batch: a prompt and a uniform share of an output (the serving
    workload's log-normals)."""
    rng = random.Random(seed)
    return torch.tensor([workloads.SHAREGPT_INPUT.sample(rng) + rng.randint(1, workloads.SHAREGPT_OUTPUT.sample(rng))
                         for _ in range(num_seqs)])


def batch(num_seqs: int, mean_context: int | None, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if mean_context is None:
        contexts = sharegpt_contexts(num_seqs, seed)
    else:
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
    ap.add_argument("--orders", default=",".join(attention.DECODE_ORDERS))
    ap.add_argument("--batches", choices=("default", "tails"), default="default",
                    help="BATCHES (round 47's windows, ShareGPT batches) or TAIL_BATCHES (small, several splits)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    ceilings = devicetime.measure_ceilings(device)
    default = (attention.DECODE_BLOCK_N, attention.DECODE_WARPS, attention.DECODE_STAGES)
    default_head_major = attention.DECODE_HEAD_MAJOR
    orders = args.orders.split(",")
    if unknown := set(orders) - set(attention.DECODE_ORDERS):
        ap.error(f"--orders: unknown {sorted(unknown)}, known {list(attention.DECODE_ORDERS)}")
    configs = [default] + [c for c in itertools.product(*(map(int, a.split(",")) for a in (
        args.block_n, args.warps, args.stages))) if c != default]
    if args.smoke:
        configs = configs[:2]
    results: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                     "torch": torch.__version__, "ceilings": ceilings,
                     "default": default, "orders": {k: attention.DECODE_ORDERS[k] for k in orders}, "batches": {}}
    for label, num_seqs, mean_context, *seed in (SMOKE_BATCHES if args.smoke else
                                                  TAIL_BATCHES if args.batches == "tails" else BATCHES):
        q, k_cache, v_cache, tables, contexts, num_keys, max_context = batch(num_seqs, mean_context, device,
                                                                             seed=seed[0] if seed else 0)
        kv_bytes = num_keys * NUM_KV_HEADS * HEAD_DIM * 2 * 2  # K and V, bf16, one layer
        order_of = {False: None, True: longest_first(contexts)}
        rows, reference = [], None
        for (block_n, warps, stages), order_name in itertools.product(configs, orders):
            attention.DECODE_BLOCK_N, attention.DECODE_WARPS, attention.DECODE_STAGES = block_n, warps, stages
            attention.DECODE_HEAD_MAJOR, is_longest_first = attention.DECODE_ORDERS[order_name]
            splits = attention.choose_num_splits(num_seqs, NUM_KV_HEADS, max_context, num_sms=attention.num_sms(device),
                                                 block_n=block_n)
            launch = {"block_n": block_n, "warps": warps, "stages": stages, "order": order_name}

            def run():
                return attention.paged_decode_attention(q, k_cache, v_cache, tables, contexts, block_size=PAGE,
                                                        scale=HEAD_DIM ** -0.5, num_splits=splits,
                                                        order=order_of[is_longest_first])
            try:
                out = run()
                ms = devicetime.median_ms(run, device, reps=2 if args.smoke else args.reps)
            except Exception as e:  # a launch the card cannot take (shared memory): recorded, not fatal
                rows.append({**launch, "error": repr(e)[:200]})
                continue
            if reference is None:
                reference = out
            differ = int((out.view(torch.int16) != reference.view(torch.int16)).flatten(1).any(1).sum())
            tbps = kv_bytes / (ms * 1e-3) / 1e12
            rows.append({**launch, "splits": splits, "ms": round(ms, 4), "kv_TBps": round(tbps, 3),
                         "of_copy": round(tbps * 1e3 / ceilings["copy_GBps"], 3), "rows_with_other_bits": differ})
            print(json.dumps({"batch": label, **rows[-1]}), flush=True)
        attention.DECODE_BLOCK_N, attention.DECODE_WARPS, attention.DECODE_STAGES = default
        attention.DECODE_HEAD_MAJOR = default_head_major
        timed = [r for r in rows if "ms" in r]
        best = min(timed, key=lambda r: r["ms"])
        at_default = {r["order"]: r["ms"] for r in timed if (r["block_n"], r["warps"], r["stages"]) == default}
        engine_order = next(k for k, v in attention.DECODE_ORDERS.items()
                            if v == (default_head_major, attention.DECODE_LONGEST_FIRST))
        engine = at_default.get(engine_order, timed[0]["ms"])
        results["batches"][label] = {
            "num_seqs": num_seqs, "mean_context": mean_context, "contexts": {
                "mean": round(float(contexts.float().mean()), 1), "max": max_context,
                "p90": int(contexts.float().quantile(0.9))},
            "kv_bytes": kv_bytes, "configs": rows, "best": best, "default_config_ms_by_order": at_default,
            "order_speedup_over_seq": {k: round(at_default["seq"] / v, 3) for k, v in at_default.items()
                                       if "seq" in at_default},
            "best_speedup_over_engine_default": round(engine / best["ms"], 3)}
        Path(args.out).write_text(json.dumps(results, indent=1))
        print(json.dumps({"batch": label, "by_order": at_default, "best": best}), flush=True)


if __name__ == "__main__":
    main()
