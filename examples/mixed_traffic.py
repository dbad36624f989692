"""Mixed traffic: deterministic and free requests side by side, arriving while the engine runs.

Free requests (``deterministic=False``) commit a token on every fast step and
never wait for verification. Deterministic requests draft candidates on the
same fast steps and commit them in bursts, when a canonical pass verifies their
window. The timeline below shows both; afterwards every deterministic request
is checked against a run of it alone.

    python examples/mixed_traffic.py      (CPU, a few seconds)
"""

from __future__ import annotations

from llm42 import DVRGenerator, SamplingParams

DET = SamplingParams(max_new_tokens=24, deterministic=True, logprobs=True)
DET_SAMPLED = SamplingParams(max_new_tokens=24, temperature=0.9, seed=11, deterministic=True, logprobs=True)
FREE = SamplingParams(max_new_tokens=16, temperature=0.8)

# (arrival step, prompt, params)
TRAFFIC = [
    (0, "Once upon a time", DET),
    (0, "Tom had a red ball", FREE),
    (2, "The little dog was sad because", DET_SAMPLED),
    (3, "Mom said", FREE),
    (5, "One day, a bird", FREE),
    (6, "Lily and Ben went to the park", DET),
]


def main() -> None:
    gen = DVRGenerator.from_pretrained(window=8, group=4)
    rids: dict[int, int] = {}  # request id -> index into TRAFFIC
    step = 0
    print("step | tokens committed this step, per request (D = deterministic, F = free)")
    while step == 0 or gen.has_unfinished() or len(rids) < len(TRAFFIC):
        for i, (arrival, prompt, params) in enumerate(TRAFFIC):
            if arrival == step:
                rids[gen.submit(prompt, params)] = i
        passes_before = gen.stats["canonical_passes"]
        events = gen.step() if gen.has_unfinished() else {}
        cells = []
        for rid, tokens in sorted(events.items()):
            kind = "D" if TRAFFIC[rids[rid]][2].deterministic else "F"
            cells.append(f"{kind}{rids[rid]}+{len(tokens)}")
        verified = " [canonical pass]" if gen.stats["canonical_passes"] > passes_before else ""
        print(f"{step:4d} | {' '.join(cells) or '(candidates drafted, none committed yet)'}{verified}")
        step += 1

    print()
    outs = {rid: gen.result(rid) for rid in rids}  # result() hands each Completion over once
    for rid, i in sorted(rids.items(), key=lambda item: item[1]):
        out = outs[rid]
        _, prompt, params = TRAFFIC[i]
        kind = "deterministic" if params.deterministic else "free"
        print(f"#{i} [{kind}] {prompt!r} -> {out.text!r}")

    # every deterministic request equals a run of it alone, tokens and log-probs
    reference = DVRGenerator.from_pretrained(window=8, group=4)
    for rid, i in rids.items():
        _, prompt, params = TRAFFIC[i]
        if params.deterministic:
            alone = reference.generate([prompt], params)[0]
            mixed = outs[rid]
            assert alone.token_ids == mixed.token_ids and alone.logprobs == mixed.logprobs, f"request {i} differs"
    print("\nall deterministic requests match their batch-size-1 reference")

    s = gen.stats
    print(f"stats: {s['steps']} steps, {s['fast_steps']} fast steps ({s['fast_tokens']} tokens), "
          f"{s['canonical_passes']} canonical passes using {s['canonical_rows_used']} of {s['canonical_rows']} "
          f"rows, {s['committed_tokens']} committed tokens, {s['rollbacks']} rollbacks "
          f"({s['recomputed_tokens']} tokens recomputed)")


if __name__ == "__main__":
    main()
