"""``tune_decode_buckets``: a decode batch may replay a larger bucket's graph where that one is faster.

``cheapest_buckets`` is the rule (pure: times in, map out), tested here against its definition on drawn times, with
the control that times growing with the rows map nothing. The knob is a strict bool; off CUDA there are no decode
graphs, so it changes nothing. The timing and the replays on CUDA: tests/gpu/test_decode_buckets_cuda.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm42 import DVRGenerator, SamplingParams
from llm42.cuda_graphs import cheapest_buckets, decode_buckets
from llm42.model.weights import random_weights
from tests.helpers import tiny_config

BUCKETS = decode_buckets(512)


def test_a_bucket_slower_than_a_larger_one_nearby_replays_the_larger_one():
    # round 52's H100 figures for the 8B shape's decode GEMMs (ms), the buckets from 256 to 512 rows
    times = {256: 7.24, 272: 8.00, 288: 9.07, 304: 8.22, 320: 8.57, 336: 9.54, 352: 9.48, 368: 8.90, 384: 9.85,
             400: 11.90, 416: 11.25, 432: 12.0, 448: 14.98, 464: 12.5, 480: 12.63, 496: 12.2, 512: 11.94}
    remap = cheapest_buckets(times)
    assert remap[288] == 304 and remap[336] == 368 and remap[352] == 368 and remap[448] == 512
    assert 256 not in remap and 304 not in remap and 368 not in remap  # already the cheapest at or above them
    assert cheapest_buckets(times, max_growth=1.0) == {}  # no larger bucket allowed: nothing moves


def test_times_that_grow_with_the_rows_map_nothing():
    assert cheapest_buckets({b: 1.0 + b / 100 for b in BUCKETS}) == {}
    # a larger bucket faster by less than min_gain does not count
    assert cheapest_buckets({288: 1.0, 304: 0.98}) == {}
    assert cheapest_buckets({288: 1.0, 304: 0.96}) == {288: 304}


@given(st.lists(st.floats(0.01, 100.0), min_size=len(BUCKETS), max_size=len(BUCKETS)),
       st.floats(1.0, 2.0), st.floats(0.0, 0.5))
def test_each_bucket_goes_to_the_fastest_bucket_in_its_reach_when_that_gains_enough(values, growth, gain):
    times = dict(zip(BUCKETS, values))
    remap = cheapest_buckets(times, max_growth=growth, min_gain=gain)
    for bucket in BUCKETS:
        reach = [b for b in BUCKETS if bucket <= b <= bucket * growth]
        fastest = min(times[b] for b in reach)
        if bucket in remap:
            target = remap[bucket]
            assert target in reach and target > bucket
            assert times[target] == fastest and times[target] < (1.0 - gain) * times[bucket]
        else:
            assert not fastest < (1.0 - gain) * times[bucket]


def test_the_knob_is_a_strict_bool_and_does_nothing_off_cuda():
    cfg = tiny_config()
    weights = random_weights(cfg, seed=3)
    with pytest.raises(TypeError, match="tune_decode_buckets"):
        DVRGenerator(weights, cfg, window=4, group=2, kv_cache_tokens=512, tune_decode_buckets=1)
    params = SamplingParams(max_new_tokens=6, deterministic=True, ignore_eos=True)
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    outputs = []
    for tune in (False, True):
        gen = DVRGenerator(weights, cfg, window=4, group=2, kv_cache_tokens=512, tune_decode_buckets=tune)
        gen.capture_graphs()
        assert gen.fast_step.decode_graphs is None and gen.fast_step.decode_bucket_times == {}
        outputs.append([c.token_ids for c in gen.generate(prompts, params)])
    assert outputs[0] == outputs[1]
