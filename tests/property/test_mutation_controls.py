"""Mutation controls: the contract property fails for a broken canonical pass and for a broken commit rule.

Each test runs the contract property's own example (``contract_example``, the
noisy variant: every run rolls back, so windows start and end elsewhere than in
the reference) with one mutation from mutations.py in the runs *and* in the
references, for a bounded, derandomized search, and requires the property to
find a divergence. Vacuous passes are ruled out twice: the mutation must have
been exercised (its broken code ran with different batch-dependent choices, or
a rejected candidate was kept), and rollbacks must have happened.
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from . import mutations
from .test_contract import contract_example

NUM_EXAMPLES = 6  # a search, not a proof: enough that each mutation is found, few enough to stay fast


def _num_choices(counts: Counter, prefix: str) -> int:
    return sum(1 for key in counts if key.startswith(prefix))


# (mutation, how to tell it was exercised: a count over the search that must be positive)
CASES = {
    "shrinking_pass_with_split_k_by_rows": (mutations.shrinking_pass,
                                            lambda counts: _num_choices(counts, "gemm_splits_") - 1),
    "split_kv_sized_by_the_batch": (mutations.batch_sized_split_kv,
                                    lambda counts: _num_choices(counts, "key_split_") - 1),
    "commit_rule_keeping_a_rejected_candidate": (mutations.commit_keeps_rejected,
                                                 lambda counts: counts["kept_rejected_candidates"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_contract_property_fails_for_a_broken_pass_or_commit_rule(wide_model, case):
    mutation, num_exercised = CASES[case]
    counts: Counter = Counter()
    outcomes: list[tuple[int, int]] = []  # per example: (divergences found, rollbacks)

    @settings(max_examples=NUM_EXAMPLES, derandomize=True, database=None, phases=[Phase.generate],
              deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def search(data):
        check = contract_example(wide_model, data, is_noisy=True,
                                 mutation=functools.partial(mutation, counts=counts)).check
        outcomes.append((len(check.divergences), check.num_rollbacks))

    search()
    assert len(outcomes) == NUM_EXAMPLES
    assert num_exercised(counts) > 0, f"the mutation was never exercised: {dict(counts)}"
    assert all(rollbacks > 0 for _, rollbacks in outcomes), f"an example without rollbacks: {outcomes}"
    # the property fails if one example does, so one of the search's examples must find a divergence. How
    # many do depends on the CPU's library kernels (how often the mutation's batch-dependent choice changes a
    # bit): 5 of 6 for split_kv_sized_by_the_batch on an Intel CI machine, 2 of 6 on an AMD EPYC one
    num_failing = sum(1 for found, _ in outcomes if found)
    assert num_failing >= 1, (
        f"the contract property caught {case} in only {num_failing} of {NUM_EXAMPLES} examples "
        f"(divergences, rollbacks per example: {outcomes})")
