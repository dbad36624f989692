"""Hypothesis strategies for determinism suites: prompts, sampling params, arrivals, batch mixes, configs.

Every strategy is keyword-only and validates its arguments when it is built
(``ValueError`` naming the argument), so a wrong bound fails at collection time,
not in the middle of a shrink. They compose::

    from hypothesis import given, strategies as st
    from llm42.testing import strategies as ls

    @given(mix=ls.batch_mixes(vocab_size=512), data=st.data())
    def test_mine(mix, data):
        schedule = data.draw(ls.arrival_schedules(num_requests=len(mix)))
        ...

Everything drawn shrinks towards the simple case: short prompts, greedy
decoding, all requests arriving at step 0 in index order, the plain fast path.
"""

from __future__ import annotations

from hypothesis import strategies as st

from llm42.model.config import ModelConfig, RopeConfig
from llm42.params import SamplingParams
from llm42.policies import FastPolicy, NoisyFastPolicy
from llm42.policies.base import ReductionPolicy
from llm42.scheduler import DefaultScheduler
from llm42.verify import CanonicalConfig

__all__ = [
    "prompts", "sampling_params", "arrival_schedules", "batch_mixes", "fast_policies", "engine_knobs",
    "canonical_configs", "wide_model_config", "wide_model_configs", "MIN_WIDE_HIDDEN_SIZE",
]

# Below about this width a CPU fp32 GEMM tends to give a row the same bits for
# every batch size, and a determinism test over such a model proves little.
MIN_WIDE_HIDDEN_SIZE = 512


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_range(lo_name: str, lo: int, hi_name: str, hi: int, *, minimum: int) -> None:
    _check_int(lo_name, lo, minimum=minimum)
    _check_int(hi_name, hi, minimum=minimum)
    if lo > hi:
        raise ValueError(f"{lo_name} ({lo}) must be <= {hi_name} ({hi})")


