"""BatchInvariantPolicy (the peers' approach): a row's output is the same bits at every batch size.

Each op, the whole model's logits and the full generator are checked against
the batch-size-1 result; a negative control shows the library GEMM FastPolicy
uses does drift with the batch size on this CPU, so the checks are not vacuous.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from llm42 import DVRGenerator, SamplingParams
from llm42.inputs import StepInputs
from llm42.kv_store import KVStore
from llm42.model import forward, random_weights
from llm42.model.config import ModelConfig
from llm42.ops import exact
from llm42.policies import BatchInvariantPolicy, FastPolicy, ReductionPolicy
from llm42.verify import CanonicalConfig, Verifier
from tests.helpers import decode_inputs, tiny_config

MAX_BATCH = 256
BLOCK_SIZE = 16


def small_config(**overrides) -> ModelConfig:
    fields = dict(vocab_size=256, hidden_size=128, intermediate_size=256, head_dim=32)
    return tiny_config(**{**fields, **overrides})


def assert_rows_match_alone(batched, alone_rows: torch.Tensor) -> None:
    """``batched(m)`` [m, ...] must equal the rows computed alone, bit for bit, for every m in 1..MAX_BATCH."""
    for m in range(1, MAX_BATCH + 1):
        out = batched(m)
        if not torch.equal(out, alone_rows[:m]):
            bad = [i for i in range(m) if not torch.equal(out[i], alone_rows[i])]
            pytest.fail(f"batch size {m}: rows {bad[:8]} differ from their batch-size-1 results")


@pytest.fixture(scope="module")
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)



# -- the policy's contract -----------------------------------------------------------------------

def test_policy_is_a_reduction_policy_but_not_shape_closed():
    policy = BatchInvariantPolicy()
    assert isinstance(policy, ReductionPolicy)
    assert policy.is_shape_closed is False
    assert policy.matmul_backend("cpu") == "exact"
    assert BatchInvariantPolicy(matmul="tiled").matmul_backend("cpu") == "exact"
    assert BatchInvariantPolicy(matmul="tiled").matmul_backend("cuda") == "tiled"
    assert BatchInvariantPolicy().matmul_backend("cuda") == "triton"


def test_verifier_refuses_the_policy_as_canonical():
    gen = DVRGenerator.from_config(small_config(), kv_cache_tokens=256)
    with pytest.raises(ValueError, match="shape-closed"):
        Verifier(gen.runner, BatchInvariantPolicy(), CanonicalConfig())


@pytest.mark.parametrize("kwargs, field", [
    (dict(matmul_rows=0), "matmul_rows"), (dict(norm_rows=-1), "norm_rows"),
    (dict(key_block=0), "key_block"), (dict(matmul="cublas"), "matmul"),
])
def test_bad_arguments_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BatchInvariantPolicy(**kwargs)


def test_non_integer_tile_raises_type_error():
    with pytest.raises(TypeError, match="matmul_rows"):
        BatchInvariantPolicy(matmul_rows=2.5)


# -- each op -------------------------------------------------------------------------------------

def test_fast_gemm_drifts_with_batch_size_negative_control(generator):
    """The library GEMM on a wide fp32 matrix gives row 0 more than one result across batch sizes."""
    weight = torch.randn(384, 512, generator=generator) * 0.05
    x = torch.randn(MAX_BATCH, 512, generator=generator)
    fast = FastPolicy()
    distinct = {fast.linear(x[:m], weight)[0].numpy().tobytes() for m in range(1, MAX_BATCH + 1)}
    assert len(distinct) > 1, "F.linear gave row 0 one result at every batch size: the CPU checks below prove nothing"


@pytest.mark.parametrize("has_bias", [False, True])
def test_linear_rows_are_bit_identical_at_every_batch_size(generator, has_bias):
    weight = torch.randn(384, 512, generator=generator) * 0.05
    bias = torch.randn(384, generator=generator) if has_bias else None
    x = torch.randn(MAX_BATCH, 512, generator=generator)
    policy = BatchInvariantPolicy()
    alone = torch.cat([policy.linear(x[i: i + 1], weight, bias) for i in range(MAX_BATCH)])
    assert_rows_match_alone(lambda m: policy.linear(x[:m], weight, bias), alone)
    torch.testing.assert_close(alone, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_linear_keeps_leading_dimensions(generator):
    weight = torch.randn(48, 40, generator=generator)
    x = torch.randn(3, 5, 40, generator=generator)
    out = BatchInvariantPolicy(matmul_rows=4).linear(x, weight)
    assert out.shape == (3, 5, 48)
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_rms_norm_rows_are_bit_identical_at_every_batch_size(generator):
    x = torch.randn(MAX_BATCH, 512, generator=generator) * 3
    weight = torch.rand(512, generator=generator) + 0.5
    policy = BatchInvariantPolicy(norm_rows=64)
    alone = torch.cat([policy.rms_norm(x[i: i + 1], weight, 1e-5) for i in range(MAX_BATCH)])
    assert_rows_match_alone(lambda m: policy.rms_norm(x[:m], weight, 1e-5), alone)
    torch.testing.assert_close(alone, FastPolicy().rms_norm(x, weight, 1e-5))


def test_rms_norm_over_heads_keeps_shape(generator):
    x = torch.randn(7, 4, 32, generator=generator)
    weight = torch.rand(32, generator=generator)
    out = BatchInvariantPolicy(norm_rows=8).rms_norm(x, weight, 1e-6)
    assert out.shape == x.shape
    torch.testing.assert_close(out, FastPolicy().rms_norm(x, weight, 1e-6))


def test_attention_rows_are_bit_identical_at_every_batch_size(generator):
    """Rows with contexts of 1..100 keys: neither batch size nor the others' context lengths change a row."""
    num_blocks, num_kv_heads, num_heads, head_dim = 64, 1, 2, 16
    k_cache = torch.randn(num_blocks * BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    v_cache = torch.randn(num_blocks * BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    tables = torch.randint(0, num_blocks, (MAX_BATCH, 7), generator=generator)
    context_lens = torch.randint(1, 101, (MAX_BATCH,), generator=generator)
    q = torch.randn(MAX_BATCH, num_heads, head_dim, generator=generator)
    policy = BatchInvariantPolicy()

    def attend(rows: slice) -> torch.Tensor:
        inputs = decode_inputs(tables[rows], context_lens[rows])
        return policy.attention(q[rows], k_cache, v_cache, inputs, block_size=BLOCK_SIZE,
                                scale=head_dim**-0.5, sliding_window=None)

    alone = torch.cat([attend(slice(i, i + 1)) for i in range(MAX_BATCH)])
    assert_rows_match_alone(lambda m: attend(slice(0, m)), alone)
    fast = FastPolicy().attention(q, k_cache, v_cache, decode_inputs(tables, context_lens),
                                  block_size=BLOCK_SIZE, scale=head_dim**-0.5, sliding_window=None)
    torch.testing.assert_close(alone, fast, rtol=1e-4, atol=1e-5)


def test_sampler_log_softmax_rows_are_bit_identical_at_every_batch_size(generator):
    """The sampler's row-wise log-softmax (outside the policy, ``llm42.ops.exact``'s) is row-invariant."""
    logits = torch.randn(MAX_BATCH, 1000, generator=generator) * 4
    alone = torch.cat([exact.log_softmax(logits[i: i + 1]) for i in range(MAX_BATCH)])
    assert_rows_match_alone(lambda m: exact.log_softmax(logits[:m]), alone)


# -- the whole model -------------------------------------------------------------------------------

def test_model_logits_rows_are_bit_identical_at_every_batch_size():
    """256 sequences of different lengths; each decode row's logits equal its batch-size-1 logits."""
    cfg = small_config(num_layers=1)
    weights = random_weights(cfg, seed=7)
    policy = BatchInvariantPolicy()
    blocks_per_seq = 3
    kv = KVStore(cfg, num_blocks=MAX_BATCH * blocks_per_seq, block_size=BLOCK_SIZE, num_scratch_slots=16)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(rng.randint(1, 40))] for _ in range(MAX_BATCH)]
    for rid, prompt in enumerate(prompts):
        kv.allocate(rid, blocks_per_seq * BLOCK_SIZE)
        kv.append(rid, len(prompt) + 1)
    # the prompts' K/V, written once; only the decode rows below are compared
    forward(weights, cfg, step_inputs(kv, [(rid, p, 0) for rid, p in enumerate(prompts)]), kv.layers(), policy)
    decode = [(rid, [rng.randrange(3, cfg.vocab_size)], len(prompt)) for rid, prompt in enumerate(prompts)]

    def logits(m: int) -> torch.Tensor:
        return forward(weights, cfg, step_inputs(kv, decode[:m]), kv.layers(), policy)

    alone = torch.cat([forward(weights, cfg, step_inputs(kv, [seg]), kv.layers(), policy) for seg in decode])
    assert_rows_match_alone(logits, alone)
    fast = forward(weights, cfg, step_inputs(kv, decode), kv.layers(), FastPolicy())
    torch.testing.assert_close(alone, fast, rtol=1e-4, atol=1e-5)


