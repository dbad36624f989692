"""RL and evaluation: score(), log-prob modes and top-N alternatives, n samples, update_weights."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from llm42 import DVRGenerator, SamplingParams
from llm42.model.loader import embedded_model_path
from llm42.model.weights import hf_tensor_shapes, weight_views
from llm42.ops import exact
from llm42.params import sample_seed
from llm42.rl import differentiable_score, policy_logprobs, state_dict, trainable_parameters, trainable_weights

PROMPTS = [[1, 403, 407, 261, 378], [1, 66, 286, 312], [1, 403, 407, 261, 378, 11, 60]]
SAMPLED = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=40, top_p=0.9, seed=7, deterministic=True,
                         logprobs=True)


def new_gen(path=None, **kwargs) -> DVRGenerator:
    return DVRGenerator.from_pretrained(path, window=4, group=3, kv_cache_tokens=2048, **kwargs)


@pytest.fixture(scope="module")
def gen() -> DVRGenerator:
    return new_gen()


def hexes(values):
    return [v.hex() for v in values]


# -- score -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_score_equals_committed_logprobs(gen, mode):
    params = SamplingParams(**{**SAMPLED.__dict__, "logprobs_mode": mode})
    outs = gen.generate(PROMPTS, params)
    scored = gen.score(PROMPTS, [o.token_ids for o in outs], params)
    assert [hexes(s) for s in scored] == [hexes(o.logprobs) for o in outs]
    alone = [gen.score([p], [o.token_ids], params)[0] for p, o in zip(PROMPTS, outs)]
    assert [hexes(s) for s in alone] == [hexes(o.logprobs) for o in outs]


def test_score_returns_the_top_logprobs_a_deterministic_generation_committed(gen):
    params = SamplingParams(**{**SAMPLED.__dict__, "logprobs": 3})
    outs = gen.generate(PROMPTS, params)
    scored, tops = gen.score(PROMPTS, [o.token_ids for o in outs], params, return_top_logprobs=True)
    assert [hexes(s) for s in scored] == [hexes(o.logprobs) for o in outs]
    assert tops == [o.top_logprobs for o in outs]
    assert all(len(t) == 3 for top in tops for t in top)
    # negative control: the same completion after another prompt has other alternatives (not vacuous)
    other = gen.score([PROMPTS[1]], [outs[0].token_ids], params, return_top_logprobs=True)[1][0]
    assert len(other) == len(tops[0]) and other != tops[0]
    with pytest.raises(ValueError, match="logprobs = N"):
        gen.score(PROMPTS[:1], [outs[0].token_ids], SAMPLED, return_top_logprobs=True)


def test_score_uses_and_feeds_the_prefix_cache():
    gen = new_gen(block_size=4)
    prompt = [1] + list(range(300, 320))
    out = gen.generate([prompt], SAMPLED)[0]
    first = gen.score([prompt], [out.token_ids], SAMPLED)[0]
    assert gen.kv.num_cached_blocks > 0
    fresh = new_gen(block_size=4).score([prompt], [out.token_ids], SAMPLED)[0]
    assert hexes(first) == hexes(fresh) == hexes(out.logprobs)
    assert gen.stats["score_passes"] > 0 and gen.stats["scored_tokens"] == len(out.token_ids)


def test_score_while_requests_run_leaves_them_untouched(gen):
    reference = gen.generate([PROMPTS[0]], SAMPLED)[0]
    rid = gen.submit(PROMPTS[0], SAMPLED)
    for _ in range(3):
        gen.step()
    scored = gen.score([PROMPTS[1]], [[5, 6, 7]])
    while gen.has_unfinished():
        gen.step()
    got = gen.result(rid)
    assert got.token_ids == reference.token_ids and hexes(got.logprobs) == hexes(reference.logprobs)
    assert len(scored[0]) == 3


def test_score_validates_its_input(gen):
    assert gen.score([PROMPTS[0]], [[]]) == [[]]
    with pytest.raises(ValueError, match="completions has 1 entries for 2 prompts"):
        gen.score(PROMPTS[:2], [[1]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gen.score([PROMPTS[0]], [[gen.vocab_size]])
    with pytest.raises(TypeError, match="list of token ids"):
        gen.score([PROMPTS[0]], ["hello"])
    with pytest.raises(ValueError, match="context"):
        gen.score([PROMPTS[0]], [[5] * gen.cfg.max_position_embeddings])


def test_score_takes_string_prompts(gen):
    ids = gen.tokenizer.encode("Once upon a time")
    assert hexes(gen.score(["Once upon a time"], [[5, 6]])[0]) == hexes(gen.score([ids], [[5, 6]])[0])


# -- log-prob modes and top-N --------------------------------------------------------------------
def test_top_logprobs_are_sorted_and_hold_the_greedy_token(gen):
    out = gen.generate([PROMPTS[0]], SamplingParams(max_new_tokens=6, deterministic=True, logprobs=5))[0]
    assert len(out.top_logprobs) == len(out.token_ids) == len(out.logprobs)
    for token, logprob, top in zip(out.token_ids, out.logprobs, out.top_logprobs):
        assert len(top) == 5
        values = list(top.values())
        assert values == sorted(values, reverse=True)
        assert next(iter(top)) == token and top[token] == logprob


@pytest.mark.parametrize("deterministic", [True, False])
def test_processed_logprobs_are_the_sampling_distribution(gen, deterministic):
    params = SamplingParams(max_new_tokens=6, temperature=0.7, top_k=3, seed=1, deterministic=deterministic,
                            logprobs=5, logprobs_mode="processed")
    out = gen.generate([PROMPTS[1]], params)[0]
    for token, logprob, top in zip(out.token_ids, out.logprobs, out.top_logprobs):
        assert len(top) <= 3  # tokens outside the top-k support have probability 0 and are left out
        assert token in top and top[token] == logprob
        assert math.isclose(sum(math.exp(v) for v in top.values()), 1.0, rel_tol=1e-5)
    greedy = gen.generate([PROMPTS[1]], SamplingParams(max_new_tokens=4, deterministic=deterministic,
                                                       logprobs=2, logprobs_mode="processed"))[0]
    assert greedy.logprobs == [0.0] * 4
    assert all(top == {t: 0.0} for t, top in zip(greedy.token_ids, greedy.top_logprobs))


def test_top_logprobs_are_batch_independent_for_deterministic_requests(gen):
    params = SamplingParams(**{**SAMPLED.__dict__, "logprobs": 4})
    alone = gen.generate([PROMPTS[2]], params)[0]
    batched = gen.generate(PROMPTS, params)[2]
    assert batched.token_ids == alone.token_ids and batched.top_logprobs == alone.top_logprobs


def test_free_requests_get_top_logprobs_too(gen):
    out = gen.generate([PROMPTS[0]], SamplingParams(max_new_tokens=5, logprobs=3))[0]
    assert len(out.top_logprobs) == 5 and all(len(t) == 3 for t in out.top_logprobs)
    plain = gen.generate([PROMPTS[0]], SamplingParams(max_new_tokens=5, logprobs=True))[0]
    assert plain.top_logprobs is None and plain.token_ids == out.token_ids


@pytest.mark.parametrize("field, value, error", [
    ("logprobs", 21, ValueError), ("logprobs", -1, ValueError), ("logprobs", "3", TypeError),
    ("logprobs_mode", "scaled", ValueError), ("n", 0, ValueError), ("n", True, TypeError),
])
def test_bad_logprob_and_n_fields_are_rejected(field, value, error):
    with pytest.raises(error, match=field):
        SamplingParams(**{field: value})


# -- n samples -----------------------------------------------------------------------------------
def test_n_samples_come_one_after_another_each_reproducible_alone(gen):
    base = SamplingParams(**{**SAMPLED.__dict__, "temperature": 1.5, "top_k": 0, "top_p": 1.0})
    params = SamplingParams(**{**base.__dict__, "n": 3})
    outs = gen.generate(PROMPTS[:2], params)
    assert len(outs) == 6
    assert [o.prompt_token_ids for o in outs] == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    assert len({tuple(o.token_ids) for o in outs[:3]}) == 3  # distinct seeds, distinct samples
    for i, out in enumerate(outs[:3]):
        alone = gen.generate([PROMPTS[0]], SamplingParams(**{**base.__dict__, "seed": sample_seed(7, i)}))[0]
        assert alone.token_ids == out.token_ids and hexes(alone.logprobs) == hexes(out.logprobs)
    assert outs[0].token_ids == gen.generate([PROMPTS[0]], base)[0].token_ids  # sample 0 keeps the seed


def test_submit_refuses_n_and_submit_samples_returns_each_id(gen):
    params = SamplingParams(**{**SAMPLED.__dict__, "n": 2})
    with pytest.raises(ValueError, match="submit_samples"):
        gen.submit(PROMPTS[0], params)
    rids = gen.submit_samples(PROMPTS[0], params)
    while gen.has_unfinished():
        gen.step()
    assert [gen.result(r).token_ids for r in rids] == [o.token_ids for o in gen.generate([PROMPTS[0]], params)]


def test_stream_indexes_samples_as_generate_orders_them(gen):
    params = SamplingParams(**{**SAMPLED.__dict__, "n": 2, "max_new_tokens": 4})
    streamed: dict[int, list[int]] = {}
    for index, tokens in gen.stream(PROMPTS[:2], params):
        streamed.setdefault(index, []).extend(tokens)
    assert [streamed[i] for i in range(4)] == [o.token_ids for o in gen.generate(PROMPTS[:2], params)]


def test_sample_seed_is_documented_weyl_sequence():
    assert sample_seed(5, 0) == 5
    assert sample_seed(5, 2) == ((5 + 2 * 0x9E3779B97F4A7C15 + 2**63) % 2**64) - 2**63


# -- update_weights ------------------------------------------------------------------------------
def perturbed_state_dict(gen: DVRGenerator, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: view + 0.05 * torch.randn(view.shape, generator=g) * view.std().clamp(min=1e-3)
            for name, view in weight_views(gen.cfg, gen.weights).items()}


def test_update_weights_equals_a_fresh_generator_with_the_new_weights(tmp_path):
    gen = new_gen(block_size=4)
    prompt = PROMPTS[2]
    before = gen.generate([prompt], SAMPLED)[0]
    assert gen.kv.num_cached_blocks > 0
    new = perturbed_state_dict(gen, seed=3)
    qkv = gen.weights.layers[0].qkv
    stale_slices = exact.SHARED_WEIGHT_SLICES.get(qkv)[0].clone()
    gen.update_weights(new)
    assert gen.kv.num_cached_blocks == 0
    fresh_slices = exact.WeightSlices._slice(qkv)[0]
    assert torch.equal(exact.SHARED_WEIGHT_SLICES.get(qkv)[0], fresh_slices)
    assert not torch.equal(stale_slices, fresh_slices)
    after = gen.generate([prompt], SAMPLED)[0]

    directory = tmp_path / "new"
    shutil.copytree(embedded_model_path(), directory)
    save_file({k: v.contiguous() for k, v in new.items()}, str(directory / "model.safetensors"))
    reference = new_gen(directory, block_size=4).generate([prompt], SAMPLED)[0]
    assert after.token_ids == reference.token_ids and hexes(after.logprobs) == hexes(reference.logprobs)
    assert hexes(after.logprobs) != hexes(before.logprobs)

    back = new_gen(block_size=4)
    back.update_weights(directory)  # a checkpoint path
    again = back.generate([prompt], SAMPLED)[0]
    assert hexes(again.logprobs) == hexes(reference.logprobs)


def test_update_weights_checks_everything_before_copying(gen):
    good = load_file(str(embedded_model_path() / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    embed_before = gen.weights.embed.clone()
    cases = [
        ({**good, "model.embed_tokens.weight": good["model.embed_tokens.weight"] + 1,
          name: good[name][:, :-1]}, ValueError, "down_proj.weight' has shape"),
        ({**good, name: good[name].double()}, TypeError, "down_proj.weight' has dtype torch.float64"),
        ({**good, "model.layers.0.extra.weight": good[name]}, ValueError, "extra.weight' is not a tensor"),
        ({k: v for k, v in good.items() if k != name}, ValueError, "lacks tensor.*down_proj"),
        ({**good, name: good[name].tolist()}, TypeError, "is a list, not a tensor"),
    ]
    for state_dict, error, message in cases:
        with pytest.raises(error, match=message):
            gen.update_weights(state_dict)
    assert torch.equal(gen.weights.embed, embed_before)
    gen.update_weights({name: good[name]}, strict=False)
    with pytest.raises(TypeError, match="state dict"):
        gen.update_weights(42)


def test_update_weights_is_refused_while_requests_run():
    gen = new_gen()
    gen.submit(PROMPTS[0], SAMPLED)
    with pytest.raises(RuntimeError, match="unfinished"):
        gen.update_weights(dict(weight_views(gen.cfg, gen.weights)))
    assert set(hf_tensor_shapes(gen.cfg)) == set(weight_views(gen.cfg, gen.weights))


# -- the differentiable scoring path ---------------------------------------------------------
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_differentiable_score_has_the_exact_values_and_the_float_models_gradient(gen, mode):
    params = SamplingParams(**{**SAMPLED.__dict__, "logprobs_mode": mode})
    outs = gen.generate(PROMPTS[:2], params)
    trainer = trainable_weights(gen.weights)
    completions = [o.token_ids for o in outs]
    exact_lps = differentiable_score(gen, trainer, PROMPTS[:2], completions, params)
    assert [hexes(lp.tolist()) for lp in exact_lps] == [hexes(o.logprobs) for o in outs]
    sum(lp.sum() for lp in exact_lps).backward()
    exact_grads = [t.grad.clone() for t in trainable_parameters(trainer)]
    for t in trainable_parameters(trainer):
        t.grad = None
    float_lps = policy_logprobs(trainer, gen.cfg, PROMPTS[:2], completions, params)
    assert all(torch.allclose(f, e, atol=1e-4) for f, e in zip(float_lps, exact_lps))  # close, not equal
    sum(lp.sum() for lp in float_lps).backward()
    for exact_grad, t in zip(exact_grads, trainable_parameters(trainer)):
        assert torch.equal(exact_grad, t.grad)  # the same graph: the exact values only replace the forward
    assert any(g.abs().sum() > 0 for g in exact_grads)


def test_state_dict_round_trips_through_update_weights():
    gen = new_gen()
    trainer = trainable_weights(gen.weights)
    with torch.no_grad():
        trainer.norm.mul_(1.5)
    gen.update_weights(state_dict(gen.cfg, trainer))
    assert torch.equal(gen.weights.norm, trainer.norm.detach()) and not gen.weights.norm.requires_grad
