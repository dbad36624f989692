"""What each rank of the two-process gloo job in test_tensor_parallel.py runs (module level: spawn pickles it).

Every rank makes the same calls in the same order and returns what it saw;
the test compares the ranks with each other and with TP = 1 in its own process.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from llm42 import DVRGenerator, SamplingParams
from llm42.distributed import TensorParallel
from llm42.model.config import ModelConfig
from llm42.model.weights import random_weights, weight_views
from llm42.ops import exact
from llm42.policies import FixedShapePolicy, NoisyFastPolicy
from llm42.testing.harness import filler_prompts, run_random_batches

WINDOW, GROUP = 4, 3  # R = 12 rows: small, and the canonical passes still carry several requests
TARGET_PROMPTS = ([1, 2, 3, 4], [1, 365, 471, 259, 372, 263, 278, 405], [7, 8])
TARGET_PARAMS = (
    SamplingParams(max_new_tokens=14, deterministic=True, logprobs=True, ignore_eos=True),
    SamplingParams(max_new_tokens=12, temperature=0.8, top_k=40, top_p=0.9, seed=11, deterministic=True,
                   logprobs=True, ignore_eos=True),
    SamplingParams(max_new_tokens=10, temperature=1.0, seed=5, deterministic=True, logprobs=True, ignore_eos=True),
)
SCORE_PROMPT = [1, 2, 3, 4]
SCORE_COMPLETION = [419, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267]


# a second model for the sharding rules the embedded one does not have: q/k/v, o_proj and MLP biases, tied
# embeddings, a vocabulary the ranks do not divide (301: 151 rows each, one padding row)
BIASED_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 301, "hidden_size": 48,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
    "head_dim": 8, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True, "eos_token_id": 2,
}
BIASED_PROMPT = [5, 17, 300, 42]
BIASED_PARAMS = SamplingParams(max_new_tokens=12, temperature=0.9, seed=3, deterministic=True, logprobs=True,
                               ignore_eos=True)


def write_biased_checkpoint(directory: Path) -> Path:
    """``BIASED_CONFIG`` with seeded random weights as a HF safetensors checkpoint in ``directory``."""
    cfg = ModelConfig.from_hf_dict(BIASED_CONFIG)
    weights = random_weights(cfg, seed=1, std=0.2)
    (directory / "config.json").write_text(json.dumps(BIASED_CONFIG))
    save_file({name: view.contiguous() for name, view in weight_views(cfg, weights).items()},
              str(directory / "model.safetensors"))
    return directory


def op_operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K], weight [N, K], bias [N]: float32 with outlier columns and a wide exponent range."""
    g = torch.Generator().manual_seed(42)
    x = torch.randn(24, 1024, generator=g) * torch.exp(torch.randn(24, 1, generator=g) * 3)
    x[:, 7] *= 300.0
    weight = torch.randn(96, 1024, generator=g) * 0.02
    weight[5, 900] = 4.0
    return x, weight, torch.randn(96, generator=g)


class NaiveAllReduceCanonical(FixedShapePolicy):
    """Negative control: the canonical pass with row-parallel partial ``F.linear``s all-reduced in float32."""

    def row_parallel_linear(self, x, weight, bias, *, tp, shard):
        out = tp.all_reduce_sum(F.linear(x, weight))
        return out if bias is None else out + bias


def _ops(tp: TensorParallel) -> dict:
    x, weight, bias = op_operands()
    cols = slice(tp.rank * 1024 // tp.world_size, (tp.rank + 1) * 1024 // tp.world_size)
    x_part, w_part = x[:, cols].contiguous(), weight[:, cols].contiguous()
    amax = tp.all_reduce_max(w_part.abs().amax(1, keepdim=True).double())
    shard = exact.RowShard(full_k=1024, amax=amax)
    slices = exact.WeightSlices()

    def sharded(rows):
        return exact.sharded_linear(x_part[rows], w_part, bias, shard=shard, slices=slices,
                                    all_reduce_max=tp.all_reduce_max, all_reduce_sum=tp.all_reduce_sum)

    naive = tp.all_reduce_sum(F.linear(x_part, w_part)) + bias
    partial = F.linear(x_part, w_part)
    ordered_all = tp.ordered_sum(partial)
    ordered_tail = tp.ordered_sum(partial[5:9].contiguous())  # rows 5..8 reduced without the others
    return {
        "sharded": sharded(slice(None)),
        "sharded_tail": sharded(slice(5, 9)),
        "naive": naive,
        "ordered_is_row_local": torch.equal(ordered_all[5:9], ordered_tail),
    }


def _generator(**kwargs) -> DVRGenerator:
    return DVRGenerator.from_pretrained(tensor_parallel=2, window=WINDOW, group=GROUP, **kwargs)


def rank_job(num_batches: int, seed: int, biased_checkpoint: Path) -> dict:
    """The whole TP = 2 job of one rank: op checks, the contract, TP invariance, the negative control."""
    out: dict = {"ops": _ops(TensorParallel.from_world(2))}
    biased = DVRGenerator.from_pretrained(biased_checkpoint, tensor_parallel=2, window=WINDOW, group=GROUP)
    completion = biased.generate([BIASED_PROMPT], BIASED_PARAMS)[0]
    out["biased"] = (completion.token_ids, completion.logprobs)
    biased.close()
    gen = _generator()
    alone = [gen.generate([prompt], params)[0] for prompt, params in zip(TARGET_PROMPTS, TARGET_PARAMS)]
    out["alone"] = [(c.token_ids, c.logprobs) for c in alone]
    out["score"] = gen.score([SCORE_PROMPT], [SCORE_COMPLETION], SamplingParams(max_new_tokens=1))[0]
    gen.close()

    noisy = _generator(fast_policy=NoisyFastPolicy(scale=2.0, seed=seed))
    targets = list(zip(TARGET_PROMPTS, TARGET_PARAMS))
    fillers = filler_prompts(random.Random(seed), noisy)
    outcomes = list(run_random_batches(noisy, targets, alone, fillers, num_batches=num_batches, seed=seed))
    out["divergences"] = [(o.index, t, str(d)) for o in outcomes for t, d in o.divergences]
    out["rollbacks"] = sum(o.stats_delta["rollbacks"] for o in outcomes)
    out["free_requests"] = sum(o.batch.num_free for o in outcomes)
    noisy.close()

    naive = _generator(canonical_policy=NaiveAllReduceCanonical())
    out["naive_score"] = naive.score([SCORE_PROMPT], [SCORE_COMPLETION], SamplingParams(max_new_tokens=1))[0]
    naive.close()
    return out


def raise_on_rank(bad_rank: int) -> int:
    """Rank ``bad_rank`` raises; the others return their rank."""
    rank = TensorParallel.from_world(2).rank
    if rank == bad_rank:
        raise ValueError(f"rank {rank} was told to fail")
    return rank


def count_and_raise(path: str) -> None:
    """Append a line to ``path`` (one per run of this job on this rank), then raise."""
    with open(path, "a") as f:
        f.write("ran\n")
    raise ValueError("told to fail")