def step_inputs(kv: KVStore, segments: list[tuple[int, list[int], int]]) -> StepInputs:
    """Varlen inputs for (rid, tokens, start) segments; logits of each segment's last row."""
    tokens, positions, slots, row_seq, starts, lasts = [], [], [], [], [0], []
    for s, (rid, toks, start) in enumerate(segments):
        tokens += toks
        positions += range(start, start + len(toks))
        slots += kv.slots(rid, start, start + len(toks))
        row_seq += [s] * len(toks)
        starts.append(starts[-1] + len(toks))
        lasts.append(starts[-1] - 1)
    width = max(len(kv.block_table(rid)) for rid, _, _ in segments)
    tables = [kv.block_table(rid) + [kv.scratch_block] * (width - len(kv.block_table(rid))) for rid, _, _ in segments]
    ends = [start + len(toks) for _, toks, start in segments]
    return StepInputs(
        token_ids=torch.tensor(tokens), positions=torch.tensor(positions), slot_mapping=torch.tensor(slots),
        row_seq=torch.tensor(row_seq), block_tables=torch.tensor(tables), context_lens=torch.tensor(ends),
        seq_starts=tuple(starts), max_context_len=max(ends), logits_rows=torch.tensor(lasts),
    )


# -- the full generator ----------------------------------------------------------------------------

