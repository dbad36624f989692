"""The determinism contract on CUDA, at the Llama-3.1-8B shape in bf16 (random weights).

- A deterministic "needle" returns bit-identical tokens and log-probs alone and
  inside random batches of 1..128 mixed requests, with and without CUDA graphs.
- The same needle on the fast path alone (deterministic=False) drifts across
  batches: the negative control that shows the batches really perturb it.
- The canonical pass gives a row the same logits bits whatever fills the pass
  and wherever the row sits; graph replay equals the eager pass bit for bit.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.kv_store import KVStore  # noqa: E402
from llm42.model.forward import forward  # noqa: E402
from llm42.policies import FastPolicy, FixedShapePolicy  # noqa: E402
from llm42.runner import ModelRunner, Segment  # noqa: E402
from llm42.sampler import SamplingRows, sample  # noqa: E402
from llm42.verify import CanonicalConfig  # noqa: E402
from llm42.cuda_graphs import DecodeGraphs  # noqa: E402
from llm42.engine.decode_state import DecodeState  # noqa: E402
from llm42.verify.canonical_pass import CanonicalPass  # noqa: E402

pytestmark = pytest.mark.gpu

WINDOW, GROUP = 32, 8
KV_TOKENS = 96 * 1024
BATCH_SIZES = (3, 4, 16, 64, 128)  # requests per batch, the three needles included


def make_generator(llama8b, **kwargs) -> DVRGenerator:
    cfg, weights = llama8b
    return DVRGenerator(weights, cfg, window=WINDOW, group=GROUP, kv_cache_tokens=KV_TOKENS, **kwargs)


def random_prompt(rng: random.Random, vocab: int, length: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


def random_request(rng: random.Random, vocab: int) -> tuple[list[int], SamplingParams]:
    sampled = rng.random() < 0.5
    return random_prompt(rng, vocab, rng.randint(4, 400)), SamplingParams(
        max_new_tokens=rng.randint(1, 64),
        temperature=rng.choice([0.7, 1.0]) if sampled else 0.0,
        top_k=rng.choice([0, 50]) if sampled else 0,
        top_p=rng.choice([1.0, 0.9]) if sampled else 1.0,
        seed=rng.randrange(1 << 30) if sampled else None,
        deterministic=rng.random() < 0.5,
        logprobs=rng.random() < 0.5,
    )


NEEDLES = {
    "greedy": SamplingParams(max_new_tokens=64, deterministic=True, logprobs=True, ignore_eos=True),
    "sampled": SamplingParams(max_new_tokens=64, temperature=0.8, top_p=0.95, seed=1234, deterministic=True,
                              logprobs=True, ignore_eos=True),
    "fast_only": SamplingParams(max_new_tokens=64, logprobs=True, ignore_eos=True),
}


class FastStepsBesidePasses:
    """Counts the fast steps with decode rows that ``gen`` launches while a canonical pass is still running
    (``count``): the overlap a side-stream pass test must have exercised."""

    def __init__(self, gen: DVRGenerator):
        self.count = 0
        launch = gen.fast_step.launch

        def counting_launch(plan, *args):
            in_flight = gen.passes.oldest
            self.count += bool(plan.fast_decode) and in_flight is not None and not in_flight.is_ready()
            return launch(plan, *args)

        gen.fast_step.launch = counting_launch


def run_with_needles(gen: DVRGenerator, needle_prompt: list[int], others, rng: random.Random) -> dict:
    """Generate the needles at random places among ``others``; returns name -> (tokens, logprobs)."""
    requests = [(prompt, params, None) for prompt, params in others]
    for name, params in NEEDLES.items():
        requests.insert(rng.randint(0, len(requests)), (needle_prompt, params, name))
    outs = gen.generate([p for p, _, _ in requests], [s for _, s, _ in requests])
    return {name: (tuple(out.token_ids), tuple(out.logprobs)) for (_, _, name), out in zip(requests, outs) if name}


def test_needle_is_bit_identical_alone_and_in_random_batches(llama8b, report):
    cfg, _ = llama8b
    rng = random.Random(42)
    needle_prompt = random_prompt(rng, cfg.vocab_size, 300)  # > R rows: canonical prefill spans two passes
    gen = make_generator(llama8b)
    assert gen.verifier.is_graphed and gen.fast_step.decode_graphs is not None
    alone = {name: gen.generate([needle_prompt], [p])[0] for name, p in NEEDLES.items()}
    alone = {name: (tuple(c.token_ids), tuple(c.logprobs)) for name, c in alone.items()}
    assert all(len(tokens) == 64 for tokens, _ in alone.values())

    fast_outputs = {alone["fast_only"][0]}
    rollbacks_before = gen.stats["rollbacks"]
    for batch_size in BATCH_SIZES:
        others = [random_request(rng, cfg.vocab_size) for _ in range(batch_size - len(NEEDLES))]
        got = run_with_needles(gen, needle_prompt, others, rng)
        for name in ("greedy", "sampled"):
            assert got[name][0] == alone[name][0], f"{name} needle tokens differ at batch size {batch_size}"
            assert got[name][1] == alone[name][1], f"{name} needle log-probs differ at batch size {batch_size}"
        fast_outputs.add(got["fast_only"][0])
    report("contract_batch_sizes", list(BATCH_SIZES))
    report("contract_stats", gen.stats)
    report("contract_rollbacks_in_batches", gen.stats["rollbacks"] - rollbacks_before)
    # the batches' deterministic requests drafted ahead of windows in passes the device was still running
    assert gen.stats["ahead_tokens_kept"] + gen.stats["ahead_tokens_dropped"] > 0, gen.stats
    report("fast_only_distinct_outputs", len(fast_outputs))
    report("fast_only_runs", len(BATCH_SIZES) + 1)
    # the negative control: without verification the same request does drift with the batch
    assert len(fast_outputs) > 1

    # eager (no CUDA graphs anywhere) commits the same bits as graph replay
    eager = make_generator(llama8b, use_cuda_graphs=False)
    assert not eager.verifier.is_graphed and eager.fast_step.decode_graphs is None
    for name in ("greedy", "sampled"):
        c = eager.generate([needle_prompt], [NEEDLES[name]])[0]
        assert (tuple(c.token_ids), tuple(c.logprobs)) == alone[name]


def _canonical_logits(runner: ModelRunner, kv: KVStore, segments: list[Segment], num_rows: int) -> torch.Tensor:
    for seg in segments:
        kv.append(seg.rid, seg.end)
    inputs = runner.canonical_inputs(segments, kv, num_rows)
    return forward(runner.weights, runner.cfg, inputs, kv.layers(), FixedShapePolicy())


def test_canonical_row_logits_do_not_depend_on_the_pass(llama8b, report):
    """A probe prompt's logits: same bits whatever fills the R-row pass and wherever the probe sits."""
    cfg, weights = llama8b
    runner = ModelRunner(weights, cfg)
    kv = KVStore(cfg, num_blocks=1024, block_size=16, num_scratch_slots=256, dtype=weights.dtype, device="cuda")
    rng = random.Random(3)
    params = SamplingParams()
    probe = random_prompt(rng, cfg.vocab_size, 48)
    results, gaps = [], []
    for trial in range(6):
        fillers = [random_prompt(rng, cfg.vocab_size, rng.randint(1, 60)) for _ in range(rng.randint(0, 3))]
        order = fillers[:]
        index = rng.randint(0, len(order))
        order.insert(index, probe)
        rids = list(range(100 * trial, 100 * trial + len(order)))
        for rid, prompt in zip(rids, order):
            kv.allocate(rid, len(prompt))
        segments = [Segment(rid, tuple(p), 0, params, 0) for rid, p in zip(rids, order)]
        logits = _canonical_logits(runner, kv, segments, WINDOW * GROUP)
        start = sum(len(p) for p in order[:index])
        results.append(logits[start: start + len(probe)].clone())
        top2 = logits[: sum(len(p) for p in order)].float().topk(2, dim=-1).values
        gaps.append(top2[:, 0] - top2[:, 1])
        for rid in rids:
            kv.free(rid)
    assert all(torch.equal(results[0], r) for r in results[1:])
    gap = torch.cat(gaps)
    report("top1_top2_logit_gap", {
        "median": gap.median().item(), "p10": gap.quantile(0.1).item(), "mean": gap.mean().item(),
        "fraction_below_0.5": (gap < 0.5).float().mean().item(), "rows": gap.numel(),
    })


