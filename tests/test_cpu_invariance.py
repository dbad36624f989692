"""The CPU canonical pass rests on ops whose bits cannot depend on layout, row count, threads, ISA or vendor.

- Each ``llm42.ops.exact`` op gives a row the same bits at every row count in
  ``ROW_COUNTS`` (1 included), in every row position, among random other
  rows, for contiguous, transposed and strided inputs; the canonical
  attention and a whole canonical pass do too, at R = 1 and any other R.
- The canonical pass gives one digest (logits, K/V, tokens, log-probs) under
  every MKL and ATen code path this machine can be forced onto
  (``MKL_ENABLE_INSTRUCTIONS`` x ``ATEN_CPU_CAPABILITY``) and at 1 and 2
  threads: the strongest evidence of vendor independence one machine gives.
- The exact ops are accurate: exp/log/SiLU within an ulp of float64, the
  GEMM within its bound of a float64 GEMM.

Negative controls run the same checks on the library ops (``torch.sigmoid``,
``F.linear``, ``torch.matmul`` on a permuted view, the fast policy's pass) and
see them fail, so the checks have power.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from llm42 import DVRGenerator, SamplingParams
from llm42.inputs import StepInputs
from llm42.model import forward, random_weights
from llm42.model.forward import KVLayers
from llm42.model.weights import assemble, hf_tensor_shapes
from llm42.ops import exact
from llm42.ops.attention import blocked_attention
from llm42.policies import BatchInvariantPolicy, FastPolicy, FixedShapePolicy
from llm42.sampler import SamplingRows, sample
from tests.helpers import decode_inputs, tiny_config

ROW_COUNTS = (1, 2, 3, 7, 8, 9, 31, 32, 33, 64)
LAYOUTS = ("contiguous", "transposed", "strided")
REPO = Path(__file__).resolve().parents[1]


def laid_out(rows: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``rows`` in another memory layout."""
    if layout == "contiguous":
        return rows.contiguous()
    reverse = tuple(reversed(range(rows.dim())))
    if layout == "transposed":  # every stride reversed: column-major
        return rows.permute(reverse).contiguous().permute(reverse)
    spaced = rows.new_zeros(tuple(2 * n for n in rows.shape))  # every other element of a larger tensor
    view = spaced[tuple(slice(None, None, 2) for _ in rows.shape)]
    view.copy_(rows)
    return view


def row_mismatches(op, row: torch.Tensor, *, seed: int = 0) -> list[tuple[int, int, str]]:
    """(row count, position, layout) of every batch where ``op`` gives ``row`` [1, ...] other bits than alone.

    ``op`` maps [N, ...] to [N, ...] row by row; the other rows are random, with
    their own scale, redrawn for every position.
    """
    generator = torch.Generator().manual_seed(seed)
    alone = op(row)[0]
    bad = []
    for num_rows in ROW_COUNTS:
        for pos in range(num_rows):
            batch = torch.randn((num_rows, *row.shape[1:]), generator=generator)
            batch = batch * torch.rand((num_rows,) + (1,) * (row.dim() - 1), generator=generator) * 8
            batch[pos] = row[0]
            for layout in LAYOUTS:
                if not torch.equal(op(laid_out(batch, layout))[pos], alone):
                    bad.append((num_rows, pos, layout))
    return bad


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


WEIGHT = _randn(40, 256, seed=1, scale=0.05)
BIAS = _randn(40, seed=2)
NORM_WEIGHT = torch.rand(96, generator=torch.Generator().manual_seed(3)) + 0.5
SLICES = exact.WeightSlices()


def _batched_matmul(x: torch.Tensor) -> torch.Tensor:
    # x [N, H, D, G + KB] -> q [N, H, G, D] (a transposed view) @ k [N, H, D, KB]: attention's q·k shapes
    return exact.matmul(x[..., :3].transpose(-1, -2), x[..., 3:])


