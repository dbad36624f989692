"""A tiny GRPO-style loop with exact rollout / trainer log-prob parity (runs in seconds on the CPU).

Each step: sample n completions per prompt with ``deterministic=True``; score them with
``differentiable_score`` (the trainer's log-probs: bit for bit the rollout's, with gradients);
check the parity; take a policy-gradient step on group-normalised rewards; load the new
weights into the generator in place with ``update_weights``. Because the two sides agree bit
for bit, the importance ratio exp(trainer - rollout) is exactly 1 on every token: no
correction for engine mismatch is needed.

    python examples/rl_parity.py
"""

from __future__ import annotations

import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import assemble
from llm42.rl import differentiable_score, state_dict, trainable_parameters, trainable_weights

NUM_STEPS = 3
NUM_SAMPLES = 4
PROMPTS = ["Once upon a time", "The little dog"]


def reward(gen: DVRGenerator, token_ids: list[int]) -> float:
    """A toy reward: the share of words that start with a vowel (any scalar would do)."""
    words = gen.tokenizer.decode(token_ids, skip_special_tokens=True).split()
    return sum(w[0].lower() in "aeiou" for w in words) / max(1, len(words))


def main() -> None:
    gen = DVRGenerator.from_pretrained(window=8, group=4)  # the embedded stories260K model
    trainer = trainable_weights(gen.weights)
    optimizer = torch.optim.SGD(trainable_parameters(trainer), lr=0.01)
    for step in range(NUM_STEPS):
        params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=step, deterministic=True, logprobs=True,
                                n=NUM_SAMPLES)
        rollouts = gen.generate(PROMPTS, params)  # each prompt's n samples, one after another
        prompts = [r.prompt_token_ids for r in rollouts]
        completions = [r.token_ids for r in rollouts]
        logprobs = differentiable_score(gen, trainer, prompts, completions, params)
        is_identical = all(lp.tolist() == r.logprobs for lp, r in zip(logprobs, rollouts))
        max_ratio_error = max((lp.detach() - torch.tensor(r.logprobs)).exp().sub(1).abs().max().item()
                              for lp, r in zip(logprobs, rollouts))
        rewards = torch.tensor([reward(gen, c) for c in completions]).view(len(PROMPTS), NUM_SAMPLES)
        advantages = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
        loss = -sum(a * lp.sum() for a, lp in zip(advantages.flatten().tolist(), logprobs)) / len(logprobs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        gen.update_weights(state_dict(gen.cfg, trainer, dtype=gen.weights.dtype))
        print(f"step {step}: rollout log-probs == trainer log-probs bit for bit: {is_identical}; "
              f"max |ratio - 1| = {max_ratio_error}; mean reward {rewards.mean().item():.3f}")
    after = gen.generate(PROMPTS[:1], SamplingParams(max_new_tokens=16, deterministic=True, logprobs=True))[0]
    fresh = DVRGenerator(assemble(gen.cfg, state_dict(gen.cfg, trainer)), gen.cfg, window=8, group=4)
    again = fresh.generate([after.prompt_token_ids], SamplingParams(max_new_tokens=16, deterministic=True,
                                                                    logprobs=True))[0]
    print(f"after update_weights == a fresh generator on the new weights: "
          f"{after.token_ids == again.token_ids and after.logprobs == again.logprobs}")


if __name__ == "__main__":
    main()