def _check_optional_bool(name: str, value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be None or a bool, got {value!r}")


# -- prompts ---------------------------------------------------------------------------------------
def prompts(*, vocab_size: int, min_len: int = 1, max_len: int = 24) -> st.SearchStrategy[list[int]]:
    """Prompts as lists of token ids in ``[0, vocab_size)`` with ``min_len <= len <= max_len``.

    Half of the draws use a small alphabet, so prompts with repeated tokens
    (and repeated n-grams) are common; shrinks towards ``[0]``.
    """
    _check_int("vocab_size", vocab_size, minimum=1)
    _check_range("min_len", min_len, "max_len", max_len, minimum=1)
    return _prompts(vocab_size, min_len, max_len)


@st.composite
def _prompts(draw, vocab_size: int, min_len: int, max_len: int) -> list[int]:
    alphabet_size = draw(st.sampled_from(sorted({vocab_size, min(vocab_size, 4)})))
    # the small alphabet sits at a drawn offset so it is not always the lowest ids
    offset = draw(st.integers(0, vocab_size - alphabet_size))
    ids = st.integers(0, alphabet_size - 1).map(lambda t: t + offset)
    return draw(st.lists(ids, min_size=min_len, max_size=max_len))


# -- sampling params -------------------------------------------------------------------------------
def sampling_params(
    *,
    max_new_tokens: int = 12,
    min_new_tokens: int = 1,
    deterministic: bool | None = None,
    allow_sampling: bool = True,
    logprobs: bool | None = None,
    vocab_size: int | None = None,
    max_stop_ids: int = 2,
) -> st.SearchStrategy[SamplingParams]:
    """Valid :class:`~llm42.SamplingParams`.

    - ``min_new_tokens <= max_new_tokens`` (the drawn field) ``<= max_new_tokens`` (the argument).
    - ``deterministic``: ``None`` draws it, a bool fixes it.
    - ``allow_sampling=False`` gives greedy params only; otherwise about half the
      draws are seeded temperature sampling with optional top-k / top-p (seeds
      include ``None``, negative and beyond-int64 values, which the engine folds).
    - ``logprobs``: ``None`` draws it, a bool fixes it.
    - ``vocab_size``: when given, up to ``max_stop_ids`` stop token ids are drawn
      from ``[0, vocab_size)`` and top-k ranges up to the vocabulary; without it
      there are no stop ids.

    Greedy draws still carry random top-k / top-p / seed values, which greedy
    decoding must ignore.
    """
    _check_range("min_new_tokens", min_new_tokens, "max_new_tokens", max_new_tokens, minimum=1)
    _check_optional_bool("deterministic", deterministic)
    _check_optional_bool("logprobs", logprobs)
    if not isinstance(allow_sampling, bool):
        raise TypeError(f"allow_sampling must be a bool, got {allow_sampling!r}")
    if vocab_size is not None:
        _check_int("vocab_size", vocab_size, minimum=1)
    _check_int("max_stop_ids", max_stop_ids, minimum=0)
    return _sampling_params(max_new_tokens, min_new_tokens, deterministic, allow_sampling, logprobs,
                            vocab_size, max_stop_ids)


@st.composite
def _sampling_params(draw, max_new_tokens, min_new_tokens, deterministic, allow_sampling, logprobs,
                     vocab_size, max_stop_ids) -> SamplingParams:
    is_sampled = allow_sampling and draw(st.booleans())
    temperature = draw(st.floats(0.05, 2.0, allow_nan=False, allow_infinity=False)) if is_sampled else 0.0
    top_k = draw(st.just(0) | st.integers(1, vocab_size or 64))
    top_p = draw(st.just(1.0) | st.floats(0.05, 1.0, allow_nan=False))
    seed = draw(st.none() | st.integers(0, 2**31 - 1) | st.integers(-(2**70), 2**70))
    stop_ids: tuple[int, ...] = ()
    if vocab_size is not None and max_stop_ids > 0:
        stop_ids = tuple(draw(st.lists(st.integers(0, vocab_size - 1), max_size=max_stop_ids, unique=True)))
    return SamplingParams(
        max_new_tokens=draw(st.integers(min_new_tokens, max_new_tokens)),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        deterministic=draw(st.booleans()) if deterministic is None else deterministic,
        stop_token_ids=stop_ids,
        ignore_eos=draw(st.booleans()),
        logprobs=draw(st.booleans()) if logprobs is None else logprobs,
    )


# -- arrivals --------------------------------------------------------------------------------------
def arrival_schedules(*, num_requests: int, max_gap: int = 2) -> st.SearchStrategy[tuple[int, ...]]:
    """For each of ``num_requests`` requests, the engine step before which it is submitted.

    ``schedule[i]`` is request i's step index. The requests arrive in a drawn
    order (any permutation); the first arrives at step 0 and each later one
    ``0..max_gap`` steps after the previous. Several requests may share a step.
    Run one with :func:`llm42.testing.run_schedule`.
    """
    _check_int("num_requests", num_requests, minimum=1)
    _check_int("max_gap", max_gap, minimum=0)
    return _arrival_schedules(num_requests, max_gap)


@st.composite
def _arrival_schedules(draw, num_requests: int, max_gap: int) -> tuple[int, ...]:
    order = draw(st.permutations(range(num_requests)))
    gaps = draw(st.lists(st.integers(0, max_gap), min_size=num_requests - 1, max_size=num_requests - 1))
    schedule = [0] * num_requests
    step = 0
    for index, gap in zip(order[1:], gaps):
        step += gap
        schedule[index] = step
    return tuple(schedule)


# -- batch mixes -----------------------------------------------------------------------------------
def batch_mixes(
    *,
    vocab_size: int,
    min_size: int = 1,
    max_size: int = 4,
    min_deterministic: int = 1,
    max_prompt_len: int = 24,
    max_new_tokens: int = 12,
    allow_sampling: bool = True,
    shared_prefixes: bool = True,
    logprobs: bool | None = None,
) -> st.SearchStrategy[list[tuple[list[int], SamplingParams]]]:
    """Lists of ``(prompt, params)`` mixing deterministic and free (``deterministic=False``) requests.

    The number of deterministic requests is drawn from ``min_deterministic``
    to the list's size, and their positions are drawn. With ``shared_prefixes``,
    a prompt may start with a prefix of an earlier prompt in the list (the
    case a prefix cache must get right). Prompts and params follow
    :func:`prompts` and :func:`sampling_params` with these bounds.
    ``logprobs``: ``None`` draws it per request, a bool fixes it for every
    request. A determinism suite should pass ``True``: a last-bit difference
    that leaves the argmax alone shows in the log-probs only.
    """
    _check_int("vocab_size", vocab_size, minimum=1)
    _check_range("min_size", min_size, "max_size", max_size, minimum=1)
    _check_int("min_deterministic", min_deterministic, minimum=0)
    if min_deterministic > max_size:
        raise ValueError(f"min_deterministic ({min_deterministic}) must be <= max_size ({max_size})")
    _check_int("max_prompt_len", max_prompt_len, minimum=1)
    _check_int("max_new_tokens", max_new_tokens, minimum=1)
    for name, flag in (("allow_sampling", allow_sampling), ("shared_prefixes", shared_prefixes)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    _check_optional_bool("logprobs", logprobs)
    return _batch_mixes(vocab_size, min_size, max_size, min_deterministic, max_prompt_len, max_new_tokens,
                        allow_sampling, shared_prefixes, logprobs)


@st.composite
def _batch_mixes(draw, vocab_size, min_size, max_size, min_deterministic, max_prompt_len, max_new_tokens,
                 allow_sampling, shared_prefixes, logprobs) -> list[tuple[list[int], SamplingParams]]:
    size = draw(st.integers(max(min_size, min_deterministic), max_size))
    num_deterministic = draw(st.integers(min_deterministic, size))
    is_deterministic = set(draw(st.permutations(range(size)))[:num_deterministic])
    mix: list[tuple[list[int], SamplingParams]] = []
    for i in range(size):
        if shared_prefixes and mix and draw(st.booleans()):
            base = draw(st.sampled_from([p for p, _ in mix]))
            cut = draw(st.integers(1, len(base)))
            tail = draw(st.lists(st.integers(0, vocab_size - 1), max_size=max_prompt_len - cut))
            prompt = base[:cut] + tail
        else:
            prompt = draw(prompts(vocab_size=vocab_size, max_len=max_prompt_len))
        params = draw(sampling_params(
            max_new_tokens=max_new_tokens,
            deterministic=i in is_deterministic,
            allow_sampling=allow_sampling,
            logprobs=logprobs,
            vocab_size=vocab_size,
        ))
        mix.append((prompt, params))
    return mix


# -- engine configuration --------------------------------------------------------------------------
def fast_policies(
    *, allow_plain: bool = True, min_scale: float = 0.1, max_scale: float = 4.0
) -> st.SearchStrategy[ReductionPolicy]:
    """Fast-path policies: the plain :class:`FastPolicy` or a :class:`NoisyFastPolicy`.

    The noisy policy gets a drawn ``scale`` in ``[min_scale, max_scale]`` (its
    logit noise in units of each row's logit std) and a drawn seed. Each draw is
    a fresh object. ``allow_plain=False`` draws noisy policies only.
    """
    if not isinstance(allow_plain, bool):
        raise TypeError(f"allow_plain must be a bool, got {allow_plain!r}")
    for name, value in (("min_scale", min_scale), ("max_scale", max_scale)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if min_scale > max_scale:
        raise ValueError(f"min_scale ({min_scale}) must be <= max_scale ({max_scale})")
    return _fast_policies(allow_plain, float(min_scale), float(max_scale))


@st.composite
def _fast_policies(draw, allow_plain: bool, min_scale: float, max_scale: float) -> ReductionPolicy:
    if allow_plain and draw(st.booleans()):
        return FastPolicy()
    scale = draw(st.floats(min_scale, max_scale, allow_nan=False, allow_infinity=False))
    return NoisyFastPolicy(scale=scale, seed=draw(st.integers(0, 2**31 - 1)))


def engine_knobs(
    *, max_num_seqs: int = 8, max_fast_tokens: int = 64, num_canonical_rows: int | None = None,
    num_layers: int | None = None,
) -> st.SearchStrategy[dict]:
    """Keyword arguments for :class:`~llm42.DVRGenerator` among the knobs that never change a committed bit: how
    many requests run and how many rows a fast step takes, the overlapped loop, drafting ahead of a pass and from a
    fast run of deterministic prompts, adaptive speculation, risky windows, the prefix cache, mixed steps, wide verify
    passes, chained passes (where the verifier chains: CUDA), the CPU's canonical thread, split pass steps and passes
    launched or applied before the fast step's read-back (``split_pass_steps``, ``pass_before_read``,
    ``apply_before_read``), and the default scheduler's rules (a :class:`~llm42.DefaultScheduler` in ``scheduler``).

    ``max_num_seqs`` / ``max_fast_tokens``: the largest values drawn (from 1 and from 2). ``num_canonical_rows``:
    R = window x group of the generators the knobs are for; given, ``max_canonical_tokens`` is drawn too (R, 2R or
    4R: passes of more than R rows, and the wide verify passes they allow). ``num_layers``: the layers of the model
    the generators run; given, ``canonical_slices`` is drawn too (1 up to min(``num_layers``, 4), without the CPU's
    canonical thread, which it refuses). Every draw is a fresh dict (and
    scheduler); each choice lists the engine's default first, which hypothesis shrinks towards. A determinism suite
    passes them to the generator under test, not to its batch-size-1 reference::

        @given(mix=ls.batch_mixes(vocab_size=512), knobs=ls.engine_knobs(num_canonical_rows=8))
        def test_knobs_keep_the_contract(mix, knobs):
            assert_matches_reference(lambda: make(window=4, group=2, **knobs), ...)
    """
    _check_int("max_num_seqs", max_num_seqs, minimum=1)
    _check_int("max_fast_tokens", max_fast_tokens, minimum=2)
    if num_canonical_rows is not None:
        _check_int("num_canonical_rows", num_canonical_rows, minimum=1)
    if num_layers is not None:
        _check_int("num_layers", num_layers, minimum=1)
    return _engine_knobs(max_num_seqs, max_fast_tokens, num_canonical_rows, num_layers)


@st.composite
def _engine_knobs(draw, max_num_seqs: int, max_fast_tokens: int, num_canonical_rows: int | None,
                  num_layers: int | None) -> dict:
    def pick(*values):  # the first value is the default: draws shrink to it
        return draw(st.sampled_from(values))

    knobs: dict = {
        "max_num_seqs": draw(st.integers(1, max_num_seqs)), "max_fast_tokens": draw(st.integers(2, max_fast_tokens)),
        "overlap": pick(True, False), "draft_ahead": pick(True, False), "adaptive_draft": pick(False, True),
        "prefix_cache": pick(True, False), "mixed_steps": pick(None, True, False),
        "canonical_thread": pick(False, True), "risk_margin": pick(0.0, 0.25, 4.0),
        "wide_verify": pick(None, True, False), "chain_passes": pick("prompts", "all", "off"),
        "split_pass_steps": pick(False, True), "pass_before_read": pick(False, True),
        "apply_before_read": pick(False, True),
    }
    if knobs["draft_ahead"]:
        knobs["prompt_drafts"] = pick(False, True)
    if num_canonical_rows is not None:
        knobs["max_canonical_tokens"] = num_canonical_rows * pick(1, 2, 4)
    if num_layers is not None and not knobs["canonical_thread"]:
        knobs["canonical_slices"] = pick(*range(1, min(num_layers, 4) + 1))
    admission = pick("arrival", "budget")
    order = pick("arrival", "budget", "canonical_budget")
    knobs["scheduler"] = DefaultScheduler(order=order, admission=admission,
                                          max_wait_steps=pick(None, 1, 8) if admission == "budget" else None,
                                          age_bound=pick(None, 2) if order != "arrival" else None,
                                          eager_verify=pick(False, True),
                                          risky_windows=pick("ride", "due", "off"), prompt_share=pick(0.0, 0.5))
    return knobs


def canonical_configs(
    *, max_window: int = 4, max_group: int = 3, min_window: int = 1, min_group: int = 1
) -> st.SearchStrategy[CanonicalConfig]:
    """Canonical configs (``window`` T, ``group`` G; R = T * G rows) within the given bounds.

    Keep the bounds small in CPU suites: the canonical pass always runs R rows.
    """
    _check_range("min_window", min_window, "max_window", max_window, minimum=1)
    _check_range("min_group", min_group, "max_group", max_group, minimum=1)
    return st.builds(CanonicalConfig, window=st.integers(min_window, max_window),
                     group=st.integers(min_group, max_group))


_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def wide_model_config(
    *,
    vocab_size: int = 512,
    hidden_size: int = 512,
    intermediate_size: int | None = None,
    num_layers: int = 2,
    num_heads: int = 8,
    num_kv_heads: int = 4,
    max_position_embeddings: int = 64,
    family: str = "llama",
    sliding_window: int | None = None,
    eos_token_ids: tuple[int, ...] = (),
) -> ModelConfig:
    """A small but wide :class:`~llm42.ModelConfig` for CPU determinism tests.

    Small (two layers, short context) so a test builds and runs it in
    milliseconds; wide (``hidden_size >= 512``, use float32 weights) because
    at that width CPU GEMMs give the same row different bits for different
    batch sizes, so the batch-invariance contract is actually exercised.
    ``family`` sets the family's flags: ``qwen2`` adds q/k/v biases, ``qwen3``
    per-head q/k RMSNorm, ``mistral`` a sliding window (``sliding_window``,
    default a quarter of the context). No eos ids by default, so outputs run to
    ``max_new_tokens`` unless a request names stop ids.
    Build a generator with ``DVRGenerator.from_config(cfg, weight_seed=...)``.
    """
    _check_int("hidden_size", hidden_size, minimum=MIN_WIDE_HIDDEN_SIZE)
    _check_int("num_heads", num_heads, minimum=1)
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of num_heads ({num_heads})")
    if family not in _FAMILIES:
        raise ValueError(f"family must be one of {_FAMILIES}, got {family!r}")
    if sliding_window is not None and family != "mistral":
        raise ValueError(f"sliding_window is a mistral-family option, got family={family!r}")
    if family == "mistral" and sliding_window is None:
        sliding_window = max(1, max_position_embeddings // 4)
    return ModelConfig(
        family=family,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size if intermediate_size is None else intermediate_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        rope=RopeConfig(theta=10000.0),
        attention_bias=family == "qwen2",
        qk_norm=family == "qwen3",
        sliding_window=sliding_window,
        eos_token_ids=tuple(eos_token_ids),
    )


def wide_model_configs(
    *,
    min_vocab_size: int = 256,
    max_vocab_size: int = 512,
    max_layers: int = 2,
    max_position_embeddings: int = 64,
    families: tuple[str, ...] = _FAMILIES,
) -> st.SearchStrategy[ModelConfig]:
    """Configs from :func:`wide_model_config` with drawn vocabulary, width, heads, depth and family.

    Hidden size is 512 or 768; heads and grouped K/V heads are drawn so that
    every config is valid. Mistral draws a sliding window shorter than the context.
    """
    _check_range("min_vocab_size", min_vocab_size, "max_vocab_size", max_vocab_size, minimum=1)
    _check_int("max_layers", max_layers, minimum=1)
    _check_int("max_position_embeddings", max_position_embeddings, minimum=2)
    if not families or any(f not in _FAMILIES for f in families):
        raise ValueError(f"families must be a non-empty subset of {_FAMILIES}, got {families!r}")
    return _wide_model_configs(min_vocab_size, max_vocab_size, max_layers, max_position_embeddings, tuple(families))


@st.composite
def _wide_model_configs(draw, min_vocab_size, max_vocab_size, max_layers, max_position_embeddings,
                        families) -> ModelConfig:
    family = draw(st.sampled_from(families))
    num_heads = draw(st.sampled_from((4, 8)))
    return wide_model_config(
        vocab_size=draw(st.integers(min_vocab_size, max_vocab_size)),
        hidden_size=draw(st.sampled_from((512, 768))),
        num_layers=draw(st.integers(1, max_layers)),
        num_heads=num_heads,
        num_kv_heads=draw(st.sampled_from([d for d in (1, 2, 4, 8) if num_heads % d == 0])),
        max_position_embeddings=max_position_embeddings,
        family=family,
        sliding_window=(draw(st.integers(1, max_position_embeddings - 1)) if family == "mistral" else None),
    )