def run_in_random_batch(gen: DVRGenerator, target, params: SamplingParams, rng: random.Random, vocab: int):
    """Submit ``target`` among random other requests arriving at random steps; return its Completion."""
    def other() -> tuple[list[int], SamplingParams]:
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 30))]
        return prompt, SamplingParams(max_new_tokens=rng.randint(1, 16), temperature=rng.choice([0.0, 1.0]),
                                      seed=rng.randrange(1000), ignore_eos=True)

    for _ in range(rng.randint(0, 6)):
        gen.submit(*other())
    for _ in range(rng.randint(0, 3)):
        if gen.has_unfinished():
            gen.step()
    rid = gen.submit(target, params)
    while gen.has_unfinished():
        if rng.random() < 0.4:
            gen.submit(*other())
        gen.step()
    return gen.result(rid)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_generator_output_alone_equals_output_in_random_batches(temperature):
    cfg = small_config()
    weights = random_weights(cfg, seed=3)
    rng = random.Random(temperature)
    target = [rng.randrange(3, cfg.vocab_size) for _ in range(23)]
    params = SamplingParams(max_new_tokens=14, temperature=temperature, seed=11, ignore_eos=True, logprobs=True)

    def make() -> DVRGenerator:
        return DVRGenerator(weights, cfg, fast_policy=BatchInvariantPolicy(matmul_rows=8, norm_rows=16),
                            max_fast_tokens=24, kv_cache_tokens=2048)

    alone = make().generate([target], params)[0]
    assert len(alone.token_ids) == 14
    for _ in range(3):
        gen = make()
        batched = run_in_random_batch(gen, target, params, rng, cfg.vocab_size)
        assert gen.stats["fast_steps"] > len(alone.token_ids), "the target never shared a step"
        assert batched.token_ids == alone.token_ids
        assert batched.logprobs == alone.logprobs


