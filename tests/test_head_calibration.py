"""The 8B shape's calibrated output head (``llm42.bench.figures.HeadBasis``, ``calibrate_head``).

The head is ``std x N`` plus a logit bias ``b x std x sqrt(H) x z``; the
search moves ``b`` until the probe's flip rate matches a target. The probe
itself needs a GPU to flip, so here it is replaced by a known, decreasing
function of ``b`` (read back from the model's bias): the search must bracket
and approach the target, extend its range when the ends do not bracket, and
say so when even the extended range does not. The bias really is added to the
logits, on the fast path and the canonical pass alike.
"""

from __future__ import annotations

import math

import pytest
import torch

from llm42.bench import build_model
from llm42.bench import figures as figures_module
from llm42.bench.figures import FiguresConfig, HeadBasis, calibrate_head

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    model = build_model("tiny", device=CPU, dtype=torch.float32, max_positions=256, seed=0)
    return model


def _config(**overrides) -> FiguresConfig:
    base = dict(device="cpu", model="tiny", random_model="tiny", dtype=torch.float32, budget_s=60.0,
                flip_steps=2, flip_alone=2)
    return FiguresConfig(**{**base, **overrides})


def test_head_basis_bias_is_spread_like_the_weights_logits(tiny):
    cfg = tiny.cfg
    basis = HeadBasis.draw(cfg, CPU, std=0.2, seed=0)
    weight, bias = basis.head(0.0, torch.float32)
    assert torch.equal(weight, basis.noise * 0.2) and bias is None
    weight3, bias3 = basis.head(3.0, torch.float32)
    assert torch.equal(weight3, weight) and bias3.shape == (cfg.vocab_size,)
    hidden = torch.randn(4096, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    hidden *= (cfg.hidden_size ** 0.5) / hidden.norm(dim=-1, keepdim=True)  # |h| = sqrt(H), as after the norm
    assert 0.8 < float(bias3.std() / (3 * (hidden @ weight.T).std())) < 1.25
    # the same seed draws the same basis; another seed another one
    assert torch.equal(HeadBasis.draw(cfg, CPU, std=0.2, seed=0).direction, basis.direction)
    assert not torch.equal(HeadBasis.draw(cfg, CPU, std=0.2, seed=1).direction, basis.direction)


def test_a_larger_bias_makes_fewer_rows_flip_under_the_same_drift(tiny):
    """What makes the bias a calibration knob: perturb the final hidden states by the same small relative drift
    and count rows whose winner changes. Fewer flip as the bias grows, down to none; scaling the weight (the
    search round 2 made) changes nothing."""
    cfg = tiny.cfg
    basis = HeadBasis.draw(cfg, CPU, std=0.2, seed=0)
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(20000, cfg.hidden_size, generator=gen)
    drift = torch.randn(hidden.shape, generator=gen)
    drift *= 0.01 * hidden.norm(dim=-1, keepdim=True) / drift.norm(dim=-1, keepdim=True)

    def flips(weight: torch.Tensor, bias: torch.Tensor | None) -> int:
        return int((torch.nn.functional.linear(hidden, weight, bias).argmax(-1)
                    != torch.nn.functional.linear(hidden + drift, weight, bias).argmax(-1)).sum())

    counts = [flips(*basis.head(b, torch.float32)) for b in (0.0, 0.5, 2.0, 8.0, 32.0, 128.0)]
    assert counts == sorted(counts, reverse=True) and counts[0] > 100 and counts[-1] * 10 < counts[0], counts
    weight, _ = basis.head(0.0, torch.float32)
    assert flips(weight * 10, None) == counts[0]


def test_the_bias_reaches_the_logits_of_both_paths(tiny):
    """The calibrated model's bias is part of its forward pass: fast path and canonical pass both add it."""
    from llm42 import DVRGenerator, SamplingParams

    basis = HeadBasis.draw(tiny.cfg, CPU, std=0.02, seed=0)
    biased = figures_module.with_head(tiny, basis, 64.0)  # a bias this large decides every token
    winner = int(torch.argmax(biased.weights.lm_head_bias))
    outputs = {}
    for det in (False, True):
        gen = DVRGenerator(biased.weights, tiny.cfg, window=4, group=2, max_num_seqs=2)
        (out,) = gen.generate([[5, 6, 7]], SamplingParams(max_new_tokens=6, ignore_eos=True, deterministic=det))
        outputs[det] = out.token_ids
    assert outputs[False] == outputs[True] == [winner] * 6
    plain = figures_module.with_head(tiny, basis, 0.0)
    gen = DVRGenerator(plain.weights, tiny.cfg, window=4, group=2, max_num_seqs=2)
    (out,) = gen.generate([[5, 6, 7]], SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert out.token_ids != [winner] * 6  # negative control: without the bias the winner is not forced


def _fake_probe(monkeypatch, tiny, rate_of_scale):
    """Replace the flip-rate probe with ``rate_of_scale(the bias scale read back from the model)``."""
    basis = HeadBasis.draw(tiny.cfg, CPU, std=0.02, seed=0)
    direction = basis.direction * 0.02
    calls = []

    def probe(weights, cfg, prompts, **kwargs):
        assert torch.equal(weights.lm_head, basis.noise * 0.02)
        scale = float(weights.lm_head_bias @ direction / (direction @ direction))
        calls.append(scale)
        rate = rate_of_scale(scale)
        half = {"num_compared": 100, "num_flips": round(rate * 100), "rate": rate}
        return {"rate": rate, "num_compared": 200, "num_flips": 2 * half["num_flips"], "greedy": half,
                "sampled": half}

    monkeypatch.setattr(figures_module, "flip_rate", probe)
    return calls


def test_calibration_bisects_to_the_target(monkeypatch, tiny):
    calls = _fake_probe(monkeypatch, tiny, lambda b: 0.1 / (1 + b))
    target = 0.1 / (1 + 4.0)  # reached at scale 4
    model, result = calibrate_head(tiny, [(5, 6, 7)], target, _config(calibrate_iterations=6),
                                   deadline=math.inf)
    assert result["is_bracketed"] and "note" not in result
    assert [round(p, 3) for p in calls[:2]] == [1.0, 16.0]  # the model really carries the tried scales
    assert len(result["tried"]) == 2 + 6
    assert model.lm_head_bias_scale == result["chosen_lm_head_bias_scale"]
    assert abs(result["achieved_rate"] - target) / target < 0.15
    errors = [abs(t["rate"] - target) for t in result["tried"][2:]]
    assert min(errors) < abs(result["tried"][0]["rate"] - target)


def test_calibration_extends_the_range_when_its_ends_do_not_bracket(monkeypatch, tiny):
    calls = _fake_probe(monkeypatch, tiny, lambda b: 0.1 / (1 + b))
    target = 0.1 / (1 + 40.0)  # beyond the default range's 16: needs one 4x extension (64)
    _, result = calibrate_head(tiny, [(5, 6, 7)], target, _config(), deadline=math.inf)
    assert round(calls[2], 3) == 64.0
    assert result["is_bracketed"] and result["searched"][0] >= 16.0
    assert abs(result["achieved_rate"] - target) / target < 0.3


def test_calibration_says_when_the_target_is_out_of_reach(monkeypatch, tiny):
    """Negative control: a rate floor above the target is never bracketed, and the result says so."""
    _fake_probe(monkeypatch, tiny, lambda b: 0.05 + 0.1 / (1 + b))
    _, result = calibrate_head(tiny, [(5, 6, 7)], 0.01, _config(), deadline=math.inf)
    assert not result["is_bracketed"] and "do not reproduce" in result["note"]
    assert len(result["tried"]) == 2 + 2  # both extensions tried, no bisection
    assert result["chosen_lm_head_bias_scale"] == max(t["lm_head_bias_scale"] for t in result["tried"])


def test_calibration_range_is_validated():
    with pytest.raises(ValueError, match="calibrate_range"):
        _config(calibrate_range=(2.0, 1.0))
    with pytest.raises(ValueError, match="calibrate_extensions"):
        _config(calibrate_extensions=-1)


def test_flip_probe_measures_min_steps_even_past_its_deadline(tiny):
    """On the H200 the first probe's set-up (compilation, graph capture) outlasted its slice and measured
    nothing; ``min_steps`` steps are always measured."""
    from llm42.bench.flips import flip_rate

    prompts = [(5, 6, 7, 8), (9, 10, 11), (12, 13)]
    got = flip_rate(tiny.weights, tiny.cfg, prompts, num_steps=6, num_alone=1, deadline=0.0, min_steps=3)
    assert got["num_steps"] == 3 and got["num_compared"] == 3
    none = flip_rate(tiny.weights, tiny.cfg, prompts, num_steps=6, num_alone=1, deadline=0.0)
    assert none["num_steps"] == 0 and none["rate"] is None  # what happened there
