"""The CUDA sampler, fused (round 50) against the torch ops on a float32 copy: one process, CUDA graphs, medians.

    PYTHONPATH=src python3 benchmarks/device/sampler_ab.py --out sampler_ab.json

``llm42.sampler.sample_with_margins`` (what the fast path's decode and mixed graphs run) on bf16 logits of the
8B head (V = 128,256) and SmolLM2's (V = 49,152) at 64, 256 and 512 rows, every row greedy, every other row
sampled (the benchmarks' mix) or every row (T in (0, 1.5]), each variant (``VARIANTS``: the fused default,
the float32 copy, greedy rows skipping the Gumbel sweep, the sweep split over about 512 or 2,048 programs, both)
captured in its own graph and replayed interleaved; every variant's tokens, values and margins are compared bit
for bit with the default's.
The bytes: the fused sampler reads the [N, V] bf16 logits twice (row statistics, then Gumbel-max); its
``read_TBps`` is those bytes over its time.

``--filtered`` (round 53) times instead a step with one top-p row (top_p = 0.9) among rows half sampled: the
top-k / top-p threshold in chunks of ``FILTER_CHUNK_ELEMENTS`` (the tree's) against all rows at once (before round
53), and the same rows without the top-p row (the fused sampler, which a step without a filtered row runs); with
each variant's peak memory during its capture (``peak_GiB``: the filter's temporaries) and the bits compared.
Round 55 times the threshold's kernel (``llm42.sampler.FILTER_KERNEL``, ``kernels.sampling.filter_threshold``)
against the torch filter in chunks, with one top-p row and with every row filtered (top-p 0.9, every fourth row also
top-k 50), and records how many sampled rows' tokens the two agree on (the same threshold in other arithmetic).
Round 56 adds the kernel with one program per row (``whole_*``: ``FILTER_CHUNK_BLOCKS = None``, round 55's launch)
beside the tree's split of a row over programs of a few blocks each, and the split with 16 and 8 pivots a pass
(``fan16_every``, ``fan8_every``; the tree's 4 since round 56: fewer compares per value, more passes) on every row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42 import sampler  # noqa: E402
from llm42.kernels import sampling  # noqa: E402
from llm42.sampler import SamplingRows, sample_with_margins  # noqa: E402


def graphed(fn):
    """(graph, outputs) of ``fn`` captured after a warm-up call on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def interleaved_ms(graphs: dict, reps: int) -> dict:
    """Median ms per replay of each graph, replayed in turn ``reps`` times (CUDA events around each replay)."""
    times = {name: [] for name in graphs}
    for _ in range(3):
        for g in graphs.values():
            g.replay()
    torch.cuda.synchronize()
    for _ in range(reps):
        for name, g in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(t) for name, t in times.items()}


# (name, FUSED_CUDA_SAMPLER, kernels.sampling.GUMBEL_TARGET_PROGRAMS, GUMBEL_SKIP_GREEDY): the default first
VARIANTS = (("fused", True, None, False), ("unfused", False, None, False), ("skip_greedy", True, None, True),
            ("split_512", True, 512, False), ("split_2048", True, 2048, False), ("lean_1024", True, 1024, True))


def main() -> int:
    tree = (sampler.FUSED_CUDA_SAMPLER, sampling.GUMBEL_TARGET_PROGRAMS, sampling.GUMBEL_SKIP_GREEDY)
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--filtered", action="store_true", help="time a step with one top-p row (see the docstring)")
    args = p.parse_args()
    if args.filtered:
        return filtered(args)
    entries = []
    for shape, vocab in (("8b", 128256), ("smollm2", 49152)):
        for rows in (64, 256, 512):
            for mode in ("greedy", "half", "sampled"):
                gen = torch.Generator(device="cuda").manual_seed(rows)
                logits = (torch.randn(rows, vocab, device="cuda", generator=gen) * 3).bfloat16()
                ints = torch.arange(rows, device="cuda")
                temps = torch.rand(rows, device="cuda", generator=gen) * 1.5 + 1e-3
                if mode != "sampled":  # greedy: every row; half: every other row (the benchmarks' request mix)
                    temps[:: 1 if mode == "greedy" else 2] = 0.0
                rows_in = SamplingRows(temperature=temps, top_k=torch.zeros_like(ints), top_p=torch.ones_like(temps),
                                       seeds=ints * 31 + 7, positions=ints + 100, is_any_sampled=mode != "greedy",
                                       is_any_filtered=False)
                graphs, outs = {}, {}
                for name, fused, programs, skip in VARIANTS:  # read when the graph is captured
                    sampler.FUSED_CUDA_SAMPLER, sampling.GUMBEL_TARGET_PROGRAMS = fused, programs
                    sampling.GUMBEL_SKIP_GREEDY = skip
                    graphs[name], outs[name] = graphed(lambda: sample_with_margins(logits, rows_in))
                sampler.FUSED_CUDA_SAMPLER, sampling.GUMBEL_TARGET_PROGRAMS, sampling.GUMBEL_SKIP_GREEDY = tree
                ms = interleaved_ms(graphs, args.reps)
                read = 2 * logits.numel() * logits.element_size()
                entry = {"shape": shape, "vocab": vocab, "rows": rows, "mode": mode,
                         **{f"{name}_ms": round(ms[name], 4) for name in graphs},
                         **{f"{name}_over_fused": round(ms[name] / ms["fused"], 3)
                            for name in graphs if name != "fused"},
                         "fused_read_TBps": round(read / ms["fused"] / 1e9, 3),
                         "same_bits": all(torch.equal(a, b) for name in graphs
                                          for a, b in zip(outs["fused"], outs[name]))}
                entries.append(entry)
                print(json.dumps(entry), flush=True)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps, "runs": entries}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(e["same_bits"] for e in entries) else 1