def test_canonical_graph_replay_equals_eager(llama8b):
    """The captured canonical pass (forward + sampler) gives the eager pass's tokens and log-probs bit for bit."""
    cfg, weights = llama8b
    policy = FixedShapePolicy()
    config = CanonicalConfig(window=WINDOW, group=GROUP)
    kv = KVStore(cfg, num_blocks=1024, block_size=16, num_scratch_slots=256, dtype=weights.dtype, device="cuda")
    graphed = CanonicalPass(weights, cfg, policy, config.num_rows)
    eager = CanonicalPass(weights, cfg, policy, config.num_rows, use_graph=False)
    assert graphed.is_graphed and not eager.is_graphed
    rng = random.Random(5)
    for trial in range(3):
        prompts = [random_prompt(rng, cfg.vocab_size, rng.randint(1, 80)) for _ in range(rng.randint(1, 3))]
        all_params = [SamplingParams(temperature=rng.choice([0.0, 0.9]), top_k=rng.choice([0, 40]), seed=i)
                      for i in range(len(prompts))]
        rids = list(range(10 * trial, 10 * trial + len(prompts)))
        for rid, prompt in zip(rids, prompts):
            kv.allocate(rid, len(prompt))
            kv.append(rid, len(prompt))
        segments = [Segment(rid, tuple(p), 0, sp, sp.seed) for rid, p, sp in zip(rids, prompts, all_params)]
        per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
        want = eager.launch(segments, kv, per_row).wait()
        got = graphed.launch(segments, kv, per_row).wait()  # on its own stream, read back through pinned memory
        # padding rows read a scratch slot no row of this pass wrote: only real rows are comparable
        num_real = len(per_row)
        assert got[0][:num_real] == want[0][:num_real]
        assert got[1][:num_real] == want[1][:num_real]
        for rid in rids:
            kv.free(rid)


