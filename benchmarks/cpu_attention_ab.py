"""The CPU canonical attention (``llm42.ops.attention.blocked_attention``) against its version at a git revision,
side by side in one process: the same inputs, the two interleaved rep by rep, medians; and the bits compared.

    .venv/bin/python benchmarks/cpu_attention_ab.py --baseline fe18729 --out benchmarks/results/cpu_attention_ab.json

Shapes are passes the CPU suite and CPU serving run: verify windows (several sequences of 8 rows), prompt chunks,
a prompt chunk beside one-row sequences, decode rows (one row per sequence), at the tiny bench model's heads
(4 query / 2 kv heads of 32) and SmolLM2's (9 / 3 of 64), key blocks of 64, pages of 16, one thread.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from llm42.inputs import StepInputs  # noqa: E402
from llm42.ops.attention import blocked_attention  # noqa: E402

# (label, rows per sequence, context, (query heads, kv heads), head dim)
CASES = (
    ("4 windows of 8, context 200, tiny", [8] * 4, 200, (4, 2), 32),
    ("4 windows of 8, context 600, tiny", [8] * 4, 600, (4, 2), 32),
    ("a 100-row prompt chunk, tiny", [100], 100, (4, 2), 32),
    ("a 32-row chunk and 3 windows of 8, context 300, tiny", [32, 8, 8, 8], 300, (4, 2), 32),
    ("a 200-row chunk and 7 one-row sequences, context 300, tiny", [200] + [1] * 7, 300, (4, 2), 32),
    ("32 decode rows, context 300, tiny", [1] * 32, 300, (4, 2), 32),
    ("4 windows of 8, context 150, SmolLM2", [8] * 4, 150, (9, 3), 64),
    ("4 windows of 8, context 400, SmolLM2", [8] * 4, 400, (9, 3), 64),
    ("a 40-row prompt chunk, SmolLM2", [40], 40, (9, 3), 64),
    ("4 decode rows, context 100, SmolLM2", [1] * 4, 100, (9, 3), 64),
)
BLOCK_SIZE, KEY_BLOCK = 16, 64


def baseline_attention(revision: str):
    """``blocked_attention`` as ``src/llm42/ops/attention.py`` was at ``revision``."""
    source = subprocess.run(["git", "show", f"{revision}:src/llm42/ops/attention.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "attention_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("attention_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.blocked_attention


def case_inputs(rows: list[int], context: int, heads: tuple[int, int], head_dim: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    num_seqs, blocks = len(rows), context // BLOCK_SIZE + 2
    k_cache = torch.randn(num_seqs * blocks * BLOCK_SIZE, heads[1], head_dim, generator=g)
    v_cache = torch.randn(num_seqs * blocks * BLOCK_SIZE, heads[1], head_dim, generator=g)
    row_seq = [s for s, n in enumerate(rows) for _ in range(n)]
    positions = [p for n in rows for p in range(context - n, context)]
    starts = [0]
    for n in rows:
        starts.append(starts[-1] + n)
    zeros = torch.zeros(len(row_seq), dtype=torch.int64)
    inputs = StepInputs(token_ids=zeros, positions=torch.tensor(positions), slot_mapping=zeros,
                        row_seq=torch.tensor(row_seq), block_tables=torch.arange(num_seqs * blocks).view(num_seqs, blocks),
                        context_lens=torch.full((num_seqs,), context), seq_starts=tuple(starts),
                        max_context_len=context)
    q = torch.randn(len(row_seq), heads[0], head_dim, generator=g)
    return q, k_cache, v_cache, inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, help="git revision whose blocked_attention is the baseline")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = baseline_attention(args.baseline)
    results = []
    for label, rows, context, heads, head_dim in CASES:
        q, k_cache, v_cache, inputs = case_inputs(rows, context, heads, head_dim)
        kw = dict(block_size=BLOCK_SIZE, scale=head_dim ** -0.5, key_block=KEY_BLOCK)
        times: dict[str, list[float]] = {"baseline": [], "tree": []}
        outs = {}
        for _ in range(args.reps):  # interleaved, rep by rep
            for name, fn in (("baseline", base), ("tree", blocked_attention)):
                t = time.perf_counter()
                outs[name] = fn(q, k_cache, v_cache, inputs, **kw)
                times[name].append(time.perf_counter() - t)
        base_ms, tree_ms = (1e3 * statistics.median(times[n]) for n in ("baseline", "tree"))
        entry = {"case": label, "rows": len(q), "baseline_ms": round(base_ms, 2), "tree_ms": round(tree_ms, 2),
                 "speedup": round(base_ms / tree_ms, 2), "same_bits": torch.equal(outs["baseline"], outs["tree"])}
        print(json.dumps(entry), flush=True)
        results.append(entry)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "baseline": args.baseline,
                                          "torch": torch.__version__, "threads": 1, "reps": args.reps,
                                          "results": results}, indent=1))


if __name__ == "__main__":
    main()
