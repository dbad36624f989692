"""How much of an 8B decode step's GEMMs and decode attention can run at once on this card, before anyone builds an
engine that overlaps them (round 49's two-halves attempt served 0.885x of the serial step and was removed).

    PYTHONPATH=src python3 benchmarks/device/overlap_potential.py --out overlap_potential.json
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/device/overlap_potential.py --out o.json --smoke  # CPU

Per decode batch (ShareGPT-like running contexts, pages of 16 shuffled, random bf16 K/V and weights of the 8B
shape's layer), each timed with CUDA events (median of ``--reps``), ``--layers`` layers of:
- ``gemm``: the layer's four projections (QKV, o_proj, gate_up, down) at the batch's rows; ``gemm_halves``: the
  same at half the rows, twice (what cutting the batch costs the GEMMs);
- ``attention``: the fast decode attention (``paged_decode_attention`` at the engine's split count and order) over
  one layer's K/V, once per layer;
- ``serial``: both, one after the other on one stream (the engine's step);
- ``concurrent``: the GEMMs on one stream and the attentions on another, launched together with no dependency
  between them: the most any overlap of the two could give (``serial / concurrent``);
- with CUDA green contexts (``--green-sms``): the attentions alone on that many SMs, and beside the GEMMs (on every
  SM) — does the attention keep its bandwidth on a share of the SMs, and do the GEMMs then lose less?
A diagnostic, not a timed test; nothing in the engine reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_attention_sweep import sharegpt_contexts  # noqa: E402
from llm42.bench import devicetime  # noqa: E402
from llm42.cuda_graphs import green_contexts_supported, lend_streams  # noqa: E402
from llm42.inputs import longest_first  # noqa: E402
from llm42.kernels import attention  # noqa: E402

PAGE = 16
# (hidden, q heads, kv heads, head dim, intermediate): the 8B shape; --smoke: a tiny one
SHAPES = {"8b": (4096, 32, 8, 128, 14336), "smoke": (64, 4, 2, 16, 128)}


def layer_weights(shape, device, dtype, g) -> list[torch.Tensor]:
    hidden, heads, kv_heads, dim, inter = shape
    sizes = [((heads + 2 * kv_heads) * dim, hidden), (hidden, heads * dim), (2 * inter, hidden), (hidden, inter)]
    return [(torch.randn(out, inp, generator=g) * inp ** -0.5).to(device, dtype) for out, inp in sizes]


class _Owner:
    """Holds the lent green streams for the process (``lend_streams`` returns them when its owner goes)."""


def gemms(rows: tuple[torch.Tensor, torch.Tensor], weights: list[torch.Tensor], layers: int) -> None:
    """``layers`` layers' projections: x [M, hidden] through QKV, o_proj and gate_up, act [M, intermediate] through
    down (the activations' values do not matter here)."""
    x, act = rows
    qkv, o, gate_up, down = weights
    for _ in range(layers):
        F.linear(x, qkv)
        F.linear(x, o)
        F.linear(x, gate_up)
        F.linear(act, down)


def decode_batch(shape, num_seqs: int, device, dtype, g, seed: int):
    _, heads, kv_heads, dim, _ = shape
    contexts = sharegpt_contexts(num_seqs, seed).tolist()
    max_blocks = -(-max(contexts) // PAGE)
    tables = torch.randperm(num_seqs * max_blocks, generator=g).view(num_seqs, max_blocks).to(device)
    slots = num_seqs * max_blocks * PAGE
    k_cache = torch.randn(slots, kv_heads, dim, device=device, dtype=dtype)  # made on the device: fast
    v_cache = torch.randn(slots, kv_heads, dim, device=device, dtype=dtype)
    q = torch.randn(num_seqs, heads, dim, device=device, dtype=dtype)
    lens = torch.tensor(contexts, device=device)
    return q, k_cache, v_cache, tables, lens, contexts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="256,320,512")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--green-sms", default="32,64", help="green-context SM counts for the attention ('' for none)")
    ap.add_argument("--smoke", action="store_true", help="the CPU under the Triton interpreter, a tiny shape")
    args = ap.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    shape = SHAPES["smoke" if args.smoke else "8b"]
    layers = 1 if args.smoke else args.layers
    reps = 2 if args.smoke else args.reps
    g = torch.Generator().manual_seed(0)
    weights = layer_weights(shape, device, dtype, g)
    is_cuda = device.type == "cuda"
    side = torch.cuda.Stream(device) if is_cuda else None
    greens, owner = {}, _Owner()
    if is_cuda and args.green_sms and green_contexts_supported():
        greens = {int(n): lend_streams(owner, device, 1, num_sms=int(n))[0] for n in args.green_sms.split(",")}
    out = {"device": torch.cuda.get_device_name() if is_cuda else "cpu", "torch": torch.__version__,
           "layers": layers, "ceilings": devicetime.measure_ceilings(device),
           "green_contexts": sorted(greens) if greens else "unsupported or not asked", "batches": {}}
    for num_seqs in [int(b) for b in args.batches.split(",")]:
        q, k_cache, v_cache, tables, lens, contexts = decode_batch(shape, num_seqs, device, dtype, g, seed=num_seqs)
        splits = attention.choose_num_splits(num_seqs, shape[2], max(contexts), num_sms=attention.num_sms(device))
        order = longest_first(lens) if attention.DECODE_LONGEST_FIRST else None
        whole = (torch.randn(num_seqs, shape[0], device=device, dtype=dtype),
                 torch.randn(num_seqs, shape[4], device=device, dtype=dtype))
        half = tuple(t[: num_seqs // 2].clone() for t in whole)

        def attend() -> None:
            for _ in range(layers):
                attention.paged_decode_attention(q, k_cache, v_cache, tables, lens, block_size=PAGE,
                                                 scale=shape[3] ** -0.5, num_splits=splits, order=order)

        def on(stream, fn) -> None:
            """``fn`` on ``stream``, forked from and joined back to the current stream (timed by its events)."""
            main_stream = torch.cuda.current_stream(device)
            stream.wait_stream(main_stream)
            with torch.cuda.stream(stream):
                fn()
            main_stream.wait_stream(stream)

        def beside(attention_stream) -> None:
            main_stream = torch.cuda.current_stream(device)
            attention_stream.wait_stream(main_stream)
            with torch.cuda.stream(attention_stream):
                attend()
            gemms(whole, weights, layers)
            main_stream.wait_stream(attention_stream)

        cases = {"gemm": lambda: gemms(whole, weights, layers),
                 "gemm_halves": lambda: (gemms(half, weights, layers), gemms(half, weights, layers)),
                 "attention": attend, "serial": lambda: (gemms(whole, weights, layers), attend())}
        if is_cuda:
            cases["concurrent"] = lambda: beside(side)
            for n, stream in greens.items():
                cases[f"attention_green_{n}"] = lambda s=stream: on(s, attend)
                cases[f"concurrent_green_{n}"] = lambda s=stream: beside(s)
        ms = {name: round(devicetime.median_ms(fn, device, reps=reps), 4) for name, fn in cases.items()}
        kv_bytes = sum(contexts) * shape[2] * shape[3] * 2 * k_cache.element_size() * layers
        flops = 2 * num_seqs * sum(w.numel() for w in weights) * layers
        row = {"num_seqs": num_seqs, "mean_context": sum(contexts) / num_seqs, "max_context": max(contexts),
               "splits": splits, "ms": ms,
               "gemm_TFLOPs": round(flops / (ms["gemm"] * 1e-3) / 1e12, 1),
               "attention_TBps": round(kv_bytes / (ms["attention"] * 1e-3) / 1e12, 3),
               "gemm_halves_over_gemm": round(ms["gemm_halves"] / ms["gemm"], 3)}
        if "concurrent" in ms:
            row["serial_over_concurrent"] = round(ms["serial"] / ms["concurrent"], 3)
        for n in greens:
            row[f"green_{n}_attention_TBps"] = round(kv_bytes / (ms[f"attention_green_{n}"] * 1e-3) / 1e12, 3)
            row[f"serial_over_concurrent_green_{n}"] = round(ms["serial"] / ms[f"concurrent_green_{n}"], 3)
        out["batches"][str(num_seqs)] = row
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        del q, k_cache, v_cache, tables, lens, whole, half
        if is_cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
