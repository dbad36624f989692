"""One wide random model shared by the property suite (weights are immutable, so sharing is safe)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from llm42 import DVRGenerator, ModelConfig, Scheduler
from llm42.model.weights import Weights, random_weights
from llm42.policies import FixedShapePolicy, ReductionPolicy
from llm42.testing import wide_model_config
from llm42.verify import CanonicalConfig
from tests.helpers import lag_passes


@dataclass(frozen=True)
class WideModel:
    """Weights + config of the suite's model, and a way to build generators over them."""

    weights: Weights
    cfg: ModelConfig

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def factory(
        self,
        canonical: CanonicalConfig,
        *,
        fast_policy: ReductionPolicy | None = None,
        scheduler: Callable[[], Scheduler] | None = None,
        max_num_seqs: int = 256,
        kv_cache_tokens: int = 1024,
        key_block: int = 64,
        block_size: int = 16,
        prefix_cache: bool = True,
        adaptive_draft: bool = False,
        canonical_thread: bool = False,
        verifier: Callable[[], object] | None = None,
        max_canonical_tokens: int | None = None,
        mixed_steps: bool | None = None,
        pass_lag: int = 0,
    ) -> Callable[[], DVRGenerator]:
        """Builds a fresh generator per call over the shared weights.

        ``scheduler`` is a factory too, since schedulers may keep state; the
        fast policy object is shared by the generators (its state never
        matters to committed deterministic output). Small ``max_num_seqs`` or
        ``kv_cache_tokens`` make requests queue for admission. ``key_block`` is
        the canonical attention's key block: part of the canonical config, so a
        reference must use the same one. ``block_size`` (K/V page size) is not:
        it only moves K/V around, and small pages make prefix-cache hits common.
        ``adaptive_draft`` changes only when requests draft and verify, never what they commit.
        ``canonical_thread`` runs the passes on a worker thread while fast steps go on: only when a
        pass is applied changes.
        ``verifier`` (a factory, called per generator) replaces the canonical pass and commit rule:
        the mutation controls plug broken ones in here; ``key_block`` is then the verifier's business.
        ``max_canonical_tokens``: rows per canonical pass (None: the default, passes of up to 512 rows
        here); never changes a committed bit.
        ``mixed_steps``: decode rows and free prompt chunks in one forward pass (None: the default, off on
        the CPU); the fast path's business only.
        ``pass_lag``: each canonical pass is applied only after that many more asks (``lag_passes``), as on
        a busy GPU: deterministic requests draft ahead of their windows meanwhile.
        """

        def build() -> DVRGenerator:
            canonical_side = (dict(canonical_policy=FixedShapePolicy(key_block=key_block)) if verifier is None
                              else dict(verifier=verifier()))
            return lag_passes(DVRGenerator(
                self.weights, self.cfg, window=canonical.window, group=canonical.group,
                fast_policy=fast_policy, scheduler=None if scheduler is None else scheduler(),
                max_num_seqs=max_num_seqs, kv_cache_tokens=kv_cache_tokens, block_size=block_size,
                prefix_cache=prefix_cache, adaptive_draft=adaptive_draft, canonical_thread=canonical_thread,
                max_canonical_tokens=max_canonical_tokens, mixed_steps=mixed_steps, **canonical_side,
            ), pass_lag)

        return build

    def verifier(self, canonical: CanonicalConfig, policy: ReductionPolicy):
        """The verifier a generator builds for ``canonical`` and ``policy`` over these weights
        (taken from one, so it is whatever the library's verifier is; mutations wrap or resize it)."""
        gen = DVRGenerator(self.weights, self.cfg, window=canonical.window, group=canonical.group,
                           canonical_policy=policy, kv_cache_tokens=self.cfg.max_position_embeddings)
        return gen.verifier


@pytest.fixture(scope="session")
def wide_model() -> WideModel:
    # hidden 512 in fp32: CPU GEMMs give a row different bits for different batch sizes
    # (test_contract checks this), so agreeing with the batch-size-1 reference is not free
    cfg = wide_model_config(vocab_size=384, max_position_embeddings=64)
    return WideModel(random_weights(cfg, seed=42), cfg)


FAMILY_OPTIONS = {"llama": {}, "qwen2": {}, "qwen3": {}, "mistral": {"sliding_window": 8}}


@pytest.fixture(scope="session")
def family_models() -> dict[str, WideModel]:
    """One wide model per supported family (q/k/v bias, q/k norm, a sliding window shorter than prompts)."""
    models = {}
    for seed, (family, options) in enumerate(FAMILY_OPTIONS.items()):
        cfg = wide_model_config(vocab_size=256, max_position_embeddings=64, family=family, **options)
        models[family] = WideModel(random_weights(cfg, seed=seed), cfg)
    return models
