"""What a long prompt's causal attention can run at on this GPU: the engine's tiled kernel against a minimal dense
Triton kernel and PyTorch's own attention backends, on the same problem.

    PYTHONPATH=src python3 benchmarks/device/attention_ceiling.py --out ceiling.json [--lengths 8192,15000]
        [--chunk 2048] [--reps 5] [--configs all|short]

One Llama-3.1-8B-shaped prompt (32 query heads, 8 kv heads, head dim 128, bf16) of L positions, prefilled in chunks
of ``--chunk`` rows (chunk c: rows [c C, (c + 1) C) over keys [0, row]), summed over chunks, as in
``prefill_chunk_attention.py``:

- ``engine_*``: ``tiled_prefill_attention`` on a paged cache (pages of 16, key-by-key gathers), its default
  configuration, and the canonical launch at 128 rows;
- ``dense_*``: a minimal Triton kernel on contiguous K/V (one query head per program, key blocks streamed, the
  blocks below the tile's diagonal unmasked), block_m x block_n x warps x stages, with the P V product either
  accumulated into the rescaled state (``acc_in_dot``: one MMA with an accumulator) or added after it (the engine
  kernel's ``acc * alpha + dot(p, v)``);
- ``paged_*``: the same minimal kernel over the paged cache through the block table, the page ids loaded in the
  iteration that uses them (``in_loop``: each K/V load waits on a table load) or one iteration ahead (``prefetch``);
  ``paged_attention(pack_gqa=, fp_fusion=)`` also packs one kv head's query heads into a tile as the engine does and
  turns FMA contraction off as the canonical launch does (``tile_ablation.py`` runs those);
- ``sdpa_*``: ``torch.nn.functional.scaled_dot_product_attention`` on the whole prompt at once (``is_causal``,
  ``enable_gqa``), per backend (flash, cuDNN, memory-efficient), where the backend takes it.

Device milliseconds by CUDA events (median of ``--reps`` after warm-ups), causal attention TFLOP/s, and for the
Triton kernels the registers and spills of the compiled binaries. A measurement of headroom, not of the engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench.devicetime import median_ms  # noqa: E402
from llm42.kernels import tiled_canonical_attention, tiled_prefill_attention  # noqa: E402
from llm42.kernels import tiled_attention as tiled  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
DENSE_CONFIGS = [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)]
# round 19 call C: the dense kernel's fastest two and the paged kernel beside them (``--configs short``)
SHORT_DENSE_CONFIGS = [(128, 64, 8, 3), (64, 64, 4, 3)]
PAGED_CONFIGS = [(128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 8, 2)]
LOG2E = 1.4426950408889634


@triton.jit
def _online_step(acc, m_i, l_i, q, k, v, qk_scale, keys, pos, MASKED: tl.constexpr, ACC_IN_DOT: tl.constexpr):
    # one key block of the online softmax; MASKED: the diagonal blocks (row at ``pos`` sees keys <= pos)
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        s = tl.where(pos[:, None] >= keys[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    if ACC_IN_DOT:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _causal_kernel(q_ptr, k_ptr, v_ptr, o_ptr, table_ptr, num_q, num_k, qk_scale,
                   stride_qm, stride_qh, stride_km, stride_kh, stride_om, stride_oh,
                   GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   ACC_IN_DOT: tl.constexpr, PAGED: tl.constexpr, PAGE: tl.constexpr, PREFETCH: tl.constexpr,
                   PACK_GQA: tl.constexpr = False):
    # q: [num_q, H, D], the last num_q positions of num_k keys. k, v: [num_k, Hkv, D] (contiguous), or with PAGED
    # a paged cache [slots, Hkv, D] read through one block-table row; PREFETCH: the next block's page ids are
    # loaded one iteration ahead (loop-carried), so no K/V load waits on a table load
    # PACK_GQA: a program takes one kv head's GROUPS query heads, BLOCK_M // GROUPS rows each, as the engine's tile
    # does (M-row i is row i // GROUPS of head i % GROUPS); else one query head's BLOCK_M rows
    tile = tl.num_programs(0) - 1 - tl.program_id(0)  # the longest key ranges first
    if PACK_GQA:
        kv_head = tl.program_id(1)
        rows_per_tile = BLOCK_M // GROUPS
        offs_m = tile * rows_per_tile + tl.arange(0, BLOCK_M) // GROUPS
        head = kv_head * GROUPS + tl.arange(0, BLOCK_M) % GROUPS
    else:
        head = tl.program_id(1)
        kv_head = head // GROUPS
        rows_per_tile = BLOCK_M
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    head = head if PACK_GQA else tl.full([BLOCK_M], 0, tl.int32) + head
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + head[:, None] * stride_qh + offs_d[None, :],
                mask=offs_m[:, None] < num_q, other=0.0)
    pos = offs_m + (num_k - num_q)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    first_pos = tile * rows_per_tile + num_k - num_q
    full_hi = (first_pos // BLOCK_N) * BLOCK_N  # every row of the tile sees keys below this in full
    hi = tl.minimum(num_k, first_pos + rows_per_tile)
    k_base = k_ptr + kv_head * stride_kh
    v_base = v_ptr + kv_head * stride_kh
    if PAGED:
        pages = tl.load(table_ptr + offs_n // PAGE)
    else:
        pages = tl.zeros([BLOCK_N], tl.int64)
    for start in range(0, full_hi, BLOCK_N):
        keys = start + offs_n
        if PAGED:
            if PREFETCH:
                rows = pages.to(tl.int64) * PAGE + keys % PAGE
                pages = tl.load(table_ptr + (keys + BLOCK_N) // PAGE)  # the next block's (the table is padded)
            else:
                rows = tl.load(table_ptr + keys // PAGE).to(tl.int64) * PAGE + keys % PAGE
        else:
            rows = keys
        k = tl.load(k_base + rows[:, None] * stride_km + offs_d[None, :])
        v = tl.load(v_base + rows[:, None] * stride_km + offs_d[None, :])
        acc, m_i, l_i = _online_step(acc, m_i, l_i, q, k, v, qk_scale, keys, pos, False, ACC_IN_DOT)
    for start in range(full_hi, hi, BLOCK_N):
        keys = start + offs_n
        if PAGED:
            rows = tl.load(table_ptr + keys // PAGE, mask=keys < num_k, other=0).to(tl.int64) * PAGE + keys % PAGE
        else:
            rows = keys
        k = tl.load(k_base + rows[:, None] * stride_km + offs_d[None, :], mask=keys[:, None] < num_k, other=0.0)
        v = tl.load(v_base + rows[:, None] * stride_km + offs_d[None, :], mask=keys[:, None] < num_k, other=0.0)
        acc, m_i, l_i = _online_step(acc, m_i, l_i, q, k, v, qk_scale, keys, pos, True, ACC_IN_DOT)
    out = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None] * stride_om + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < num_q)


def _attention(q, k, v, table, num_k, config, *, acc_in_dot, paged, prefetch, pack_gqa=False, fp_fusion=True):
    block_m, block_n, warps, stages = config
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    grid = ((triton.cdiv(q.shape[0], block_m // groups), k.shape[1]) if pack_gqa
            else (triton.cdiv(q.shape[0], block_m), q.shape[1]))
    _causal_kernel[grid](
        q, k, v, out, table, q.shape[0], num_k, HEAD_DIM ** -0.5 * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(0), out.stride(1),
        GROUPS=q.shape[1] // k.shape[1], D=HEAD_DIM, BLOCK_M=block_m, BLOCK_N=block_n, ACC_IN_DOT=acc_in_dot,
        PAGED=paged, PAGE=PAGE, PREFETCH=prefetch, PACK_GQA=pack_gqa, num_warps=warps, num_stages=stages,
        enable_fp_fusion=fp_fusion)
    return out


def dense_attention(q, k, v, config, acc_in_dot):
    """The minimal kernel on contiguous K/V [num_k, Hkv, D]."""
    return _attention(q, k, v, k, k.shape[0], config, acc_in_dot=acc_in_dot, paged=False, prefetch=False)


def paged_attention(q, k_paged, v_paged, table, num_k, config, prefetch, pack_gqa=False, fp_fusion=True):
    """The minimal kernel over a paged cache through ``table`` (one row, padded past its last block)."""
    return _attention(q, k_paged, v_paged, table, num_k, config, acc_in_dot=False, paged=True, prefetch=prefetch,
                      pack_gqa=pack_gqa, fp_fusion=fp_fusion)


def long_prompt(length: int, dev: torch.device, dtype: torch.dtype):
    """One prompt's random q [L, H, D], k and v [L, Hkv, D] (seeded by ``length``), the same keys in a paged cache
    (page j of the prompt in a shuffled block), each position's slot, the block table [1, blocks] and the table
    padded past its last block (the prefetching kernels read one block ahead)."""
    gen = torch.Generator().manual_seed(length)
    q_all = torch.randn(length, NUM_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
    k = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
    v = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
    num_blocks = -(-length // PAGE)
    perm = torch.randperm(num_blocks, generator=gen).to(dev)
    k_paged = torch.zeros(num_blocks * PAGE, NUM_KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
    v_paged = torch.zeros_like(k_paged)
    slots = perm[torch.arange(length, device=dev) // PAGE] * PAGE + torch.arange(length, device=dev) % PAGE
    k_paged[slots], v_paged[slots] = k, v
    return q_all, k, v, k_paged, v_paged, slots, perm.view(1, -1), torch.cat([perm, perm.new_zeros(8)])


def chunk_flops(lo: int, hi: int) -> float:
    return 4.0 * sum(p + 1 for p in range(lo, hi)) * HEAD_DIM * NUM_HEADS


def compiled_resources(kernel) -> list[dict]:
    """Registers and spills of every binary ``kernel`` compiled in this process (empty where Triton hides them)."""
    found = []
    try:
        for caches in kernel.device_caches.values():
            for compiled in caches[0].values():
                found.append({"n_regs": getattr(compiled, "n_regs", None), "n_spills": getattr(compiled, "n_spills", None),
                              "num_warps": getattr(getattr(compiled, "metadata", None), "num_warps", None),
                              "num_stages": getattr(getattr(compiled, "metadata", None), "num_stages", None)})
    except Exception as exc:  # Triton's cache layout differs between versions: record why
        found.append({"error": f"{type(exc).__name__}: {exc}"[:200]})
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default="8192,15000")
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--configs", choices=["all", "short"], default="all")
    args = ap.parse_args()
    dense_configs = DENSE_CONFIGS if args.configs == "all" else SHORT_DENSE_CONFIGS
    dev, dtype = torch.device("cuda"), torch.bfloat16
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "chunk": args.chunk, "reps": args.reps, "lengths": []}
    for length in (int(x) for x in args.lengths.split(",")):
        q_all, k, v, k_paged, v_paged, _, table, table_padded = long_prompt(length, dev, dtype)
        chunks = [(lo, min(lo + args.chunk, length)) for lo in range(0, length, args.chunk)]
        staged = [(q_all[lo:hi].contiguous(), torch.arange(lo, hi, device=dev),
                   torch.zeros(hi - lo, dtype=torch.int64, device=dev), hi) for lo, hi in chunks]
        total_flops = sum(chunk_flops(lo, hi) for lo, hi in chunks)
        common = dict(block_size=PAGE, scale=HEAD_DIM ** -0.5)
        runs = {
            "engine_fast_default": lambda q, p, s, hi: tiled_prefill_attention(q, k_paged, v_paged, p, s, table,
                                                                              **common),
            "engine_canonical_tile128": lambda q, p, s, hi: tiled_canonical_attention(q, k_paged, v_paged, p, s, table,
                                                                                     tile_m=128, **common),
        }
        for config in dense_configs:
            for acc_in_dot in (True, False):
                name = "dense_" + "x".join(map(str, config)) + ("_acc_in_dot" if acc_in_dot else "_add_after")
                runs[name] = (lambda q, p, s, hi, config=config, acc_in_dot=acc_in_dot:
                              dense_attention(q, k[:hi], v[:hi], config, acc_in_dot))
        for config in PAGED_CONFIGS:
            for prefetch in (False, True):
                name = "paged_" + "x".join(map(str, config)) + ("_prefetch" if prefetch else "_in_loop")
                runs[name] = (lambda q, p, s, hi, config=config, prefetch=prefetch:
                              paged_attention(q, k_paged, v_paged, table_padded, hi, config, prefetch))
        entry = {"length": length, "attention_TFLOP": round(total_flops / 1e12, 4), "runs": {}}
        reference = torch.cat([runs["engine_fast_default"](*s) for s in staged]).float()
        for name, fn in runs.items():
            try:
                out = torch.cat([fn(*s) for s in staged]).float()
                per_chunk = [median_ms(lambda: fn(*s), dev, warmup=2, reps=args.reps) for s in staged]  # noqa: B023
            except Exception as exc:
                entry["runs"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(f"L={length:6d} {name:34s} {entry['runs'][name]['error']}", flush=True)
                continue
            total = sum(per_chunk)
            err = float((out - reference).abs().max())
            entry["runs"][name] = {"total_ms": round(total, 4), "TFLOPs": round(total_flops / total / 1e9, 1),
                                   "max_abs_diff_vs_engine": err}
            print(f"L={length:6d} {name:34s} {total:8.3f} ms {total_flops / total / 1e9:6.1f} TFLOP/s "
                  f"(max |diff| vs engine {err:.2e})", flush=True)
        # the whole prompt at once through PyTorch's attention backends (GQA without copies)
        whole_flops = chunk_flops(0, length)
        qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q_all, k, v))  # [1, H, L, D]
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            name = f"sdpa_{backend.lower()}_whole"
            try:
                def call(backend=backend):
                    with sdpa_kernel(getattr(SDPBackend, backend)):
                        return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                                                enable_gqa=True)
                call()
                ms = median_ms(call, dev, warmup=2, reps=args.reps)
            except Exception as exc:
                entry["runs"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(f"L={length:6d} {name:34s} {entry['runs'][name]['error']}", flush=True)
                continue
            entry["runs"][name] = {"total_ms": round(ms, 4), "TFLOPs": round(whole_flops / ms / 1e9, 1)}
            print(f"L={length:6d} {name:34s} {ms:8.3f} ms {whole_flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
        result["lengths"].append(entry)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    result["resources"] = {"engine_tiled_kernel": compiled_resources(tiled._tiled_attention_kernel),
                           "minimal_kernel": compiled_resources(_causal_kernel)}
    print(json.dumps(result["resources"]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