# -- the GPU kernel ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("has_bias", [False, True])
def test_triton_matmul_rows_are_bit_identical_at_every_batch_size_on_gpu(dtype, has_bias):
    pytest.importorskip("triton")
    from llm42.kernels.batch_invariant_matmul import matmul

    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(1536, 1024, generator=gen, device="cuda") * 0.03).to(dtype)
    bias = torch.randn(1536, generator=gen, device="cuda").to(dtype) if has_bias else None
    x = torch.randn(MAX_BATCH, 1024, generator=gen, device="cuda").to(dtype)
    alone = torch.cat([matmul(x[i: i + 1], weight, bias) for i in range(MAX_BATCH)])
    assert_rows_match_alone(lambda m: matmul(x[:m], weight, bias), alone)
    reference = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert float((alone.double() - reference).norm() / reference.norm()) < tolerance
    torch.testing.assert_close(alone, torch.matmul(x, weight.T) + (0 if bias is None else bias),
                               rtol=tolerance, atol=tolerance)


@pytest.mark.gpu
def test_policy_model_logits_rows_are_bit_identical_at_every_batch_size_on_gpu():
    """The whole policy on CUDA (Triton GEMM + the canonical pass's norm and attention) in bf16."""
    cfg = small_config(hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=4, head_dim=64)
    weights = random_weights(cfg, seed=5, dtype=torch.bfloat16, device="cuda")
    policy = BatchInvariantPolicy()
    kv = KVStore(cfg, num_blocks=MAX_BATCH * 3, block_size=BLOCK_SIZE, num_scratch_slots=16,
                 dtype=torch.bfloat16, device="cuda")
    rng = random.Random(5)
    prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(rng.randint(1, 40))] for _ in range(MAX_BATCH)]
    for rid, prompt in enumerate(prompts):
        kv.allocate(rid, 3 * BLOCK_SIZE)
        kv.append(rid, len(prompt) + 1)
    forward(weights, cfg, step_inputs_on(kv, [(rid, p, 0) for rid, p in enumerate(prompts)], "cuda"),
            kv.layers(), policy)
    decode = [(rid, [rng.randrange(3, cfg.vocab_size)], len(prompt)) for rid, prompt in enumerate(prompts)]
    alone = torch.cat([forward(weights, cfg, step_inputs_on(kv, [seg], "cuda"), kv.layers(), policy)
                       for seg in decode])
    assert_rows_match_alone(
        lambda m: forward(weights, cfg, step_inputs_on(kv, decode[:m], "cuda"), kv.layers(), policy), alone
    )


def step_inputs_on(kv: KVStore, segments, device: str) -> StepInputs:
    inputs = step_inputs(kv, segments)
    return StepInputs(**{
        name: value.to(device) if isinstance(value, torch.Tensor) else value
        for name, value in vars(inputs).items()
    })


@pytest.mark.gpu
def test_batch_invariant_generator_on_gpu_gives_every_request_its_alone_output():
    """The benchmark's baseline end to end on CUDA (bf16, decode CUDA graphs): batched == alone, per request."""
    from llm42.bench import Engine, build_model, fixed_shape, mode_by_name, run_offline, sharegpt_like
    from llm42.bench.runner import batch_invariance_check

    model = build_model("tiny", device=torch.device("cuda"), dtype=torch.bfloat16, max_positions=1024)
    engine = Engine(model, window=16, group=4, kv_cache_tokens=8192, max_num_seqs=24)
    for workload in (sharegpt_like(24, length_scale=0.25, vocab_size=512, seed=2),
                     fixed_shape(64, 48, 24, length_scale=1.0, vocab_size=512, seed=2)):
        batched = run_offline(engine, workload, mode_by_name("batch_invariant"), det_order=list(range(24)),
                              deadline=float("inf"))
        assert batched.notes == [], batched.notes  # the decode graphs were captured
        check = batch_invariance_check(engine, workload, batched, num_requests=24, deadline=float("inf"))
        assert check["mismatched_requests"] == [], check


# -- the kernel's tiles: pinned per weight shape, never chosen by M (Triton's interpreter on the CPU) --------------

SMALL_TILES = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_stages=1, num_warps=1)


