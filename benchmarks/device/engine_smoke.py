"""Engine smoke check on one GPU: steady-state decode wall time per step vs the decode graph's replay time
(overlap on and off, side by side), and the contract for a deterministic needle alone vs in a batch.

    PYTHONPATH=src python3 benchmarks/device/engine_smoke.py --out $OUT/engine_smoke.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.model.config import ModelConfig, RopeConfig, llama31_8b_config


def smollm2_shape() -> ModelConfig:
    return ModelConfig(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                       num_heads=9, num_kv_heads=3, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
                       rope=RopeConfig(theta=100000.0), tie_word_embeddings=True, eos_token_ids=(2,),
                       bos_token_id=1)


def replay_ms(gen: DVRGenerator, batch: int, reps: int = 30) -> float:
    """Median device time of one decode-graph replay at ``batch`` (the step's kernels alone)."""
    graphs = gen.fast_step.decode_graphs
    state = gen.decode_state
    saved = state.snapshot()
    slots = list(range(batch))
    state.stage_batch(slots, graphs.bucket_for(batch))
    times = []
    for _ in range(reps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs.run(batch, (False, False))
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        state.restore(saved)
    return statistics.median(times[3:])


def steady_decode(cfg: ModelConfig, *, batch: int, overlap: bool, lm_head_std: float | None) -> dict:
    gen = DVRGenerator.from_config(cfg, device="cuda", dtype=torch.bfloat16, lm_head_std=lm_head_std,
                                   max_num_seqs=batch, kv_cache_tokens=batch * 512, overlap=overlap,
                                   window=32, group=8)
    params = SamplingParams(max_new_tokens=300, ignore_eos=True)
    rng = random.Random(0)
    for _ in range(batch):
        gen.submit([rng.randrange(cfg.vocab_size) for _ in range(16)], params)
    for _ in range(40):  # prefill + graph captures + warm
        gen.step()
    torch.cuda.synchronize()
    steps = 100
    t0 = time.perf_counter()
    for _ in range(steps):
        gen.step()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) / steps * 1e3
    out = {"batch": batch, "overlap": overlap, "wall_ms_per_step": wall_ms}
    if overlap:
        out["replay_ms"] = replay_ms(gen, batch)
        out["wall_over_replay"] = wall_ms / out["replay_ms"]
    out["tokens_per_s"] = batch / wall_ms * 1e3
    del gen
    torch.cuda.empty_cache()
    return out


def needle(cfg: ModelConfig, lm_head_std: float | None) -> dict:
    gen = DVRGenerator.from_config(cfg, device="cuda", dtype=torch.bfloat16, lm_head_std=lm_head_std,
                                   max_num_seqs=128, kv_cache_tokens=128 * 600)
    rng = random.Random(1)
    prompt = [rng.randrange(cfg.vocab_size) for _ in range(40)]
    det = [SamplingParams(max_new_tokens=48, deterministic=True, logprobs=True, ignore_eos=True),
           SamplingParams(max_new_tokens=48, deterministic=True, logprobs=True, ignore_eos=True, temperature=0.8,
                          top_p=0.9, seed=7)]
    free = SamplingParams(max_new_tokens=48, logprobs=True, ignore_eos=True)
    alone = [gen.generate([prompt], [p])[0] for p in det + [free]]
    ok, fast = True, {tuple(alone[2].token_ids)}
    for size in (8, 64, 127):
        others = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(4, 300))] for _ in range(size)]
        oparams = [SamplingParams(max_new_tokens=rng.randint(1, 64), deterministic=rng.random() < 0.3,
                                  temperature=rng.choice([0.0, 0.9]), seed=rng.randrange(1000)) for _ in others]
        prompts = others[: size // 2] + [prompt] * 3 + others[size // 2:]
        params = oparams[: size // 2] + det + [free] + oparams[size // 2:]
        outs = gen.generate(prompts, params)
        got = outs[size // 2: size // 2 + 3]
        for a, b in zip(alone[:2], got[:2]):
            ok &= a.token_ids == b.token_ids and a.logprobs == b.logprobs
        fast.add(tuple(got[2].token_ids))
    return {"needle_bit_identical": ok, "fast_path_distinct_outputs": len(fast), "stats": dict(gen.stats)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name, cfg, std in (("smollm2_shape", smollm2_shape(), None), ("llama8b_shape", llama31_8b_config(), 0.2)):
        rows = []
        for overlap in (True, False):
            row = steady_decode(cfg, batch=256 if name == "smollm2_shape" else 128, overlap=overlap, lm_head_std=std)
            print(name, row, flush=True)
            rows.append(row)
        report[name] = {"steady_decode": rows}
        report[name]["contract"] = needle(cfg, std)
        print(name, report[name]["contract"], flush=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