def filtered(args) -> int:
    """``--filtered``: the top-k / top-p threshold's kernel against the torch filter, one top-p row and every sampled
    row filtered, and the unfiltered step."""
    chunk = sampler.FILTER_CHUNK_ELEMENTS
    entries = []
    for shape, vocab in (("8b", 128256), ("smollm2", 49152)):
        for rows in (64, 256, 1056):
            gen = torch.Generator(device="cuda").manual_seed(rows)
            logits = (torch.randn(rows, vocab, device="cuda", generator=gen) * 3).bfloat16()
            ints = torch.arange(rows, device="cuda")
            temps = torch.rand(rows, device="cuda", generator=gen) * 1.5 + 1e-3
            temps[::2] = 0.0

            def sampling_rows(top_k, top_p, is_filtered):
                return SamplingRows(temperature=temps, top_k=top_k, top_p=top_p, seeds=ints * 31 + 7,
                                    positions=ints + 100, is_any_sampled=True, is_any_filtered=is_filtered)

            one_p = torch.ones_like(temps)
            one_p[1] = 0.9  # one sampled row asks for top-p
            every_p = torch.full_like(temps, 0.9)  # every row (top-p 0.9; every fourth also top-k 50)
            every_k = torch.where(ints % 4 == 1, 50, 0)
            split, fan = sampling.FILTER_CHUNK_BLOCKS, sampling.FILTER_FAN  # the tree's (None: a program per row)
            one, every = sampling_rows(torch.zeros_like(ints), one_p, True), sampling_rows(every_k, every_p, True)
            cases = {"kernel_one": (True, split, fan, one), "whole_one": (True, None, fan, one),
                     "torch_one": (False, split, fan, one), "kernel_every": (True, split, fan, every),
                     "whole_every": (True, None, fan, every), "torch_every": (False, split, fan, every),
                     # fewer pivots a pass: fewer compares per value, more passes
                     "fan16_every": (True, split, 16, every), "fan8_every": (True, split, 8, every),
                     "unfiltered": (True, split, fan, sampling_rows(torch.zeros_like(ints), torch.ones_like(temps),
                                                                    False))}
            graphs, outs, peaks = {}, {}, {}
            for name, (kernel, blocks, pivots, case_rows) in cases.items():
                sampler.FILTER_KERNEL = kernel  # read when the graph is captured
                sampling.FILTER_CHUNK_BLOCKS, sampling.FILTER_FAN = blocks, pivots
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                graphs[name], outs[name] = graphed(lambda r=case_rows: sample_with_margins(logits, r))
                torch.cuda.synchronize()
                peaks[name] = (torch.cuda.max_memory_allocated() - base) / 2**30
            sampler.FILTER_KERNEL, sampling.FILTER_CHUNK_BLOCKS, sampling.FILTER_FAN = True, split, fan
            ms = interleaved_ms(graphs, args.reps)
            unfiltered = torch.ones(rows, dtype=torch.bool, device="cuda")
            unfiltered[1] = False
            sampled = temps > 0
            entry = {"shape": shape, "vocab": vocab, "rows": rows, **{f"{n}_ms": round(ms[n], 4) for n in graphs},
                     "torch_over_kernel_one": round(ms["torch_one"] / ms["kernel_one"], 3),
                     "torch_over_kernel_every": round(ms["torch_every"] / ms["kernel_every"], 3),
                     "whole_over_split_one": round(ms["whole_one"] / ms["kernel_one"], 3),
                     "whole_over_split_every": round(ms["whole_every"] / ms["kernel_every"], 3),
                     "fan16_over_fan_every": round(ms["fan16_every"] / ms["kernel_every"], 3),
                     "fan8_over_fan_every": round(ms["fan8_every"] / ms["kernel_every"], 3),
                     "kernel_one_over_unfiltered": round(ms["kernel_one"] / ms["unfiltered"], 3),
                     "kernel_every_over_unfiltered": round(ms["kernel_every"] / ms["unfiltered"], 3),
                     **{f"{n}_peak_GiB": round(peaks[n], 3) for n in graphs},
                     # the two define the same threshold in other arithmetic: the sampled rows' tokens that agree
                     "same_tokens_one": float((outs["kernel_one"][0] == outs["torch_one"][0])[sampled].float().mean()),
                     "same_tokens_every": float((outs["kernel_every"][0] == outs["torch_every"][0])[sampled]
                                                .float().mean()),
                     # the split and a program per row add a row's sums in other orders: tokens that agree
                     "same_tokens_split_whole": float((outs["kernel_every"][0] == outs["whole_every"][0])[sampled]
                                                      .float().mean()),
                     # every row but the top-p one draws what it draws in a step without it
                     "other_rows_as_unfiltered": all(torch.equal(a[unfiltered], b[unfiltered])
                                                     for name in ("kernel_one", "whole_one", "torch_one")
                                                     for a, b in zip(outs[name], outs["unfiltered"]))}
            entries.append(entry)
            print(json.dumps(entry), flush=True)
            del graphs, outs
            torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps,
           "filter_chunk_elements": chunk, "filter_fan": sampling.FILTER_FAN, "filter_block": sampling.FILTER_BLOCK,
           "filter_warps": sampling.FILTER_WARPS,
           "filter_chunk_blocks": sampling.FILTER_CHUNK_BLOCKS, "runs": entries}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(e["other_rows_as_unfiltered"] for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