def test_pinned_tiles_are_a_function_of_the_weight_shape(monkeypatch):
    pytest.importorskip("triton")
    from llm42.kernels import batch_invariant_matmul as bim

    default = bim.config_for(torch.float32, 40, 48)
    assert default == bim._CONFIGS[torch.float32]
    monkeypatch.setitem(bim._SHAPE_CONFIGS, (torch.float32, 40, 48), SMALL_TILES)
    assert bim.config_for(torch.float32, 40, 48) == SMALL_TILES
    assert bim.config_for(torch.float32, 40, 64) == default  # another shape keeps the dtype's tiles
    assert bim.config_for(torch.bfloat16, 40, 48) == bim._CONFIGS[torch.bfloat16]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs when there is no CUDA device")
def test_pinned_tiles_keep_rows_their_own_and_are_the_ones_run(monkeypatch):
    pytest.importorskip("triton")
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is off")
    from llm42.kernels import batch_invariant_matmul as bim

    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(40, 48, generator=gen) * 0.2
    x = torch.randn(7, 48, generator=gen)
    monkeypatch.setitem(bim._SHAPE_CONFIGS, (torch.float32, 40, 48), SMALL_TILES)
    alone = torch.cat([bim.matmul(x[i:i + 1], weight) for i in range(7)])
    assert torch.equal(bim.matmul(x, weight), alone)  # rows their own at M = 7 with the pinned tiles
    torch.testing.assert_close(alone, x @ weight.T, rtol=1e-5, atol=1e-5)
    # the pinned tiles are what runs for that shape, the dtype's for another (a spy records each launch's tiles)
    calls = []
    real = bim._persistent_matmul_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append({k: kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")})
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(bim, "_persistent_matmul_kernel", Spy())
    bim.matmul(x, weight)
    bim.matmul(x[:, :32].contiguous(), weight[:, :32].contiguous())
    assert calls == [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16),
                     {k: bim._CONFIGS[torch.float32][k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}]


@pytest.mark.gpu
def test_pinned_tiles_keep_every_row_its_own_on_gpu():
    """Every weight shape with pinned tiles (``_SHAPE_CONFIGS``): a row's bits are the same alone, in 7 rows, in 256
    and in 2,048 (the tiles are a function of the shape, so any M runs them); control: cuBLAS at those M."""
    pytest.importorskip("triton")
    from llm42.kernels import batch_invariant_matmul as bim

    gen = torch.Generator(device="cuda").manual_seed(1)
    cublas_drift = 0
    for (dtype, n, k) in bim._SHAPE_CONFIGS:
        weight = (torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5).to(dtype)
        x = torch.randn(2048, k, generator=gen, device="cuda").to(dtype)
        full = bim.matmul(x, weight)
        for m in (1, 7, 256):
            assert torch.equal(bim.matmul(x[:m].clone(), weight), full[:m]), (n, k, m)
        torch.testing.assert_close(full.float(), (x.float() @ weight.float().T), rtol=2e-2, atol=2e-2)
        cublas_drift += not torch.equal(F.linear(x[:1].clone(), weight), F.linear(x, weight)[:1])
    assert cublas_drift > 0  # the property is not vacuous: cuBLAS rows move with M on some of these shapes


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs when there is no CUDA device")
def test_tma_tiles_keep_rows_their_own(monkeypatch):
    """The TMA kernel (``TMA`` in a tile config: x and w read through tensor descriptors, out-of-range rows and
    columns as zeros): a row's bits are its own at M = 1, 7 and 37 with tiles that leave ragged edges in M, N and K,
    accurate to fp32 rounding, and it is the kernel that runs for a shape pinned with it."""
    pytest.importorskip("triton")
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is off")
    from llm42.kernels import batch_invariant_matmul as bim

    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(40, 56, generator=gen) * 0.2  # N = 40, K = 56: neither a multiple of the 16 / 32 tiles
    bias = torch.randn(40, generator=gen)
    x = torch.randn(37, 56, generator=gen)
    tma = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_stages=2, num_warps=4, TMA=True)
    full = bim.matmul(x, weight, bias, config=tma)
    for m in (1, 7):
        assert torch.equal(bim.matmul(x[:m].clone(), weight, bias, config=tma), full[:m])
    assert torch.equal(bim.matmul(x[20:21].clone(), weight, bias, config=tma)[0], full[20])
    torch.testing.assert_close(full, x @ weight.T + bias, rtol=1e-5, atol=1e-5)
    monkeypatch.setitem(bim._SHAPE_CONFIGS, (torch.float32, 40, 56), tma)
    launched = []
    real = bim._persistent_tma_matmul_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(bim, "_persistent_tma_matmul_kernel", Spy())
    assert torch.equal(bim.matmul(x, weight, bias), full) and len(launched) == 1
    with pytest.raises(ValueError, match="TMA matmul needs x"):
        bim.matmul(x[:, :55], weight[:, :55], config=tma)  # rows of 55 floats: not 16-byte aligned


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs when there is no CUDA device")
def test_tma_schedules_keep_the_tiles_bits():
    """The TMA kernel's scheduling options (``FLATTEN``: tile and K loops pipelined as one, the epilogue's tile from
    its own counter; ``STORE``: the epilogue through a TMA descriptor, whole or in halves) change how loads and stores
    are scheduled, never what a tile computes: every combination gives the plain launch's bits, with and without a
    bias, ragged in M, N and K. Negative control: another K walk (``BLOCK_K``) gives other bits."""
    pytest.importorskip("triton")
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is off")
    from llm42.kernels import batch_invariant_matmul as bim

    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(40, 56, generator=gen) * 0.2
    bias = torch.randn(40, generator=gen)
    x = torch.randn(37, 56, generator=gen)
    plain = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, num_stages=2, num_warps=4, TMA=True)
    for b in (bias, None):
        ref = bim.matmul(x, weight, b, config=plain)
        for flatten in (False, True):
            for store in ("pointer", "tma", "tma_halves"):
                out = bim.matmul(x, weight, b, config={**plain, "FLATTEN": flatten, "STORE": store})
                assert torch.equal(out, ref), (flatten, store, b is None)
        assert not torch.equal(bim.matmul(x, weight, b, config={**plain, "BLOCK_K": 32}), ref)
    with pytest.raises(ValueError, match="STORE"):
        bim.matmul(x, weight, config={**plain, "STORE": "halves"})


