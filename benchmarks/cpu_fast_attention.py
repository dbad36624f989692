"""The fast path's CPU attention (``padded_attention``): grouped-query layout vs copying K/V per query head.

Until round 3 the CPU fast path expanded each kv head's keys and values to every query
head it serves (``repeat_interleave``) before SDPA. Today's ``padded_attention`` stacks
the query heads of one kv head as extra query rows instead, so K/V are gathered once.
This times both, side by side in one process (medians of 15 alternating calls, one
thread), on decode and prefill shapes, and checks they agree to float rounding.

    python benchmarks/cpu_fast_attention.py [--out benchmarks/results/cpu_fast_attention.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from llm42.inputs import StepInputs
from llm42.ops import attention

BLOCK_SIZE = 16
SCALE = 0.125
# (sequences, query rows each, context, query heads, kv heads, head dim): stories260K-like decode,
# SmolLM2-135M-like decode (9/3 heads of 64) and a SmolLM2-like prefill chunk
SHAPES = [(256, 1, 70, 8, 4, 16), (64, 1, 512, 9, 3, 64), (4, 64, 256, 9, 3, 64)]


def _inputs(num_seqs: int, num_q: int, context: int, hq: int, hkv: int, d: int):
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_slots = num_seqs * blocks_per_seq * BLOCK_SIZE
    k_cache, v_cache = torch.randn(num_slots, hkv, d), torch.randn(num_slots, hkv, d)
    num_rows = num_seqs * num_q
    inputs = StepInputs(
        token_ids=torch.zeros(num_rows, dtype=torch.int64),
        positions=(torch.arange(num_q) + context - num_q).repeat(num_seqs),
        slot_mapping=torch.zeros(num_rows, dtype=torch.int64),
        row_seq=torch.arange(num_seqs).repeat_interleave(num_q),
        block_tables=torch.arange(num_seqs * blocks_per_seq).reshape(num_seqs, blocks_per_seq),
        context_lens=torch.full((num_seqs,), context),
        seq_starts=tuple(range(0, num_rows + 1, num_q)),
        max_context_len=context,
    )
    return torch.randn(num_rows, hq, d), k_cache, v_cache, inputs


def repeated_kv_attention(q, k_cache, v_cache, inputs: StepInputs) -> torch.Tensor:
    """The previous layout, for comparison: K/V copied to every query head before SDPA."""
    num_rows, num_heads, head_dim = q.shape
    num_seqs, max_q, max_k = inputs.num_seqs, inputs.max_query_len, inputs.max_context_len
    starts = torch.tensor(inputs.seq_starts[:-1])
    row_offset = torch.arange(num_rows) - starts[inputs.row_seq]
    q_pad = q.new_zeros(num_seqs, max_q, num_heads, head_dim)
    q_pad[inputs.row_seq, row_offset] = q
    query_pos = torch.full((num_seqs, max_q), max_k, dtype=torch.int64)
    query_pos[inputs.row_seq, row_offset] = inputs.positions
    key_pos = torch.arange(max_k)
    slots = attention._slots(inputs.block_tables, key_pos, BLOCK_SIZE)
    mask = attention._visible(key_pos, query_pos, None) & (key_pos < inputs.context_lens[:, None, None])
    groups = num_heads // k_cache.shape[1]
    k = k_cache[slots].transpose(1, 2).repeat_interleave(groups, dim=1)
    v = v_cache[slots].transpose(1, 2).repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q_pad.transpose(1, 2), k, v, attn_mask=mask[:, None], scale=SCALE)
    return out.transpose(1, 2)[inputs.row_seq, row_offset]


def grouped_attention(q, k_cache, v_cache, inputs: StepInputs) -> torch.Tensor:
    return attention.padded_attention(q, k_cache, v_cache, inputs, block_size=BLOCK_SIZE, scale=SCALE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu_fast_attention.json"))
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rows = []
    for shape in SHAPES:
        q, k_cache, v_cache, inputs = _inputs(*shape)
        max_err = (repeated_kv_attention(q, k_cache, v_cache, inputs)
                   - grouped_attention(q, k_cache, v_cache, inputs)).abs().max().item()
        times = {"repeated_kv": [], "grouped": []}
        for _ in range(args.repeats):  # alternating, so drift in the machine's load hits both alike
            for name, fn in (("repeated_kv", repeated_kv_attention), ("grouped", grouped_attention)):
                start = time.perf_counter()
                fn(q, k_cache, v_cache, inputs)
                times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        num_seqs, num_q, context, hq, hkv, d = shape
        rows.append({"num_seqs": num_seqs, "query_rows": num_q, "context": context, "heads": f"{hq}/{hkv}",
                     "head_dim": d, "repeated_kv_ms": med["repeated_kv"], "grouped_ms": med["grouped"],
                     "ratio": med["grouped"] / med["repeated_kv"], "max_abs_diff": max_err})
        print(f"S={num_seqs} Q={num_q} context={context} heads={hq}/{hkv} d={d}: repeated K/V "
              f"{med['repeated_kv']:.2f} ms, grouped {med['grouped']:.2f} ms, ratio {rows[-1]['ratio']:.2f}, "
              f"max |diff| {max_err:.1e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python benchmarks/cpu_fast_attention.py", "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(), "threads": 1, "repeats": args.repeats,
        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
