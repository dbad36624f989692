"""Quickstart: deterministic generation with llm42 on the embedded model (CPU, a few seconds).

    python examples/quickstart.py
"""

from __future__ import annotations

from llm42 import DVRGenerator, SamplingParams


def main() -> None:
    # No path: the embedded stories260K model (a tiny trained Llama with its tokenizer).
    # window (T) x group (G) fixes the canonical pass at R = 8 x 4 = 32 rows.
    gen = DVRGenerator.from_pretrained(window=8, group=4)

    # deterministic=True: the committed tokens and log-probs depend only on the weights, the
    # prompt, these params (the seed included) and the canonical config -- never on the batch.
    params = SamplingParams(max_new_tokens=32, temperature=0.8, top_p=0.95, seed=42,
                            deterministic=True, logprobs=True)
    prompts = ["Once upon a time", "The little dog was sad because", "Lily found a shiny stone"]
    batch = gen.generate(prompts, params)  # results come back in the order of prompts
    for prompt, out in zip(prompts, batch):
        print(f"{prompt!r} -> {out.text!r} ({out.finish_reason}, {len(out.token_ids)} tokens)")

    # The first prompt again, this time alone: the same tokens and the same log-probs, bit for bit.
    alone = gen.generate([prompts[0]], params)[0]
    assert alone.token_ids == batch[0].token_ids and alone.logprobs == batch[0].logprobs
    print("alone == in a batch of 3:", alone.token_ids == batch[0].token_ids)

    # Online use: submit requests between steps; step() returns the tokens committed in that step.
    rid = gen.submit("One day, a bird", SamplingParams(max_new_tokens=16))  # an ordinary request
    while gen.has_unfinished():
        gen.step()
    print("online:", repr(gen.result(rid).text))

    # Streaming: (index into prompts, newly committed tokens) as they commit.
    pieces = [tokens for _, tokens in gen.stream(["Tom had a red ball"], params)]
    print("streamed in", len(pieces), "commits:", [len(p) for p in pieces])

    print("stats:", gen.stats)


if __name__ == "__main__":
    main()