def _assert_another_association_differs(bim, x: torch.Tensor, weight: torch.Tensor) -> None:
    """Negative control of a bits comparison: the same products summed in another association (two halves of K,
    each rounded) differ from the matmul's, so an equality check against it can fail."""
    half = weight.shape[1] // 2
    halves = (bim.matmul(x[:, :half].contiguous(), weight[:, :half].contiguous()).float()
              + bim.matmul(x[:, half:].contiguous(), weight[:, half:].contiguous()).float())
    assert not torch.equal(halves.to(torch.bfloat16), bim.matmul(x, weight))


# round 18's pins of the 8B shape's layer weights: the bits the canonical Triton GEMM has committed since then
_ROUND18_PINS = {
    (6144, 4096): dict(BLOCK_M=128, BLOCK_N=128, num_stages=5, num_warps=4),
    (4096, 4096): dict(BLOCK_M=128, BLOCK_N=128, num_stages=5, num_warps=8),
    (28672, 4096): dict(BLOCK_M=128, BLOCK_N=256, num_stages=3, num_warps=8),
    (4096, 14336): dict(BLOCK_M=128, BLOCK_N=128, num_stages=6, num_warps=8),
}


@pytest.mark.gpu
def test_pinned_schedules_keep_round_18s_bits():
    """Round 21 pinned other tiles and scheduling options (FLATTEN, STORE) for the 8B shape's weights: every
    output of 2,048, 256 and 7 rows has the bits of round 18's pins, so no committed bit moved. Negative control:
    the same products summed in another association (two halves of K, each rounded) differ, so the comparison can
    fail. (Round 18's tiles with BLOCK_K = 32 gave the same bits as 64 on the H200: the tensor cores' k16 steps
    accumulate in K order whatever the block; not a control.)"""
    pytest.importorskip("triton")
    from llm42.kernels import batch_invariant_matmul as bim

    gen = torch.Generator(device="cuda").manual_seed(21)
    for (n, k), old in _ROUND18_PINS.items():
        old = dict(old, BLOCK_K=64, GROUP_M=8, TMA=True)
        assert bim.config_for(torch.bfloat16, n, k) != {**old, "PROGRAMS_PER_SM": 1}  # a schedule of its own now
        weight = (torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5).to(torch.bfloat16)
        x = torch.randn(2048, k, generator=gen, device="cuda").to(torch.bfloat16)
        for m in (2048, 256, 7):
            rows = x[:m].clone()
            assert torch.equal(bim.matmul(rows, weight), bim.matmul(rows, weight, config=old)), (n, k, m)
        _assert_another_association_differs(bim, x, weight)