def _sampled(logits: torch.Tensor) -> torch.Tensor:
    n = logits.shape[0]
    rows = SamplingRows(
        temperature=torch.full((n,), 0.9), top_k=torch.full((n,), 30, dtype=torch.int64),
        top_p=torch.full((n,), 0.8), seeds=torch.full((n,), 5, dtype=torch.int64),
        positions=torch.full((n,), 3, dtype=torch.int64),
    )
    tokens, logprobs = sample(logits, rows)
    return torch.stack([tokens.double(), logprobs.double()], dim=-1)


# name -> (op over rows, the row [1, ...] it is checked on)
EXACT_OPS = {
    "linear": (lambda x: exact.linear(x, WEIGHT, BIAS, slices=SLICES), _randn(1, 256, seed=10)),
    "matmul": (_batched_matmul, _randn(1, 2, 16, 3 + 24, seed=11)),
    "row_sum": (exact.row_sum, _randn(1, 100, seed=12)),
    "row_cumsum": (exact.row_cumsum, _randn(1, 100, seed=13)),
    "exp": (exact.exp, _randn(1, 250, seed=14, scale=10)),
    "log": (exact.log, _randn(1, 250, seed=15).abs()),
    "silu": (exact.silu, _randn(1, 250, seed=16, scale=4)),
    "swiglu": (exact.swiglu, _randn(1, 250, seed=17, scale=4)),
    "rms_norm": (lambda x: exact.rms_norm(x, NORM_WEIGHT, 1e-5), _randn(1, 96, seed=18, scale=3)),
    "softmax": (exact.softmax, _randn(1, 250, seed=19, scale=4)),
    "log_softmax": (exact.log_softmax, _randn(1, 250, seed=20, scale=4)),
    "sampler": (_sampled, _randn(1, 120, seed=21, scale=3)),
}


@pytest.mark.parametrize("name", list(EXACT_OPS))
def test_exact_op_gives_a_row_the_same_bits_at_every_row_count_position_and_layout(name):
    op, row = EXACT_OPS[name]
    assert row_mismatches(op, row) == []


@pytest.mark.parametrize("name, op, row", [
    ("torch.sigmoid", torch.sigmoid, _randn(1, 1000, seed=14, scale=4)),
    ("F.silu", F.silu, _randn(1, 1000, seed=16, scale=4)),
    ("F.linear", lambda x: F.linear(x, WEIGHT, BIAS), _randn(1, 256, seed=10)),
])
def test_library_op_fails_the_same_check_negative_control(name, op, row):
    """ATen's elementwise loops round a vectorized body and a scalar tail differently; a GEMM's order follows M."""
    assert row_mismatches(op, row), f"{name} passed the row check: it proves nothing about the exact ops"


def test_weight_slices_are_cached_per_weight_and_recomputed_after_an_in_place_update():
    slices = exact.WeightSlices()
    weight = _randn(8, 32, seed=30)
    x = _randn(3, 32, seed=31)
    first = exact.linear(x, weight, slices=slices)
    assert len(slices) == 1
    assert torch.equal(exact.linear(x, weight, slices=slices), first)
    assert len(slices) == 1
    weight.mul_(2.0)  # in place: same tensor, same data_ptr, new _version
    assert torch.equal(exact.linear(x, weight, slices=slices), 2 * first)
    assert torch.equal(exact.linear(x, weight, slices=slices), exact.linear(x, weight, slices=exact.WeightSlices()))
    del weight
    assert len(slices) == 0  # a freed weight drops its entry


# -- attention -------------------------------------------------------------------------------------

def test_issue_reproducer_exact_matmul_of_a_permuted_view_is_the_same_for_one_batch_row_and_two():
    """Issue 9: ``torch.matmul`` folds a permuted key view for N = 1 but copies it for N >= 2."""
    g = torch.Generator().manual_seed(0)
    kraw = torch.randn(2, 64, 2, 32, generator=g)
    q = torch.randn(2, 2, 2, 32, generator=g)
    k = kraw.permute(0, 2, 3, 1)
    assert torch.equal(exact.matmul(q[:1], k[:1])[0], exact.matmul(q[:2], k[:2])[0])


BLOCK_SIZE = 16


