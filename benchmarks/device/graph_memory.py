"""Where the fast path's CUDA graphs' memory goes when every graph is captured up front (a diagnostic).

    PYTHONPATH=src python3 benchmarks/device/graph_memory.py --model 8b --variant admit_budget --out mem.json

Round 53 found every 8B dvr_ab run at 1,024 sequences printing "mixed-step CUDA graphs failed (OutOfMemoryError)":
the benchmark's generator then runs a step with prompt rows as two passes. This builds the
generator ``dvr_ab.py`` builds for ``--variant`` (same model, request set, K/V store) and captures the decode, prefill
and mixed graphs family by family, recording the memory allocated and reserved after each (the mixed graphs after
each decode bucket's), the graph counts and the capture times; an out-of-memory error is recorded where it
happens. Not a benchmark. (Round 53's call D ran it at 160367c with ``--pools shared,each``: one memory pool for
the three kinds of graph against a pool each, a layout measured and removed.)
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dvr_ab import add_setup_arguments, setup  # noqa: E402
from llm42.bench.modes import mode_by_name  # noqa: E402


def _mem(tag: str, rows: list, **extra) -> None:
    row = {"at": tag, "allocated_gib": round(torch.cuda.memory_allocated() / 2**30, 3),
           "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 3),
           "free_gib": round(torch.cuda.mem_get_info()[0] / 2**30, 3), **extra}
    rows.append(row)
    print(f"[graph_memory] {json.dumps(row)}", flush=True)


def capture_families(engine, rows: list, out: dict, *, tag: str,
                     mixed_decode_buckets: tuple[int, ...] | None = None) -> None:
    """Build ``engine``'s nondet generator with its up-front captures off, then capture the decode, prefill and
    mixed graphs family by family, a memory row after each (the mixed graphs: after each decode bucket's)."""
    from llm42.bench import runner

    originals = (runner.capture_prefill_graphs, runner.capture_decode_graphs, runner.capture_mixed_graphs)
    runner.capture_prefill_graphs = runner.capture_decode_graphs = runner.capture_mixed_graphs = lambda g, **k: []
    try:
        gen, _ = engine.generator(mode_by_name("nondet"))
    finally:
        runner.capture_prefill_graphs, runner.capture_decode_graphs, runner.capture_mixed_graphs = originals
    _mem(f"{tag}: generator built, nothing captured", rows)
    fast = gen.fast_step
    for family, capture in (("decode", fast.capture_decode), ("prefill", fast.capture_prefill)):
        t0 = time.perf_counter()
        try:
            count = capture()
            torch.cuda.synchronize()
            _mem(f"{tag}: {family} captured", rows, graphs=count, seconds=round(time.perf_counter() - t0, 2))
        except torch.OutOfMemoryError as exc:
            _mem(f"{tag}: {family} OOM", rows, error=str(exc)[:300])
    mixed = fast.mixed
    if mixed is not None and mixed.graphs is not None:
        out["mixed_decode_buckets"] = list(mixed.decode_buckets())
        out["prompt_buckets"] = list(mixed.prefill.graphs.buckets)
        t0 = time.perf_counter()
        for decode_bucket in sorted(mixed_decode_buckets or mixed.decode_buckets(), reverse=True):
            try:  # FastStep.capture_mixed: every prompt bucket and variant of this decode bucket
                fast.capture_mixed([decode_bucket])
            except torch.OutOfMemoryError as exc:
                _mem(f"{tag}: mixed OOM", rows, graphs=mixed.graphs.num_captured, decode_bucket=decode_bucket,
                     error=str(exc)[:300])
                break
            torch.cuda.synchronize()
            _mem(f"{tag}: mixed", rows, graphs=mixed.graphs.num_captured, decode_bucket=decode_bucket,
                 seconds=round(time.perf_counter() - t0, 2))
    out.setdefault("memory_summary", {})[tag] = torch.cuda.memory_summary(abbreviated=True)
    gen.close()
    del gen, fast, mixed
    gc.collect()
    torch.cuda.empty_cache()
    _mem(f"{tag}: generator closed", rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_setup_arguments(p)
    p.add_argument("--variant", default="admit_budget")
    p.add_argument("--mixed-decode-buckets", default=None,
                   help="capture the mixed graphs of these decode buckets only (e.g. 1024: the largest, the peak)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows: list = []
    out = {"args": {k: str(v) for k, v in vars(args).items()}, "device": torch.cuda.get_device_name(), "rows": rows}
    _mem("start", rows)
    _, _, _, _, engines = setup(args, [args.variant])
    engine = engines[args.variant]
    _mem("model and workload", rows, kv_cache_tokens=engine.kv_cache_tokens)
    buckets = tuple(int(b) for b in args.mixed_decode_buckets.split(",")) if args.mixed_decode_buckets else None
    capture_families(engine, rows, out, tag="the tree's", mixed_decode_buckets=buckets)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
