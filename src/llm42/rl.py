"""A trainer's side of the contract: log-probs with the rollout's exact values and the policy's gradients.

``DVRGenerator.score`` gives the canonical log-probs (the bits generation committed), with no
gradient: the canonical pass's arithmetic (``llm42.ops.exact``) is integer slicing and
truncation, which autograd cannot differentiate. ``policy_logprobs`` is the same model in plain
torch ops (the fast path's kernels, with autograd), whose values agree with the canonical ones to
rounding but not bit for bit. ``differentiable_score`` joins the two: its tensors hold exactly the
canonical values, and backpropagate as ``policy_logprobs`` does — so a policy-gradient loss sees
the very numbers the rollout saw, and its gradient is that of the float model at those weights.
This holds on the CPU and on CUDA alike (the values come from ``score`` on the generator's device).

    trainable = trainable_weights(gen.weights)          # leaves with requires_grad, on gen's device
    optimizer = torch.optim.SGD(trainable_parameters(trainable), lr=...)
    logprobs = differentiable_score(gen, trainable, prompts, completions, params)
    loss = -sum((adv * lp).sum() for adv, lp in zip(advantages, logprobs))
    loss.backward(); optimizer.step()
    gen.update_weights(state_dict(gen.cfg, trainable, dtype=gen.weights.dtype))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from llm42.kv import KVStore
from llm42.model.config import ModelConfig
from llm42.model.forward import forward
from llm42.model.weights import Weights, weight_views
from llm42.params import SamplingParams
from llm42.policies import FastPolicy
from llm42.runner import ModelRunner, Segment
from llm42.sampler import SamplingRows, processed_scores


def trainable_weights(weights: Weights) -> Weights:
    """A copy of ``weights`` whose tensors are leaves that require grad (a tied head stays tied)."""
    copies: dict[int, torch.Tensor] = {}

    def leaf(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if id(t) not in copies:
            copies[id(t)] = t.detach().clone().requires_grad_(t.is_floating_point())
        return copies[id(t)]

    layers = tuple(dataclasses.replace(lw, **{f.name: leaf(getattr(lw, f.name)) for f in dataclasses.fields(lw)})
                   for lw in weights.layers)
    return Weights(embed=leaf(weights.embed), layers=layers, norm=leaf(weights.norm), lm_head=leaf(weights.lm_head),
                   rope_cos=weights.rope_cos, rope_sin=weights.rope_sin, lm_head_bias=leaf(weights.lm_head_bias))


def trainable_parameters(weights: Weights) -> list[torch.Tensor]:
    """The distinct tensors of ``weights`` that require grad (for an optimizer)."""
    seen: dict[int, torch.Tensor] = {}
    for t in (weights.embed, weights.norm, weights.lm_head, weights.lm_head_bias,
              *(getattr(lw, f.name) for lw in weights.layers for f in dataclasses.fields(lw))):
        if t is not None and t.requires_grad:
            seen.setdefault(id(t), t)
    return list(seen.values())


def state_dict(cfg: ModelConfig, weights: Weights, *, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """``weights`` by Hugging Face name (detached, cast to ``dtype``): what ``update_weights`` takes."""
    return {name: view.detach().to(dtype or view.dtype) for name, view in weight_views(cfg, weights).items()}


def policy_logprobs(weights: Weights, cfg: ModelConfig, prompts: Sequence[Sequence[int]],
                    completions: Sequence[Sequence[int]],
                    params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[torch.Tensor]:
    """Differentiable log-probs [len(completion)] of each completion token, in ``params.logprobs_mode``.

    Plain torch: the model's forward with ``FastPolicy`` over a scratch K/V store on the weights'
    device. Values agree with ``DVRGenerator.score`` to rounding, not bit for bit.
    """
    params_list = _params_list(params, len(prompts))
    runner = ModelRunner(weights, cfg)
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    block_size = 16
    kv = KVStore(cfg, num_blocks=sum(-(-n // block_size) for n in lengths), block_size=block_size,
                 num_scratch_slots=block_size, dtype=weights.dtype, device=weights.device, enable_prefix_cache=False)
    segments = []
    for rid, (prompt, completion, p) in enumerate(zip(prompts, completions, params_list)):
        kv.allocate(rid, lengths[rid])
        kv.append(rid, lengths[rid])
        segments.append(Segment(rid, tuple(prompt) + tuple(completion), 0, p, 0))
    inputs = dataclasses.replace(runner.fast_inputs(segments, kv), logits_rows=None)
    logits = forward(weights, cfg, inputs, kv.layers(), FastPolicy()).float()  # [rows, V]
    out, row = [], 0
    for seg, prompt, p in zip(segments, prompts, params_list):
        num_prompt = len(prompt)
        seq_logits = logits[row + num_prompt - 1: row + len(seg.tokens) - 1]  # row p predicts token p + 1
        targets = torch.tensor(seg.tokens[num_prompt:], dtype=torch.int64, device=logits.device)
        row += len(seg.tokens)
        out.append(_mode_logprobs(seq_logits, targets, p))
    return out


def _mode_logprobs(logits: torch.Tensor, targets: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    if not params.is_processed_logprobs:
        return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
    if params.is_greedy:  # the sampler's distribution is a point mass: log-prob 0, no gradient
        return logits.sum(-1) * 0.0
    num = len(targets)
    rows = SamplingRows(temperature=torch.full((num,), params.temperature, device=logits.device),
                        top_k=torch.full((num,), params.top_k, device=logits.device),
                        top_p=torch.full((num,), params.top_p, device=logits.device),
                        seeds=torch.zeros(num, dtype=torch.int64, device=logits.device),
                        positions=torch.zeros(num, dtype=torch.int64, device=logits.device))
    # the support from the sampler's own filter (no gradient through a mask), the values differentiable
    is_kept = processed_scores(logits.detach(), rows) > float("-inf")
    scores = torch.where(is_kept, logits / params.temperature, float("-inf"))
    return torch.log_softmax(scores, dim=-1).gather(1, targets[:, None]).squeeze(1)


class _ExactValues(torch.autograd.Function):
    """Forward: the given exact values; backward: the gradient goes to the differentiable tensor."""

    @staticmethod
    def forward(ctx, differentiable: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return values.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def with_exact_values(values: Sequence[float], differentiable: torch.Tensor) -> torch.Tensor:
    """A tensor holding exactly ``values`` (float32) whose gradient flows into ``differentiable``."""
    exact = torch.tensor(list(values), dtype=torch.float32, device=differentiable.device)
    if exact.shape != differentiable.shape:
        raise ValueError(f"{len(values)} values for a tensor of shape {tuple(differentiable.shape)}")
    return _ExactValues.apply(differentiable.float(), exact)


def differentiable_score(gen, weights: Weights, prompts: Sequence, completions: Sequence[Sequence[int]],
                         params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[torch.Tensor]:
    """``gen.score``'s values (bit for bit), differentiable with respect to ``weights`` (``policy_logprobs``).

    ``weights`` are the trainer's copy (``trainable_weights(gen.weights)``), equal to the generator's
    at the time of the call for the gradient to be that of the model the values came from.
    """
    exact = gen.score(prompts, completions, params)
    encoded = [gen._encode(p) for p in prompts]
    differentiable = policy_logprobs(weights, gen.cfg, encoded, completions, params)
    return [with_exact_values(v, d) for v, d in zip(exact, differentiable)]


def _params_list(params, num: int) -> list[SamplingParams]:
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * num
    return list(params)


__all__ = ["differentiable_score", "policy_logprobs", "state_dict", "trainable_parameters", "trainable_weights",
           "with_exact_values"]
