"""Small shared builders for the project's own tests (not part of the public llm42.testing)."""

from __future__ import annotations

import random

import torch

from llm42.inputs import StepInputs
from llm42.model.config import ModelConfig, RopeConfig


def wide_config(*, vocab_size: int = 512, hidden_size: int = 512, num_layers: int = 2,
                max_position_embeddings: int = 256) -> ModelConfig:
    """Wide enough (hidden 512, fp32) that CPU GEMMs drift with the batch size."""
    return ModelConfig(
        family="llama", vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_layers=num_layers, num_heads=8, num_kv_heads=4, head_dim=hidden_size // 8,
        max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-5, rope=RopeConfig(theta=10000.0),
        eos_token_ids=(2,), bos_token_id=1,
    )


def tiny_config(**overrides) -> ModelConfig:
    fields = dict(
        family="llama", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def decode_inputs(tables: torch.Tensor, context_lens: torch.Tensor) -> StepInputs:
    """One decode row per sequence, at the last position of its context."""
    num_seqs = tables.shape[0]
    positions = context_lens - 1
    return StepInputs(
        token_ids=torch.zeros(num_seqs, dtype=torch.int64),
        positions=positions,
        slot_mapping=torch.zeros(num_seqs, dtype=torch.int64),
        row_seq=torch.arange(num_seqs),
        block_tables=tables,
        context_lens=context_lens,
        seq_starts=tuple(range(num_seqs + 1)),
        max_context_len=int(context_lens.max()),
    )


class _LaggingResult:
    """A pass result that says "not ready" the first ``lag`` times it is asked (``wait`` still returns it)."""

    def __init__(self, result, lag: int):
        self._result = result
        self._lag = lag

    def is_ready(self) -> bool:
        self._lag -= 1
        return self._lag < 0 and self._result.is_ready()

    def __getattr__(self, name):
        return getattr(self._result, name)


def wrap_pass_results(gen, wrap) -> None:
    """Hand each canonical pass ``gen`` launches its result as ``wrap(result)`` (computed at launch, as a device
    queues it; what the wrapper says about when it is ready is what the engine sees)."""
    from llm42.verify.verifier import LaunchedPass

    launch = gen.verifier.launch

    def wrapped(work, kv):
        launched = launch(work, kv)
        return LaunchedPass(launched.work, wrap(launched.result))

    gen.verifier.launch = wrapped


def lag_passes(gen, lag: int):
    """Make ``gen``'s canonical passes look ``lag`` asks slower than they are, as on a busy GPU: a pass is
    computed (and writes its K/V) at launch, as the device would queue it, but applied only later, so
    fast steps run, and deterministic requests draft ahead, while it is "in flight". Returns ``gen``."""
    if lag:
        wrap_pass_results(gen, lambda result: _LaggingResult(result, lag))
    return gen


def record_launches(gen, record) -> list:
    """Wrap ``gen``'s verifier so ``record(work)`` of each canonical pass, taken as it is launched (a pass before
    it may still be in flight), goes to the returned list."""
    records: list = []
    launch = gen.verifier.launch

    def recording(work, kv):
        records.append(record(work))
        return launch(work, kv)

    gen.verifier.launch = recording
    return records


def count_windows(gen) -> list[int]:
    """Wrap ``gen``'s verifier so each canonical pass's verify-window count is recorded (the returned list)."""
    return record_launches(gen, lambda work: sum(not w.is_prefill for w in work))


def serve(gen, prompts, params_list, *, max_steps: int = 2000) -> list:
    """Submit every prompt, step ``gen`` until all are finished (pytest.fail after ``max_steps``); the
    Completions in prompt order."""
    import pytest

    rids = [gen.submit(p, params) for p, params in zip(prompts, params_list)]
    for _ in range(max_steps):
        if not gen.has_unfinished():
            break
        gen.step()
    else:
        pytest.fail(f"{max_steps} steps and still unfinished")
    return [gen.result(rid) for rid in rids]


def first_token_steps(gen) -> dict[int, int]:
    """Step ``gen`` until every request is finished; the step (counted from this call) at which each request's
    first tokens were returned."""
    first: dict[int, int] = {}
    step = 0
    while gen.has_unfinished():
        for rid in gen.step():
            first.setdefault(rid, step)
        step += 1
    return first


def prompt_kv(gen, prompt: list[int], *, min_tokens: int = 1) -> torch.Tensor:
    """The canonical K/V of ``prompt``'s full blocks as ``gen``'s prefix cache holds them after a request:
    [2 x layers, tokens, kv heads, head dim] (every layer's K, then V). Asserts at least ``min_tokens`` are cached
    (else the comparison would see nothing)."""
    blocks = gen.kv.match_prefix(prompt)
    assert blocks and len(blocks) * gen.kv.block_size >= min_tokens, "the prompt's canonical blocks are not cached"
    slots = torch.tensor([b * gen.kv.block_size + i for b in blocks for i in range(gen.kv.block_size)],
                         device=gen.device)
    layers = gen.kv.layers()
    return torch.stack([t[slots] for t in layers.k + layers.v])


def run_beside_free(gen, prompts, params_list, free_prompts=(), free_params=None) -> list:
    """Submit ``free_prompts`` (with ``free_params``) and then the requests, step ``gen`` until every one is
    finished; (token ids, log-probs, top log-probs) of the requests, in order (the free ones' results dropped)."""
    free = [gen.submit(p, free_params) for p in free_prompts]
    rids = [gen.submit(p, params) for p, params in zip(prompts, params_list)]
    while gen.has_unfinished():
        gen.step()
    for rid in free:
        gen.result(rid)
    return [(c.token_ids, c.logprobs, c.top_logprobs) for c in (gen.result(rid) for rid in rids)]


# -- the 8B shape's wide-pass GPU tests (tests/gpu/test_wide_pass_cuda.py, test_gemm_rows_cuda.py) ---------------
WIDE_WINDOW, WIDE_GROUP = 32, 8  # R = 256


def wide_pass_generator(llama8b, max_canonical_tokens: int, **kwargs):
    """A generator over the ``llama8b`` fixture's (cfg, weights) with passes of up to ``max_canonical_tokens`` rows."""
    from llm42 import DVRGenerator

    cfg, weights = llama8b
    return DVRGenerator(weights, cfg, window=WIDE_WINDOW, group=WIDE_GROUP, kv_cache_tokens=16 * 1024,
                        max_fast_tokens=1024, max_canonical_tokens=max_canonical_tokens, **kwargs)


def wide_pass_requests(vocab: int):
    """Two deterministic requests with prompts of 1,500 and 700 tokens (more than one pass's rows), one greedy, one
    sampled with top-k, both with top-3 log-probs: (prompts, params)."""
    from llm42 import SamplingParams

    rng = random.Random(7)
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (1500, 700)]
    params = [SamplingParams(max_new_tokens=40, deterministic=True, ignore_eos=True, logprobs=3),
              SamplingParams(max_new_tokens=40, deterministic=True, ignore_eos=True, temperature=0.8, top_k=50,
                             seed=11, logprobs=3)]
    return prompts, params


