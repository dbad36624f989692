"""A stateful machine over scheduler + KV store: requests arrive between steps and
the bookkeeping invariants hold after every operation."""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.policies import NoisyFastPolicy
from tests.helpers import tiny_config

CFG = tiny_config(max_position_embeddings=64)
WEIGHTS = random_weights(CFG, seed=3)


class EngineMachine(RuleBasedStateMachine):
    @initialize(window=st.integers(1, 4), group=st.integers(1, 3), noisy=st.booleans(),
                kv_tokens=st.sampled_from([64, 96, 160]), prompt_drafts=st.booleans())
    def build(self, window, group, noisy, kv_tokens, prompt_drafts):
        policy = NoisyFastPolicy(scale=3.0, seed=window) if noisy else None
        # prompt_drafts: the fast path also appends K/V positions for deterministic prompts and drafts from them
        self.gen = DVRGenerator(WEIGHTS, CFG, window=window, group=group, fast_policy=policy,
                                kv_cache_tokens=kv_tokens, block_size=8, max_fast_tokens=16,
                                prompt_drafts=prompt_drafts)
        self.committed: dict[int, list[int]] = {}
        self.limits: dict[int, int] = {}
        self.finished: set[int] = set()

    @rule(stem=st.sampled_from([(), tuple(range(3, 20)), tuple(range(40, 57))]),
          tail=st.lists(st.integers(3, CFG.vocab_size - 1), min_size=1, max_size=12),
          max_new=st.integers(1, 12), deterministic=st.booleans(), sampled=st.booleans())
    def submit(self, stem, tail, max_new, deterministic, sampled):
        prompt = list(stem) + tail
        params = SamplingParams(max_new_tokens=max_new, deterministic=deterministic,
                                temperature=0.9 if sampled else 0.0, seed=len(prompt))
        rid = self.gen.submit(prompt, params)
        self.committed[rid] = []
        self.limits[rid] = max_new

    @precondition(lambda self: self.gen.has_unfinished())
    @rule()
    def step(self):
        events = self.gen.step()
        for rid, tokens in events.items():
            assert tokens, "an event never carries zero tokens"
            self.committed[rid] += tokens
        for rid in list(self.committed):
            if rid in self.finished:
                continue
            try:
                done = self.gen.result(rid)
            except ValueError:
                continue
            self.finished.add(rid)
            assert done.token_ids == self.committed[rid]
            assert done.finish_reason in ("stop", "length")
            assert len(done.token_ids) <= self.limits[rid]

    @invariant()
    def blocks_are_conserved(self):
        kv = self.gen.kv
        assert kv.num_free_blocks + kv.num_cached_blocks + kv.num_used_blocks == kv.num_blocks
        assert kv.num_unreserved_blocks >= 0

    @invariant()
    def committed_never_shrinks(self):
        for rid, seen in self.committed.items():
            if rid in self.finished:
                continue
            now = self.gen.committed_tokens(rid)
            assert now[: len(seen)] == seen and len(now) >= len(seen)

    @invariant()
    def finished_requests_hold_no_blocks(self):
        for rid in self.finished:
            assert not self.gen.kv.holds(rid)

    @invariant()
    def idle_engine_holds_nothing(self):
        if not self.gen.has_unfinished():
            assert self.gen.kv.num_used_blocks == 0
            assert self.gen.kv.num_free_blocks + self.gen.kv.num_cached_blocks == self.gen.kv.num_blocks
            assert self.gen.kv.num_unreserved_blocks == self.gen.kv.num_blocks


EngineMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
TestEngineStateMachine = EngineMachine.TestCase