def test_decode_graph_replay_equals_eager_at_the_bucket_shape(llama8b):
    """The captured decode step (gather from the device state, forward, sampler, scatter) == the eager step."""
    cfg, weights = llama8b
    policy = FastPolicy()
    kv = KVStore(cfg, num_blocks=1024, block_size=16, num_scratch_slots=256, dtype=weights.dtype, device="cuda")
    state = DecodeState(weights, cfg, kv, policy, max_num_seqs=32)
    graphs = DecodeGraphs(state, max_batch_size=32)
    rng = random.Random(9)
    num_seqs = 16  # a bucket: the eager GEMMs see the same M as the replay
    slots = []
    for rid in range(num_seqs):
        length = rng.randint(1, 300)
        kv.allocate(rid, length)
        kv.append(rid, length)
        state.admit(rid, rid, SamplingParams(), 0)
        state.set_next(rid, rng.randrange(cfg.vocab_size), length - 1)
        slots.append(rid)
    state.flush()
    for layer in range(cfg.num_layers):  # random K/V, never zeros
        kv.layers().k[layer].normal_()
        kv.layers().v[layer].normal_()
    saved = state.snapshot()
    state.stage_batch(slots, num_seqs)
    replayed = [t.clone() for t in graphs.run(num_seqs, (False, False))]
    after_replay = state.snapshot()
    state.restore(saved)
    state.stage_batch(slots, num_seqs)
    # the graph fixed attention's split count from the model's context length: give eager the same bound
    eager = state.decode(num_seqs, variant=(False, False), max_context_len=cfg.max_position_embeddings)
    assert torch.equal(replayed[0], eager[0]) and torch.equal(replayed[1], eager[1])
    assert all(torch.equal(a, b) for a, b in zip(after_replay, state.snapshot()))  # the same scatter


def test_sync_free_sampler_matches_the_synchronising_one():
    gen = torch.Generator(device="cuda").manual_seed(0)
    num_rows, vocab = 64, 128256
    logits = (torch.randn(num_rows, vocab, generator=gen, device="cuda") * 6).to(torch.bfloat16)
    for sampled_fraction in (0.0, 0.5, 1.0):
        temperature = torch.where(torch.rand(num_rows, generator=gen, device="cuda") < sampled_fraction, 0.8, 0.0)
        rows = dict(temperature=temperature.float(),
                    top_k=torch.randint(0, 100, (num_rows,), generator=gen, device="cuda"),
                    top_p=torch.rand(num_rows, generator=gen, device="cuda") * 0.5 + 0.5,
                    seeds=torch.randint(0, 1 << 40, (num_rows,), generator=gen, device="cuda"),
                    positions=torch.randint(0, 4096, (num_rows,), generator=gen, device="cuda"))
        reference = sample(logits, SamplingRows(**rows))
        is_any = bool((temperature > 0).any())
        for flag in {is_any, True}:
            got = sample(logits, SamplingRows(**rows, is_any_sampled=flag, is_any_filtered=True))
            assert torch.equal(got[0], reference[0]) and torch.equal(got[1], reference[1])