def run_beside_random_free(gen, prompts, params, *, num_free: int = 0) -> list:
    """``run_beside_free`` with ``num_free`` free requests of random 20-300-token prompts (seeded)."""
    from llm42 import SamplingParams

    rng = random.Random(3)
    free = [[rng.randrange(3, gen.vocab_size) for _ in range(rng.randint(20, 300))] for _ in range(num_free)]
    return run_beside_free(gen, prompts, params, free, SamplingParams(max_new_tokens=60, ignore_eos=True))


def prompts_to_draft_without_rule(pool, max_rows: int, max_chunks: int) -> list:
    """``RequestPool.prompts_to_draft`` without its rule (a negative control of ``prompt_drafts``): a prompt's fast run
    goes on over positions canonical passes have, launched or committed, once they overtake it."""
    from llm42.scheduler import PrefillChunk

    out = []
    for req in pool.running.values():
        if max_rows <= 0 or len(out) == max_chunks:
            break
        if req.is_deterministic and req.num_fast_prompt < req.num_prompt_tokens and req.max_new_tokens > 2:
            num = min(req.num_prompt_tokens - req.num_fast_prompt, max_rows)
            out.append(PrefillChunk(req.rid, num))
            max_rows -= num
    return out


def load_device_script(name: str):
    """``benchmarks/device/<name>.py`` as a module, loaded with its folder on ``sys.path`` (for its sibling
    imports) and taken off again."""
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "device"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_script", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(folder))