def _attention_case(num_rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    num_blocks, num_kv_heads, num_heads, head_dim = 16, 2, 4, 16
    k_cache = torch.randn(num_blocks * BLOCK_SIZE, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks * BLOCK_SIZE, num_kv_heads, head_dim, generator=g)
    tables = torch.randint(0, num_blocks, (num_rows, 5), generator=g)
    context_lens = torch.randint(1, 5 * BLOCK_SIZE + 1, (num_rows,), generator=g)
    q = torch.randn(num_rows, num_heads, head_dim, generator=g)
    return q, k_cache, v_cache, tables, context_lens


def _blocked(q, k_cache, v_cache, tables, context_lens, *, key_block=8, sliding_window=None):
    return blocked_attention(q, k_cache, v_cache, decode_inputs(tables, context_lens), block_size=BLOCK_SIZE,
                             scale=0.25, key_block=key_block, sliding_window=sliding_window)


def test_issue_reproducer_blocked_attention_row_is_the_same_alone_and_with_a_second_row():
    q, k_cache, v_cache, tables, context_lens = _attention_case(2, seed=0)
    pair = _blocked(q, k_cache, v_cache, tables, context_lens)
    alone = _blocked(q[:1], k_cache, v_cache, tables[:1], context_lens[:1])
    assert torch.equal(pair[0], alone[0])


@pytest.mark.parametrize("sliding_window", [None, 7])
def test_canonical_attention_row_is_the_same_at_every_row_count_and_position(sliding_window):
    """Each position of each row count holds the needle row (query, block table, context); the rest are random."""
    needle = _attention_case(1, seed=1)
    q, k_cache, v_cache, tables, lens = needle
    alone = _blocked(q, k_cache, v_cache, tables, lens, sliding_window=sliding_window)[0]
    bad = []
    for num_rows in ROW_COUNTS:
        for pos in range(0, num_rows, max(1, num_rows // 8)):
            oq, _, _, otables, olens = _attention_case(num_rows, seed=100 + num_rows + pos)
            oq[pos], otables[pos], olens[pos] = q[0], tables[0], lens[0]
            out = _blocked(oq.transpose(0, 1).contiguous().transpose(0, 1), k_cache, v_cache, otables, olens,
                           sliding_window=sliding_window)
            if not torch.equal(out[pos], alone):
                bad.append((num_rows, pos))
    assert bad == []


def _sequences_pass(seqs: list[tuple[int, int, int]], *, per_row_tables: bool, order: torch.Tensor | None = None
                    ) -> StepInputs:
    """Inputs for sequences (first block, rows, context): each sequence's last ``rows`` positions of its context,
    tables of 5 consecutive blocks from ``first``. ``per_row_tables``: every row its own copy of its sequence's
    table, ``table_rows`` naming the sequence's first row (the static canonical layout), rows in ``order``."""
    tables = torch.stack([torch.arange(first, first + 5) for first, _, _ in seqs])
    row_seq = torch.tensor([s for s, (_, rows, _) in enumerate(seqs) for _ in range(rows)])
    positions = torch.tensor([p for _, rows, ctx in seqs for p in range(ctx - rows, ctx)])
    num_rows = len(row_seq)
    zeros = torch.zeros(num_rows, dtype=torch.int64)
    if not per_row_tables:
        starts = [0]
        for _, rows, _ in seqs:
            starts.append(starts[-1] + rows)
        return StepInputs(token_ids=zeros, positions=positions, slot_mapping=zeros, row_seq=row_seq,
                          block_tables=tables, context_lens=torch.tensor([ctx for _, _, ctx in seqs]),
                          seq_starts=tuple(starts), max_context_len=max(ctx for _, _, ctx in seqs))
    order = torch.arange(num_rows) if order is None else order
    row_seq, positions = row_seq[order], positions[order]
    first_row = torch.tensor([int((row_seq == s).nonzero()[0]) for s in row_seq.tolist()])
    return StepInputs(token_ids=zeros, positions=positions, slot_mapping=zeros, row_seq=torch.arange(num_rows),
                      block_tables=tables[row_seq], context_lens=positions + 1,
                      seq_starts=tuple(range(num_rows + 1)), max_context_len=int(positions.max()) + 1,
                      table_rows=first_row)


@pytest.mark.parametrize("per_row_tables", [False, True])
def test_canonical_attention_sequence_rows_are_the_same_among_any_other_sequences(per_row_tables):
    """A sequence's rows (a window, a prompt chunk) get the same bits alone and beside other sequences of any row
    counts and contexts, wherever the sequence sits and, with per-row tables, in any row order (rows of one
    sequence run their q·k and p·v together, sequences with as many rows batched together). Control: the same
    rows at another ``key_block`` differ, so the comparison sees a change of schedule."""
    _, k_cache, v_cache, _, _ = _attention_case(1, seed=3)
    g = torch.Generator().manual_seed(4)
    needle = (2, 7, 61)  # blocks 2..6, the last 7 positions of a 61-token context
    q_needle = torch.randn(needle[1], 4, 16, generator=g)
    kw = dict(block_size=BLOCK_SIZE, scale=0.25, key_block=8)
    alone = blocked_attention(q_needle, k_cache, v_cache, _sequences_pass([needle], per_row_tables=per_row_tables),
                              **kw)
    bad, num_compared = [], 0
    for trial in range(6):
        others = [(int(torch.randint(0, 11, (), generator=g)), rows, int(torch.randint(rows, 5 * BLOCK_SIZE, (),
                                                                                          generator=g)))
                  for rows in torch.randint(1, 12, (1 + trial,), generator=g).tolist()]
        at = trial % (len(others) + 1)
        seqs = others[:at] + [needle] + others[at:]
        rows_before = sum(rows for _, rows, _ in seqs[:at])
        q = torch.randn(sum(rows for _, rows, _ in seqs), 4, 16, generator=g)
        q[rows_before:rows_before + needle[1]] = q_needle
        order = torch.randperm(len(q), generator=g) if per_row_tables else torch.arange(len(q))
        out = blocked_attention(q[order], k_cache, v_cache, _sequences_pass(seqs, per_row_tables=per_row_tables,
                                                                            order=order), **kw)
        placed = torch.empty_like(out)
        placed[order] = out
        num_compared += 1
        if not torch.equal(placed[rows_before:rows_before + needle[1]], alone):
            bad.append(trial)
    assert bad == [] and num_compared == 6
    other_block = blocked_attention(q_needle, k_cache, v_cache,
                                    _sequences_pass([needle], per_row_tables=per_row_tables), **{**kw, "key_block": 16})
    assert not torch.equal(other_block, alone)


def test_invisible_key_block_leaves_the_attention_state_bit_identical():
    """A row's output over a context of c keys does not change when another row makes the pass run more blocks."""
    q, k_cache, v_cache, tables, _ = _attention_case(2, seed=2)
    short = torch.tensor([5, 5])
    long = torch.tensor([5, 5 * BLOCK_SIZE])
    assert torch.equal(_blocked(q, k_cache, v_cache, tables, short)[0],
                       _blocked(q, k_cache, v_cache, tables, long)[0])


# -- the canonical pass at any R -------------------------------------------------------------------

CFG = tiny_config(vocab_size=256, hidden_size=128, intermediate_size=256, head_dim=32, num_heads=4,
                  num_kv_heads=2, attention_bias=True, max_position_embeddings=64)
PASS_BLOCK_SIZE = 8
BLOCKS_PER_SEQ = 4


def _kv(cfg, num_seqs: int) -> KVLayers:
    slots = num_seqs * BLOCKS_PER_SEQ * PASS_BLOCK_SIZE
    return KVLayers([torch.zeros(slots, cfg.num_kv_heads, cfg.head_dim) for _ in range(cfg.num_layers)],
                    [torch.zeros(slots, cfg.num_kv_heads, cfg.head_dim) for _ in range(cfg.num_layers)],
                    PASS_BLOCK_SIZE)


def _step(segments: list[tuple[list[int], int]]) -> StepInputs:
    """Varlen inputs for (tokens, start) segments; sequence s owns blocks [4s, 4s + 4)."""
    tables = torch.tensor([[BLOCKS_PER_SEQ * s + b for b in range(BLOCKS_PER_SEQ)] for s in range(len(segments))])
    tokens, positions, slots, row_seq, starts = [], [], [], [], [0]
    for s, (toks, start) in enumerate(segments):
        tokens += toks
        for p in range(start, start + len(toks)):
            positions.append(p)
            slots.append(int(tables[s, p // PASS_BLOCK_SIZE]) * PASS_BLOCK_SIZE + p % PASS_BLOCK_SIZE)
        row_seq += [s] * len(toks)
        starts.append(starts[-1] + len(toks))
    ends = [start + len(toks) for toks, start in segments]
    return StepInputs(
        token_ids=torch.tensor(tokens), positions=torch.tensor(positions), slot_mapping=torch.tensor(slots),
        row_seq=torch.tensor(row_seq), block_tables=tables, context_lens=torch.tensor(ends),
        seq_starts=tuple(starts), max_context_len=max(ends),
    )


def _decode_row_logits(weights, prompt: list[int], others: list[list[int]], needle_at: int, policy) -> torch.Tensor:
    """Prefill every prompt, then one decode row each (R = 1 + len(others)); the needle's decode logits."""
    prompts = others[:needle_at] + [prompt] + others[needle_at:]
    kv = _kv(CFG, len(prompts))
    forward(weights, CFG, _step([(p, 0) for p in prompts]), kv, policy)
    logits = forward(weights, CFG, _step([([p[-1] ^ 1], len(p)) for p in prompts]), kv, policy)
    return logits[needle_at]


def test_canonical_pass_row_logits_are_the_same_at_r_1_and_every_other_r():
    """A canonical config with R = 1 (window 1, group 1) commits the same bits as any larger R would."""
    weights = random_weights(CFG, seed=5)
    policy = FixedShapePolicy(key_block=8)
    prompt = [(11 * i + 3) % CFG.vocab_size for i in range(19)]
    alone = _decode_row_logits(weights, prompt, [], 0, policy)
    bad = []
    for num_rows in (2, 3, 8, 9):
        others = [[(5 * j + i) % CFG.vocab_size for i in range(1 + (7 * j) % 23)] for j in range(num_rows - 1)]
        for needle_at in sorted({0, num_rows // 2, num_rows - 1}):
            if not torch.equal(_decode_row_logits(weights, prompt, others, needle_at, policy), alone):
                bad.append((num_rows, needle_at))
    assert bad == []
    batch_invariant = _decode_row_logits(weights, prompt, [[4, 5, 6]], 1, BatchInvariantPolicy(key_block=8))
    assert torch.equal(batch_invariant, alone)  # the baseline runs the very same CPU ops


def test_committed_output_is_the_same_for_every_window_and_group_on_the_cpu():
    """Rows never interact and no op follows R, so on the CPU the canonical config's R does not show in the bits."""
    params = SamplingParams(max_new_tokens=9, temperature=0.8, top_p=0.9, seed=4, deterministic=True,
                            logprobs=True, ignore_eos=True)
    prompts = [[3, 4, 5, 6, 7], [9, 8, 7]]
    weights = random_weights(CFG, seed=6)
    results = []
    for window, group in ((1, 1), (3, 2), (8, 1)):
        gen = DVRGenerator(weights, CFG, window=window, group=group, kv_cache_tokens=512)
        results.append([(c.token_ids, c.logprobs) for c in gen.generate(prompts, params)])
    assert results[0] == results[1] == results[2]


# -- one digest under every code path ----------------------------------------------------------------

DIGEST_CFG = dict(vocab_size=256, hidden_size=128, intermediate_size=256, head_dim=32, num_heads=4,
                  num_kv_heads=2, attention_bias=True, max_position_embeddings=64)
DIGEST_PROMPTS = [[(13 * i + 5) % 256 for i in range(n)] for n in (13, 5, 21)]


def _sha(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def pass_digest(weights, cfg, policy) -> str:
    """sha256 of a prefill pass, a decode pass reading its K/V, and sampling from the decode logits."""
    kv = _kv(cfg, len(DIGEST_PROMPTS))
    prefill = forward(weights, cfg, _step([(p, 0) for p in DIGEST_PROMPTS]), kv, policy)
    decode = forward(weights, cfg, _step([([9 + i], len(p)) for i, p in enumerate(DIGEST_PROMPTS)]), kv, policy)
    rows = SamplingRows(
        temperature=torch.tensor([0.0, 0.8, 1.3]), top_k=torch.tensor([0, 20, 0]),
        top_p=torch.tensor([1.0, 1.0, 0.9]), seeds=torch.tensor([1, 2, 3]), positions=torch.tensor([13, 5, 21]),
    )
    tokens, logprobs = sample(decode, rows)
    return _sha(prefill, decode, tokens, logprobs, *kv.k, *kv.v)


def canonical_pass_digests(tensors_path: str, thread_counts: str) -> dict[str, str]:
    """What each subprocess reports: digests of the canonical pass and (control) the fast pass per thread count.

    The weights come from the parent (``torch.randn`` itself draws different
    values under different ATen capabilities); the RoPE tables are built here.
    """
    cfg = tiny_config(**DIGEST_CFG)
    weights = assemble(cfg, torch.load(tensors_path))
    out = {}
    for threads in map(int, thread_counts.split(",")):
        torch.set_num_threads(threads)
        out[f"canonical/{threads}"] = pass_digest(weights, cfg, FixedShapePolicy(key_block=8))
        out[f"fast/{threads}"] = pass_digest(weights, cfg, FastPolicy())
    out["batch_invariant/1"] = pass_digest(weights, cfg, BatchInvariantPolicy(key_block=8))
    return out


# every MKL x ATen code path at one thread; two of them at two threads too (thread hand-offs of tiny ops are
# slow on a busy machine, and the thread count is independent of the code path)
CODE_PATHS = [(mkl, aten, "1,2" if (mkl, aten) in ((None, None), ("SSE4_2", "default")) else "1")
              for mkl in (None, "AVX2", "SSE4_2") for aten in (None, "avx2", "default")]


def _run_digests(tensors_path: Path, mkl: str | None, aten: str | None, thread_counts: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")}
    env.update({"MKL_ENABLE_INSTRUCTIONS": mkl} if mkl else {})
    env.update({"ATEN_CPU_CAPABILITY": aten} if aten else {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    code = ("import json, sys; from tests.test_cpu_invariance import canonical_pass_digests; "
            "print(json.dumps(canonical_pass_digests(*sys.argv[1:])))")
    done = subprocess.run([sys.executable, "-c", code, str(tensors_path), thread_counts], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_canonical_pass_has_one_digest_under_every_mkl_and_aten_code_path(tmp_path):
    cfg = tiny_config(**DIGEST_CFG)
    g = torch.Generator().manual_seed(8)
    tensors = {name: (torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=g) * 0.1)
               for name, shape in hf_tensor_shapes(cfg).items()}
    path = tmp_path / "weights.pt"
    torch.save(tensors, path)
    with ThreadPoolExecutor(max_workers=3) as pool:
        runs = dict(zip(CODE_PATHS, pool.map(lambda p: _run_digests(path, *p), CODE_PATHS)))
    assert sum(len(run) for run in runs.values()) == 3 * len(CODE_PATHS) + 4
    canonical = {d for run in runs.values() for key, d in run.items() if not key.startswith("fast/")}
    assert len(canonical) == 1, {p: run for p, run in runs.items()}
    # negative control: the library ops' pass does see the code paths, so the check has power
    fast = {d for run in runs.values() for key, d in run.items() if key.startswith("fast/")}
    if torch.backends.mkl.is_available():
        assert len(fast) > 1, "the fast pass gave one digest on every code path: the env vars changed nothing"


# -- accuracy ------------------------------------------------------------------------------------------

def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many float32 values lie between a and b (0: equal bits)."""
    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.int32).to(torch.int64)
        return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    return (ordered(a) - ordered(b)).abs()


def test_exact_exp_log_silu_are_within_one_float32_ulp_of_float64_torch():
    g = torch.Generator().manual_seed(0)
    xs = torch.cat([torch.linspace(-104, 89, 100_001), torch.randn(50_000, generator=g) * 10,
                    torch.randn(10_000, generator=g) * 1e-4, torch.tensor([0.0, -0.0, 1e-30, -1e-30])])
    positive = torch.cat([torch.logspace(-44, 38, 100_001), torch.rand(50_000, generator=g) + 0.5,
                          torch.tensor([1.4e-45, 3e-39, 1.0, 3.4e38])])
    for ours, ref, x in ((exact.exp, torch.exp, xs), (exact.silu, F.silu, xs), (exact.log, torch.log, positive)):
        got, want = ours(x), ref(x.double()).float()
        assert int(ulp_distance(got, want).max()) <= 1, ours.__name__


def test_exact_ops_give_zero_rows_plus_zero_and_keep_rows_apart():
    """A zero row (padding) gives +0 everywhere, and a row of inf or nan poisons only itself."""
    x = torch.zeros(4, 256)
    x[1] = _randn(256, seed=40)
    x[2, 7] = math.inf
    x[3, 9] = math.nan
    for out in (exact.linear(x, WEIGHT, slices=exact.WeightSlices()), exact.row_sum(x)[:, None],
                exact.rms_norm(x, torch.ones(256), 1e-5)):
        assert torch.equal(out[0], torch.zeros_like(out[0])) and not out[0].signbit().any()
        assert torch.isfinite(out[1]).all() and not torch.isfinite(out[2:]).all()
    clean = exact.linear(x[1:2], WEIGHT, slices=exact.WeightSlices())
    assert torch.equal(exact.linear(x, WEIGHT, slices=exact.WeightSlices())[1], clean[0])


def test_exact_exp_log_keep_the_special_values():
    inf, nan = math.inf, math.nan
    got = exact.exp(torch.tensor([-inf, inf, nan, 0.0, -800.0, 800.0]))
    assert got[0] == 0 and got[1] == inf and got[2].isnan() and got[3] == 1 and got[4] == 0 and got[5] == inf
    got = exact.log(torch.tensor([0.0, -1.0, inf, nan, 1.0]))
    assert got[0] == -inf and got[1].isnan() and got[2] == inf and got[3].isnan() and got[4] == 0
    assert exact.exp64(torch.zeros(3, dtype=torch.float64)).eq(1.0).all()  # exp(0) = 1 exactly: alpha of a skipped block


@pytest.mark.parametrize("k", [1, 7, 64, 512, 4096, 14336])
@pytest.mark.parametrize("has_outliers", [False, True])
def test_exact_gemm_is_within_its_bound_of_a_float64_gemm_and_beats_float32_blas(k, has_outliers):
    """|exact - float64| <= an ulp of the float32 result + K (2^-β_b + 2^(1-3β_a)) max|x| max|w| (what slicing
    drops), and its largest error is below float32 BLAS's, with outlier activations and weights too."""
    x = _randn(33, k, seed=k)
    w = _randn(48, k, seed=k + 1)
    if has_outliers:  # a few activation features 300x the rest, one weight column 50x
        x[:, :3] *= 300
        w[:, min(5, k - 1)] *= 50
    want = x.double() @ w.double().T
    got = exact.linear(x, w, slices=exact.WeightSlices()).double()
    row_bits, column_bits = exact.slice_bits(k)
    bound = (want.abs() * 2.0**-23 + k * (2.0**-column_bits + 2.0 ** (1 - 3 * row_bits))
             * x.abs().amax(-1, keepdim=True).double() * w.abs().amax(-1).double())
    assert bool(((got - want).abs() <= bound).all())
    assert float((got - want).abs().max()) <= float((F.linear(x, w).double() - want).abs().max())
    assert torch.equal(exact.matmul(x, w.T), exact.linear(x, w, slices=exact.WeightSlices()))


@pytest.mark.parametrize("length", [1, 100, 5000])
def test_exact_sums_are_within_their_bound_of_math_fsum(length):
    x = _randn(4, length, seed=length, scale=3)
    got = exact.row_sum(x)
    bound = length * 2.0 ** (1 - 53 + (length - 1).bit_length()) * x.abs().amax(-1).double()
    for i in range(4):
        assert abs(float(got[i]) - math.fsum(x[i].double().tolist())) <= float(bound[i])
    torch.testing.assert_close(exact.row_cumsum(x)[:, -1], got, rtol=0, atol=0)
