"""Host time of staging a wide canonical pass: round 14's staging against the one before, side by side.

    PYTHONPATH=src python3 benchmarks/cpu_staging.py [--out benchmarks/results/cpu_staging.json] [--reps 30]

A canonical pass (and a fast prompt chunk) stages its rows on the host before the device runs it
(``StaticRows.stage``): token ids, positions and slots per row, and one block table per sequence. On the
H200 a 2,048-row verify pass of 64 windows at 2,400 positions took 5.3 ms of host time to stage
(benchmarks/results/h200_round14/passes_tiled_det_smollm2_c2400.json, ``stage_host_ms``), longer than the
fast step it overlaps (3.5 ms on SmolLM2). Round 14 builds the rows through NumPy and every block table as one
array; ``LegacyRows`` below is the earlier staging (``torch.tensor`` on each list, one tensor per table). Both
stage the same passes in one process (the tiny model: staging does not depend on the model's size), timed
on the host clock (``llm42.bench.devicetime.median_ms``), median of ``--reps`` after 3 warm-ups; the staged
buffers are checked equal.
Host time only: what it saves on a GPU run is not measured here.

Round 23 adds the sampling rows of a pass (``CanonicalPass._stage_sampling``): round 22 built five Python lists
of a 2,048-row verify pass's per-row (params, seed, position) and converted each; round 23 writes each run of rows
that share a request's params and seed with ``np.repeat`` (``legacy_stage_sampling`` below is round 22's). Both
stage the same sampled 64-window pass; the staged host rows (and the sampler variant) are checked equal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.bench.devicetime import median_ms  # noqa: E402
from llm42.bench.models import tiny_config  # noqa: E402
from llm42.bench.passes import canonical_segments  # noqa: E402
from llm42.cuda_graphs import StaticRows  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from llm42.runner import Segment  # noqa: E402
from llm42.verify.sampling_runs import SamplingRuns  # noqa: E402

CONTEXT, WINDOW, NUM_SEQS = 2400, 32, 64


class LegacyRows(StaticRows):
    """``StaticRows.stage`` as it was before round 14: ``torch.tensor`` on Python lists, one tensor per table (into
    round 41's packed host buffer, sent in its one copy)."""

    def stage(self, kv, tokens, positions, slots, row_tables, table_of_row, *, num_rows=None):
        import numpy as np

        num_rows = self.num_rows if num_rows is None else num_rows
        pad = range(len(tokens), num_rows)
        positions = positions + [0] * len(pad)
        self.packed.wait()
        host = torch.from_numpy(self.packed.host("ints"))[:, :num_rows]
        host[0] = torch.tensor(tokens + [0] * len(pad), dtype=torch.int64)
        host[1] = torch.tensor(positions, dtype=torch.int64)
        host[2] = torch.tensor(slots + [kv.scratch_slot(i) for i in pad], dtype=torch.int64)
        host[3] = host[1] + 1
        scratch = kv.scratch_block
        width = max([len(t) for t in row_tables] + [1])
        num_tables = len(row_tables) + 1
        rows = np.array(table_of_row + [len(row_tables)] * len(pad), dtype=np.int64)
        _, first_row, which = np.unique(rows, return_index=True, return_inverse=True)
        host[4] = torch.from_numpy(first_row[which].astype(np.int64))
        host[5] = torch.from_numpy(rows)
        host_tables = torch.from_numpy(self.packed.host("tables"))[: num_tables * width].view(num_tables, width)
        host_tables.fill_(scratch)
        for i, table in enumerate(row_tables):
            host_tables[i, : len(table)] = torch.tensor(table, dtype=torch.int64)
        self._staged = (num_tables, width, num_rows)
        self.send()
        return max(positions, default=0) + 1


def legacy_stage_sampling(cp, per_row, num_results: int) -> None:
    """``CanonicalPass._stage_sampling`` as it was in round 22: a Python list per field, one conversion each."""
    from llm42.cuda_graphs import host_int64
    from llm42.sampler import sampling_variant

    pad = num_results - len(per_row)
    ints, floats = (torch.from_numpy(a) for a in cp._sampling_host())
    ints[0, :num_results] = host_int64([p.top_k for p, _, _ in per_row] + [0] * pad)
    ints[1, :num_results] = host_int64([s for _, s, _ in per_row] + [0] * pad)
    ints[2, :num_results] = host_int64([q for _, _, q in per_row] + [0] * pad)
    floats[0, :num_results] = torch.tensor([p.temperature for p, _, _ in per_row] + [0.0] * pad)
    floats[1, :num_results] = torch.tensor([p.top_p for p, _, _ in per_row] + [1.0] * pad)
    cp._variant = sampling_variant(p for p, _, _ in per_row)


def sampling_case(gen, kv, reps: int) -> dict:
    """Round 22's and round 23's sampling rows of one sampled 64-window verify pass (each window its own
    request's params and seed), median host ms of each, and whether they stage the same rows."""
    cfg = gen.cfg
    segments = [dataclasses.replace(seg, params=SamplingParams(deterministic=True, temperature=0.5 + i / 128, top_p=0.9,
                                                   top_k=i % 3 * 20), seed=1000 + i)
                for i, seg in enumerate(canonical_segments(cfg, window=WINDOW, group=NUM_SEQS,
                                                           context=CONTEXT + WINDOW,
                                                           params=SamplingParams(deterministic=True)))]
    per_row = [(seg.params, seg.seed, pos + 1) for seg in segments for pos in range(seg.start, seg.end)]
    cp = gen.verifier.canonical_pass
    staged = {}
    times = {}
    for label, stage in (("round22", lambda: legacy_stage_sampling(cp, per_row, 2048)),
                         ("round23", lambda: cp._stage_sampling(SamplingRuns.of_rows(per_row), 2048))):
        times[label] = median_ms(stage, gen.device, warmup=3, reps=reps)
        ints, floats = (torch.from_numpy(a) for a in cp._sampling_host())
        ints.fill_(-1)
        floats.fill_(-1.0)
        stage()
        staged[label] = (ints[:, :2048].clone(), floats[:, :2048].clone(), cp._variant)
    (i22, f22, v22), (i23, f23, v23) = staged["round22"], staged["round23"]
    same = torch.equal(i22, i23) and torch.equal(f22, f23) and v22 == v23
    full = median_ms(lambda: cp.stage(segments, kv, per_row, wanted=list(range(len(per_row)))), gen.device,
                     warmup=3, reps=reps)
    print(f"sampling rows, 2,048 rows: round 22 {times['round22']:.3f} ms, round 23 {times['round23']:.3f} ms "
          f"(x{times['round23'] / times['round22']:.2f}), rows equal: {same}; the whole stage() now "
          f"{full:.3f} ms", flush=True)
    return {"round22_ms": round(times["round22"], 4), "round23_ms": round(times["round23"], 4),
            "ratio": round(times["round23"] / times["round22"], 3), "rows_equal": same,
            "stage_round23_ms": round(full, 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/cpu_staging.json"))
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = tiny_config(8192)
    gen = DVRGenerator(random_weights(cfg, seed=0), cfg, window=WINDOW, group=8, max_num_seqs=NUM_SEQS + 1,
                       max_canonical_tokens=2048, kv_cache_tokens=(NUM_SEQS + 1) * (CONTEXT + 2112),
                       prefix_cache=False)
    kv = gen.kv
    for rid in range(NUM_SEQS):
        kv.allocate(rid, CONTEXT + 64)
        kv.append(rid, CONTEXT + WINDOW)
    prompt = NUM_SEQS
    kv.allocate(prompt, CONTEXT + 2048)
    kv.append(prompt, CONTEXT + 2048)
    params = SamplingParams(deterministic=True)
    cases = {
        "verify_64_windows_2048_rows": canonical_segments(cfg, window=WINDOW, group=NUM_SEQS,
                                                          context=CONTEXT + WINDOW, params=params),
        "prompt_chunk_2048_rows": [Segment(prompt, tuple(range(3, 2051)), CONTEXT, params, 0)],
    }
    cp = gen.verifier.canonical_pass
    cp.stage(cases["prompt_chunk_2048_rows"], kv)  # binds the pass's static rows to the store
    current = cp._rows
    legacy = LegacyRows(current.num_rows, gen.max_model_len, kv, gen.device, max_seqs=current.max_seqs)
    result = {"torch": torch.__version__, "context": CONTEXT, "reps": args.reps, "cases": {}}
    for name, segments in cases.items():
        rows = {}
        for label, static in (("legacy", legacy), ("round14", current)):
            rows[label] = median_ms(lambda s=static: s.stage_segments(kv, segments, num_rows=2048), gen.device,
                                     warmup=3, reps=args.reps)  # noqa: B023
        current.stage_segments(kv, segments, num_rows=2048)
        legacy.stage_segments(kv, segments, num_rows=2048)
        width = max(len(kv.block_table(seg.rid)) for seg in segments)  # columns past it keep stale ids, unread
        same = (torch.equal(current.ints, legacy.ints)
                and torch.equal(current.block_tables[:, :width], legacy.block_tables[:, :width]))
        result["cases"][name] = {"legacy_ms": round(rows["legacy"], 4), "round14_ms": round(rows["round14"], 4),
                                 "ratio": round(rows["round14"] / rows["legacy"], 3), "buffers_equal": same}
        print(f"{name}: legacy {rows['legacy']:.3f} ms, round 14 {rows['round14']:.3f} ms "
              f"(x{rows['round14'] / rows['legacy']:.2f}), buffers equal: {same}", flush=True)
    result["cases"]["sampling_rows_64_sampled_windows_2048_rows"] = sampling_case(gen, kv, args.reps)
    gen.close()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