def run_dvr_ab(out, monkeypatch, variants: str, *args: str) -> dict:
    """``benchmarks/device/dvr_ab.py`` end to end on the CPU (the tiny model, 8 requests, nondet and dvr@50, no
    warm-up) with ``variants`` and more command-line ``args``; its JSON (written to ``out``)."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "device" / "dvr_ab.py"
    spec = importlib.util.spec_from_file_location("dvr_ab_script", script)
    dvr_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dvr_ab)
    monkeypatch.setattr(sys, "argv", [
        "dvr_ab.py", "--model", "tiny", "--out", str(out), "--variants", variants, "--modes", "nondet,dvr@50",
        "--num-requests", "8", "--max-num-seqs", "16", "--max-fast-tokens", "64", "--budget-s", "400",
        "--warmup-requests", "0", *args])
    dvr_ab.main()
    return json.loads(Path(out).read_text())


def launch_prompt_pass(gen, prompts):
    """Admit ``prompts`` (deterministic, one token each) into ``gen`` and launch one canonical pass over their whole
    prompts, driving its ``CanonicalPass`` directly (no step): (the launched ``PassResult``, the K/V slots of its
    rows)."""
    from llm42.params import SamplingParams
    from llm42.runner import Segment

    params = SamplingParams(max_new_tokens=1, deterministic=True)
    rids = [gen.submit(p, params) for p in prompts]
    gen._admit()
    segments = [Segment(rid, tuple(p), 0, params, 0) for rid, p in zip(rids, prompts)]
    for seg in segments:
        gen.kv.append(seg.rid, seg.end)
    per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
    bs = gen.kv.block_size
    slots = [gen.kv.block_table(s.rid)[pos // bs] * bs + pos % bs for s in segments for pos in range(s.start, s.end)]
    return gen.verifier.canonical_pass.launch(segments, gen.kv, per_row), slots


def pass_bits(result, kv, layers: list[int], slots: list[int]) -> tuple[list[int], list[int], list]:
    """A waited ``PassResult``'s tokens, its log-probs' float32 bits (NaN at rows without results), and the K/V that
    ``layers`` hold at ``slots`` (the pass's rows: padding rows write scratch slots, which CUDA graph warm-ups fill
    with whatever they ran on), on the CPU."""
    import torch

    tokens, logprobs = result.wait()
    bits = torch.tensor(logprobs, dtype=torch.float32).view(torch.int32).tolist()
    caches = kv.layers()
    index = torch.tensor(slots, dtype=torch.int64, device=caches.k[0].device)
    return tokens, bits, [torch.cat([caches.k[i].index_select(0, index), caches.v[i].index_select(0, index)]).cpu()
                          for i in layers]


def applies_between_launch_and_read(phases: list[str]) -> bool:
    """In one step's logged phases ("fast": its fast launch, "apply": a pass applied, "read": its read-back of the fast
    step before), whether a pass was applied after the launch and before the read (``apply_before_read``)."""
    if "fast" not in phases or "read" not in phases:
        return False
    launched, read = phases.index("fast"), phases.index("read")
    return any(x == "apply" and launched < i < read for i, x in enumerate(phases))