# round 14's tiles for SmolLM2's weights (the bf16 default where none was pinned): the bits its Triton GEMM committed
_ROUND14_SMOLLM2 = {
    (960, 576): dict(BLOCK_M=128, BLOCK_N=128, num_stages=3, num_warps=8),
    (576, 576): dict(BLOCK_M=128, BLOCK_N=128, num_stages=3, num_warps=8),
    (3072, 576): dict(BLOCK_M=128, BLOCK_N=128, num_stages=3, num_warps=8),
    (576, 1536): dict(BLOCK_M=64, BLOCK_N=128, num_stages=4, num_warps=4, PROGRAMS_PER_SM=2),
    (49152, 576): dict(BLOCK_M=128, BLOCK_N=256, num_stages=4, num_warps=8),
}


@pytest.mark.gpu
def test_round_25s_smollm2_pins_keep_round_14s_bits():
    """Round 25 pinned SmolLM2's weights to the TMA kernel with tiles from a sweep timed inside CUDA graphs: every
    output of 2,048, 256 and 7 rows has the bits of round 14's pointer-kernel tiles, so no committed bit of the
    Triton canonical config moved. Negative control: the same products summed in another association (two halves
    of K, each rounded) differ, so the comparison can fail."""
    pytest.importorskip("triton")
    from llm42.kernels import batch_invariant_matmul as bim

    gen = torch.Generator(device="cuda").manual_seed(25)
    for (n, k), old in _ROUND14_SMOLLM2.items():
        old = dict(old, BLOCK_K=64, GROUP_M=8)
        assert bim.config_for(torch.bfloat16, n, k).get("TMA")  # pinned to the TMA kernel now
        weight = (torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5).to(torch.bfloat16)
        x = torch.randn(2048, k, generator=gen, device="cuda").to(torch.bfloat16)
        for m in (2048, 256, 7):
            rows = x[:m].clone()
            assert torch.equal(bim.matmul(rows, weight), bim.matmul(rows, weight, config=old)), (n, k, m)
        _assert_another_association_differs(bim, x, weight)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_stages=4, num_warps=8, TMA=True),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_stages=4, num_warps=4, PROGRAMS_PER_SM=2, TMA=True),
], ids=["128x256", "64x128"])
def test_tma_tiles_keep_every_row_its_own_on_gpu(config):
    """The TMA kernel at the 8B shape's widths and SmolLM2's (K = 576: ragged K tiles): a row's bits alone, in 7,
    256 and 2,048 rows, and shuffled; accurate to bf16 rounding."""
    pytest.importorskip("triton")
    from llm42.kernels import batch_invariant_matmul as bim

    gen = torch.Generator(device="cuda").manual_seed(2)
    for n, k in ((6144, 4096), (4096, 14336), (1536, 576)):
        weight = (torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5).to(torch.bfloat16)
        x = torch.randn(2048, k, generator=gen, device="cuda").to(torch.bfloat16)
        full = bim.matmul(x, weight, config=config)
        for m in (1, 7, 256):
            assert torch.equal(bim.matmul(x[:m].clone(), weight, config=config), full[:m]), (n, k, m)
        perm = torch.randperm(2048, device="cuda", generator=gen)
        assert torch.equal(bim.matmul(x[perm], weight, config=config), full[perm])
        torch.testing.assert_close(full.float(), (x.float() @ weight.float().T), rtol=2e-2, atol=2e-2)
