"""Canonical passes side by side in one process: GEMM blocks on several streams, tile tables for the attention.

    PYTHONPATH=src python3 benchmarks/device/pass_ab.py --out pass_ab.json [--model smollm2|8b]
        [--contexts 600,2400] [--variants serial_fixed,streams4_fixed,serial_tiles,streams4_tiles] [--reps 20]

One ``DVRGenerator`` (random weights of the model's shape, bf16, window 32 x group 8: R = 256, max_num_seqs 256,
canonical passes of up to 2,048 rows) gives the weights and the K/V store (random K/V, ``profile_passes.prepare``);
each variant is a ``CanonicalPass`` of its own on them, every bucket captured as a CUDA graph:

- ``serial_fixed``: a wide pass's R-row GEMM blocks one after another, the attention's fixed tiling (round 14);
- ``streams4_fixed`` / ``streams8_fixed``: the blocks side by side on 4 / 8 streams (``gemm_streams``);
- ``serial_tiles``: a tile table staged with each pass (``segment_tiles``), blocks in turn;
- ``streams2_tiles`` / ``streams4_tiles``: both, on 2 / 4 streams (round 15 keeps the tile table on by default and
  the streams opt-in: served beside fast steps, 4 streams measured worse);
- ``rows512`` / ``rows1024`` / ``rows2048`` (round 27): every GEMM as one cuBLAS call per N rows
  (``FixedShapePolicy(gemm_rows=N)``, other bits), the pass's buckets whole blocks of N; ``rows256``: N = R, the
  default's M, each block written into one output (no concatenation): the default's bits if ``mm(out=)`` gives
  ``F.linear``'s (``equal_to_first`` says).

Pass shapes, per context C: 1, 8, 24 and 64 verify windows of 32 rows at C (every row a result, as ``wide_verify``
stages them); 64 ragged windows (8-32 rows each, at contexts drawn from [C / 4, C], seeded: windows cut
short by stops and ``max_new_tokens``, requests at different lengths); one 2,048-row prompt chunk at C (its
last row the result). Timed: the device milliseconds of ``CanonicalPass._run`` (CUDA events on the current
stream around the forward and sampler replays), the variants interleaved rep by rep, medians; each variant's
tokens and log-probs compared with the first variant's (the same canonical config: they must be equal; round 18's
``tile128`` is its own config whose equality is a measurement, its ``triton`` variants other bits: DIFF expected).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm42.bench.devicetime import synchronize  # noqa: E402
from llm42.bench.passes import canonical_segments  # noqa: E402
from llm42.policies.fixed_shape import FixedShapePolicy  # noqa: E402
from llm42.runner import Segment  # noqa: E402
from llm42.verify.canonical_pass import CanonicalPass  # noqa: E402
from profile_passes import PARAMS, WINDOW, build, device_ms, prepare  # noqa: E402

VARIANTS = {
    "serial_fixed": {"gemm_streams": 1, "segment_tiles": False},
    "streams4_fixed": {"gemm_streams": 4, "segment_tiles": False},
    "streams8_fixed": {"gemm_streams": 8, "segment_tiles": False},
    "serial_tiles": {"gemm_streams": 1, "segment_tiles": True},
    "streams2_tiles": {"gemm_streams": 2, "segment_tiles": True},
    "streams4_tiles": {"gemm_streams": 4, "segment_tiles": True},
    # round 18: the canonical attention in 128-row tiles (FixedShapePolicy(tile_m=128), its own canonical config;
    # on the H200 the same bits as 64 rows in round 17's kernel-level check: equal_to_first says so for whole passes)
    "tile128": {"gemm_streams": 1, "segment_tiles": True, "tile_m": 128},
    "tile128_triton": {"gemm_streams": 1, "segment_tiles": True, "tile_m": 128, "gemm": "triton"},
    "triton": {"gemm_streams": 1, "segment_tiles": True, "gemm": "triton"},
    # round 27: every GEMM as cuBLAS at M = N rows (FixedShapePolicy(gemm_rows=N): other bits, DIFF expected; the
    # buckets whole blocks of N: a narrow pass runs N rows)
    # rows256: M = R, the default's M, each block's GEMM into its rows of one output instead of a concatenation
    # afterwards: equal to serial_tiles exactly where mm(out=) gives F.linear's bits (a measurement)
    "rows256": {"gemm_streams": 1, "segment_tiles": True, "gemm_rows": 256},
    "rows512": {"gemm_streams": 1, "segment_tiles": True, "gemm_rows": 512},
    "rows1024": {"gemm_streams": 1, "segment_tiles": True, "gemm_rows": 1024},
    "rows2048": {"gemm_streams": 1, "segment_tiles": True, "gemm_rows": 2048},
}


def shapes(cfg, context: int, prompt_rid: int, max_seqs: int, seed: int) -> list[tuple[str, list[Segment], list[int]]]:
    out = []
    for windows in (1, 8, 24, 64):
        segs = canonical_segments(cfg, window=WINDOW, group=windows, context=context + WINDOW, params=PARAMS)
        out.append((f"verify_{windows}w", segs, list(range(windows * WINDOW))))
    rng = random.Random(seed)
    segs, rows = [], 0
    for rid in range(min(64, max_seqs)):
        n = rng.randint(8, WINDOW)
        end = rng.randint(max(n, context // 4), context + WINDOW)
        segs.append(Segment(rid, tuple((rid * 31 + i) % cfg.vocab_size for i in range(n)), end - n, PARAMS, 0))
        rows += n
    out.append(("ragged_64w", segs, list(range(rows))))
    tokens = tuple((7 * i + 3) % cfg.vocab_size for i in range(2048))
    out.append(("chunk_2048", [Segment(prompt_rid, tokens, context, PARAMS, 0)], [2047]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=("smollm2", "8b", "tiny"), default="smollm2")
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script (eager passes, tiny model)")
    ap.add_argument("--contexts", default="600,2400")
    ap.add_argument("--variants", default="serial_fixed,streams4_fixed,serial_tiles,streams4_tiles")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--seqs", type=int, default=None, help="requests in the K/V store (default 256; 8B: 64)")
    cli = ap.parse_args()
    contexts = [int(c) for c in cli.contexts.split(",")]
    names = [v for v in cli.variants.split(",") if v]
    # profile_passes' generator: its K/V store sized for the longest context and a 2,048-row chunk
    args = argparse.Namespace(device=cli.device, model=cli.model, context=max(contexts), max_canonical_tokens=2048,
                              layers=cli.layers, canonical_gemm="cublas", canonical_attention="tiled",
                              key_chunk=512, fast_decode_kernel="split", kernel_profile=False,
                              seqs=cli.seqs or (64 if cli.model == "8b" else 256))
    gen, max_chunk = build(args)
    device, kv = gen.device, gen.kv
    prompt_rid = prepare(gen, max(contexts), max_chunk)
    policy = gen.verifier.canonical_pass.policy
    passes, capture_s = {}, {}
    for name in names:
        t0 = time.perf_counter()
        knobs = dict(VARIANTS[name])
        tile_m, gemm, rows = knobs.pop("tile_m", None), knobs.pop("gemm", None), knobs.pop("gemm_rows", None)
        own = policy if tile_m is None and gemm is None and rows is None else FixedShapePolicy(
            key_block=policy.key_block, attention_kernel=policy.attention_kernel, tile_m=tile_m or policy.tile_m,
            gemm=gemm or policy.gemm, gemm_rows=rows)
        cp = CanonicalPass(gen.weights, gen.cfg, own, gen.canonical_config.num_rows, max_rows=2048,
                           use_graph=device.type == "cuda", max_model_len=gen.max_model_len, **knobs)
        cp.stage(canonical_segments(gen.cfg, window=WINDOW, group=1, context=WINDOW, params=PARAMS), kv)
        synchronize(device)
        passes[name], capture_s[name] = cp, round(time.perf_counter() - t0, 2)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__, "model": cli.model,
              "layers": gen.cfg.num_layers, "variants": {n: VARIANTS[n] for n in names}, "capture_s": capture_s,
              "reps": cli.reps, "warmup": cli.warmup, "runs": []}
    for context in contexts:
        for label, segments, wanted in shapes(gen.cfg, context, prompt_rid, gen.config.max_num_seqs, seed=context):
            per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
            staged = {n: cp.stage(segments, kv, per_row, wanted=wanted) for n, cp in passes.items()}
            times: dict[str, list[float]] = {n: [] for n in names}
            for i in range(cli.warmup + cli.reps):
                for n, cp in passes.items():
                    ms = device_ms(lambda: cp._run(staged[n]), device)  # noqa: B023
                    if i >= cli.warmup:
                        times[n].append(ms)
            outs = {}
            for n, cp in passes.items():  # the wanted rows' results (a row-invariant head computes no others)
                tokens, logprobs, _ = cp._run(staged[n])
                outs[n] = (tokens[: len(wanted)].tolist(), logprobs[: len(wanted)].tolist())
            first = names[0]
            row = {"shape": label, "context": context, "rows": len(per_row), "bucket": passes[first].bucket_for(len(per_row)),
                   "buckets": {n: cp.bucket_for(len(per_row)) for n, cp in passes.items()},
                   "device_ms": {n: round(statistics.median(t), 4) for n, t in times.items()},
                   "equal_to_first": {n: outs[n] == outs[first] for n in names}}
            base = row["device_ms"][first]
            row["ratio_to_first"] = {n: round(ms / base, 3) for n, ms in row["device_ms"].items()}
            result["runs"].append(row)
            print(f"{label:11s} ctx {context:5d} rows {row['rows']:5d}  " + "  ".join(
                f"{n} {row['device_ms'][n]:.3f} ({row['ratio_to_first'][n]:.2f}x{'' if row['equal_to_first'][n] else ' DIFF'})"
                for n in names), flush=True)
            Path(cli.out).write_text(json.dumps(result, indent=1) + "\n")
    for cp in passes.values():
        cp.close()
    gen.close()


if __name__ == "__main__":
    main()
