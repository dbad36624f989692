"""DVR's engine variants side by side in one process: the same offline requests, nondet and dvr@p, per variant.

    PYTHONPATH=src python3 benchmarks/device/dvr_ab.py --model PATH_OR_8B --out ab.json [--modes nondet,dvr@10,dvr@50]
        [--variants default,wide_verify,round7] [--num-requests 1000] [--max-num-seqs 1024] [--budget-s 400]
        [--repeats 1]

Variants (``DVRGenerator`` knobs): ``default`` (the engine's defaults: on CUDA since round 9 drafting ahead, wide
verify passes, each pass on its own stream), ``det_rows`` (``FastPolicy(decode_kernel="deterministic")``:
deterministic requests' decode rows with the canonical attention's bits; round 11's device calls ran it under the
name ``default``), ``split_rows`` (every decode row on the split-KV kernel: the default, named explicitly),
``canonical_decode`` (``FastPolicy(decode_kernel="canonical")``: every row of a batch that fills the GPU),
``adaptive`` (the defaults with ``adaptive_draft=True``), ``chunked`` (the canonical pass on the chunked
attention, ``FixedShapePolicy(attention_kernel="chunked")``: other committed bits), ``chunked_det_rows`` (that, with
deterministic rows on its bits, their chunks in parallel), ``round8`` (round 8's default: drafting ahead, narrow passes on the
caller's stream), ``wide_verify`` (that with wide verify passes), ``no_draft_ahead`` (round 8's without drafting
ahead), ``round7`` (neither), ``side_stream`` (drafting ahead, narrow passes on their own stream),
``side_stream_wide`` (drafting ahead, wide passes on their own stream), ``triton_gemm`` (the canonical GEMM as the
batch-invariant Triton matmul, ``FixedShapePolicy(gemm="triton")``: other committed bits, a wide pass's GEMMs in
one launch), ``priority`` (``prioritize_fast=True``: each step's work on a high-priority stream, the passes on the
lowest). Round 9's call B ran ``default`` when it was
round 8's; round 8's runs named drafting ahead + wide verify ``new`` and drafting ahead alone ``no_wide_verify``.
The model is loaded once (``llm42.bench.serving``'s loaders; SmolLM2's chat prompts when it has a tokenizer);
each variant builds its generators through the benchmarks' ``Engine`` (every graph captured before timing) and
runs every mode on the same request set through ``run_offline``. Variants run in turn, mode by mode
(nondet of variant 1, of variant 2, ..., then dvr@10 of each, ...), so drift on the machine spreads over all.
Each run gets an equal share of ``--budget-s``, counted from its first request (building its generator, every graph
captured, comes before and is not in it); a run cut by it says so (``is_complete``). Where the first timed run is
cut, the script stops there (``stopped`` in the JSON; round 33 spent ~800 s of device time on runs all cut by a
share sized too small); ``--keep-going-when-cut`` goes on anyway.
Before the timed runs, every variant runs every mode (or ``--warmup-modes``) on ``--warmup-requests`` requests,
untimed (kernels compile).
Reported per run: output tok/s and its ratio to the same variant's nondet, engine steps, ms per step,
canonical passes and rows, rollbacks and recompute of deterministic requests, drafts ahead kept/dropped, the
verified and rejected drafts by margin (``margins``; ``risky_drafts`` / ``risky_rollbacks`` with a risk margin), where
the run's length comes from (``tail``: first-token and per-token times of free and deterministic requests, the
last requests to finish, the length had deterministic requests decoded at the free ones' rate); and
whether each variant's deterministic outputs equal those of the first variant with the same canonical config
(they must: the contract; another canonical attention or GEMM commits other bits). Each dvr run also records a
digest per finished deterministic request (``deterministic_digests``: request index -> SHA-256 of its token ids,
16 hex digits), so two processes' runs of one canonical config can be compared (``--compare A.json B.json``).

``--repeats N`` (round 25: a one-run ratio moved by +-0.05, and the variant run second in a mode tended to score
higher): every (variant, mode) runs N times, the variants' order reversed on every other repeat (ABBA), each run a
share of the budget. ``runs`` keeps the first repeat's full record (as with one repeat); ``repeats[v][mode]`` every
repeat's figures (ratio against that repeat's nondet of the variant, position in its mode, steps, passes, the free
and deterministic requests' last token); ``repeat_summary`` the median, least and largest ratio over the complete
repeats (``n``; ``n_cut`` cut by the budget); ``repeats_identical`` each repeat's deterministic outputs against the
first's (the contract across repeats).

``--lm-head-std S --lm-head-bias-scale B`` (random models): the output head of ``llm42.bench.figures.HeadBasis``
at that point, e.g. round 5's head calibrated to SmolLM2's flip rate on the 8B shape (S 0.2, B 26.9).
``--online-load L``: then, per variant, ``--online-modes`` (default nondet,dvr@50) serve the first
``--online-requests`` requests arriving as a Poisson process at L x the first variant's offline nondet capacity
(requests per second); reported: free and deterministic requests' ITL and TTFT percentiles, and each free ITL
percentile over the same variant's online nondet's, and (``free_gaps``, round 33) the free gaps by what the steps
they span did: launched a canonical pass, delivered its commits, both or neither (``free_gap_attribution``: each
kind's share and percentiles, the kinds among the slowest 1 %, the steps' own times by kind). ``--profile-mode M``: last, one more run of M per variant
with ``cProfile`` on the engine's steps (the host's own time by function, top 90 by own and by cumulative time,
under ``host_profile`` in the ``--out`` JSON); a diagnostic, its run is slower and is not a figure.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import hashlib
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # batched_passes.py beside it

from llm42.bench.hostprobe import host_probe  # noqa: E402
from llm42.bench.metrics import free_gap_attribution  # noqa: E402
from llm42.bench.models import build_model  # noqa: E402
from llm42.bench.modes import deterministic_order, mode_by_name  # noqa: E402
from llm42.bench.figures import HeadBasis, with_head  # noqa: E402
from llm42.bench.runner import run_offline, run_online  # noqa: E402
from llm42.engine.requests import MARGIN_STATS  # noqa: E402
from llm42.bench.workloads import poisson_arrivals  # noqa: E402
from llm42.bench.serving import (  # noqa: E402
    ServingConfig, _engine, _max_positions, build_workload, kv_tokens_for, prepare_checkpoint, serving_summary,
)

VARIANTS = {
    "default": {},  # the library's defaults: since round 44 order="canonical_budget" (before: arrival, "order_arrival")
    "round8": {"canonical_stream": False, "wide_verify": False},
    "wide_verify": {"canonical_stream": False, "wide_verify": True},
    "no_draft_ahead": {"canonical_stream": False, "wide_verify": False, "draft_ahead": False},
    "round7": {"canonical_stream": False, "wide_verify": False, "draft_ahead": False},
    "side_stream": {"canonical_stream": True, "wide_verify": False},
    "side_stream_wide": {"canonical_stream": True, "wide_verify": True},
    # round 11: the fast path's decode attention (FastPolicy(decode_kernel=...)). "det_rows": deterministic requests'
    # rows with the canonical attention's bits (round 11's calls ran it as "default", the tree's default then);
    # "split_rows": every row on the split-KV kernel, the engine's default (round 10's and again after round 11)
    "det_rows": {"fast_decode_kernel": "deterministic"},
    "split_rows": {"fast_decode_kernel": "split"},
    "canonical_decode": {"fast_decode_kernel": "canonical"},
    # the chunked canonical attention (other committed bits): split rows, and deterministic rows on its bits with
    # their chunks in parallel (not measured in round 11: written for the next device session)
    "chunked": {"canonical_attention": "chunked"},
    "chunked_det_rows": {"canonical_attention": "chunked", "fast_decode_kernel": "deterministic",
                         "canonical_key_chunk": 512},
    "adaptive": {"adaptive_draft": True},
    # round 12: DefaultScheduler(prompt_share=...): windows leave that share of a pass's rows to deterministic
    # prompts while any wait; window 16 (R = 16 x 16 = 256 still: another canonical config, other bits), alone
    # and with the share
    "prompt_share": {"prompt_share": 0.5},
    "w16": {"window": 16, "group": 16},
    "w16_share": {"window": 16, "group": 16, "prompt_share": 0.5},
    # round 40: windows of 64 (R = 64 x 4 = 256 still; another canonical config, other bits): half the windows per
    # deterministic token, so fewer passes for the fast steps to run beside (a pass of up to R rows costs ~1.5 ms of
    # latency-bound kernels whatever its rows, round 36); a flip wastes up to 63 drafts (rare on a trained model)
    "w64": {"window": 64, "group": 4},
    # round 13: the canonical GEMM as the batch-invariant Triton matmul (FixedShapePolicy(gemm="triton"): other
    # committed bits), a wide pass's GEMMs in one launch over all its rows instead of one cuBLAS call per R rows
    "triton_gemm": {"canonical_gemm": "triton"},
    # round 25: the Triton canonical GEMM in passes of up to 4,096 rows (one launch per linear over all of them)
    "triton_gemm_4096": {"canonical_gemm": "triton", "max_canonical_tokens": 4096},
    # round 14: each step's work on a high-priority stream, the canonical passes' stream on the lowest
    # (DVRGenerator(prioritize_fast=True)): free requests' steps first when both have blocks waiting
    "priority": {"prioritize_fast": True},
    # round 15: a wide pass's R-row GEMM blocks one after another ("serial_gemm", round 15's call B ran the tree
    # whose default was 4 streams; the default again after it) and side by side on 4 streams of the pass's own (the
    # same calls, the same bits)
    "serial_gemm": {"canonical_gemm_streams": 1},
    "gemm_streams4": {"canonical_gemm_streams": 4},
    # and the canonical tiled attention's fixed tiling (no tile table staged with a pass: round 14's launch, the
    # same bits), alone and with the serial GEMM blocks (round 14's canonical pass)
    "fixed_tiles": {"segment_tiles": False},
    "round14_pass": {"canonical_gemm_streams": 1, "segment_tiles": False},
    # round 15's call B ran "default" with 4 streams (the default then)
    # round 16: the fast path's graph row ladder as powers of two (the ladder before round 16; a step past
    # max_fast_tokens) against the default (multiples of 128 above 128 on the 8B shape, powers of two on SmolLM2)
    "pow2_ladder": {"graph_bucket_step": 4096},
    # round 18: the tiled canonical attention in 128-row tiles (FixedShapePolicy(tile_m=128): its own canonical
    # config; on the H200 the two heights gave every row sampled the same bits in round 17, so its deterministic
    # outputs are compared with the default's here, a check that would fail if the heights' bits differed)
    "tile128": {"canonical_tile_m": 128},
    # and the long-prompt canonical config: the Triton GEMM (its 8B tiles on TMA since round 18) with 128-row tiles
    # (other committed bits than the default's): what it costs deterministic requests' narrow verify passes
    "triton_tile128": {"canonical_gemm": "triton", "canonical_tile_m": 128},
    # round 23: which passes go behind a pass in flight (DVRGenerator(chain_passes=...)): round 22's rule (only a
    # long prompt's next chunks; "prompts"), every plan, none (round 21); and partial windows verified while the
    # canonical stream idles and the drafting deterministic requests fit one R-row pass (DefaultScheduler(
    # eager_verify=True)). Round 23's calls B and D ran with "all" as the tree's default then: their "default"
    # and "eager" variants chained every plan ("chain_all" and "eager_chain_all" here)
    "chain_prompts": {"chain_passes": "prompts"},
    "chain_all": {"chain_passes": "all"},
    "chain_off": {"chain_passes": "off"},
    "eager": {"eager_verify": True},
    "eager_chain_all": {"eager_verify": True, "chain_passes": "all"},
    # round 24: a deterministic draft whose margin (how far, in logits, the fast path's choice was from another
    # token) is under risk_margin ends its window (DVRGenerator(risk_margin=...)); the default never does. "risk_*":
    # such a window is due at once (DefaultScheduler(risky_windows="due"); calls B and D ran these); "ride_*": it
    # joins the next pass formed for other work, first among partial windows (risky_windows="ride")
    "risk_0.06": {"risk_margin": 0.0625, "risky_windows": "due"},
    "risk_0.125": {"risk_margin": 0.125, "risky_windows": "due"},
    "risk_0.25": {"risk_margin": 0.25, "risky_windows": "due"},
    "risk_0.125_all": {"risk_margin": 0.125, "risky_windows": "due", "chain_passes": "all"},
    "ride_0.125": {"risk_margin": 0.125},
    "ride_0.25": {"risk_margin": 0.25},
    # round 25: the canonical pass's kernels confined to a green context of that many SMs (DVRGenerator(canonical_sms=))
    "sms_32": {"canonical_sms": 32},
    "sms_48": {"canonical_sms": 48},
    "sms_64": {"canonical_sms": 64},
    "sms_96": {"canonical_sms": 96},
    # round 42: on an H100, 32 / 48 SMs kept free requests' online ITL within 1.15x of nondet (p50 1.13 / 1.14-1.15)
    # at 0.61 / 0.67 of nondet offline for dvr@50 (the default 0.75-0.77); the budget order (0.845 there) with them
    "order_budget_sms_48": {"scheduler_order": "budget", "canonical_sms": 48},
    "order_budget_sms_32": {"scheduler_order": "budget", "canonical_sms": 32},
    # round 43: only passes of at most that many rows confined (DVRGenerator(canonical_sms_max_rows=)): online the
    # passes are mostly narrow and stay on the green context; an offline backlog fills wide ones, which take every SM
    "sms_32_rows_512": {"canonical_sms": 32, "canonical_sms_max_rows": 512},
    "sms_32_rows_1024": {"canonical_sms": 32, "canonical_sms_max_rows": 1024},
    "sms_48_rows_1024": {"canonical_sms": 48, "canonical_sms_max_rows": 1024},
    "order_budget_sms_32_rows_512": {"scheduler_order": "budget", "canonical_sms": 32, "canonical_sms_max_rows": 512},
    "order_budget_sms_32_rows_1024": {"scheduler_order": "budget", "canonical_sms": 32,
                                      "canonical_sms_max_rows": 1024},
    # round 44: the budget order for the canonical pass's rows only, the fast step's by arrival (a run without
    # deterministic requests is served as by arrival): is the budget order's dvr@50 gain the pass's?
    "order_canonical_budget": {"scheduler_order": "canonical_budget"},
    # after round 44 the default is canonical_budget: the order of rounds 1-43's "default"
    "order_arrival": {"scheduler_order": "arrival"},
    # round 44: with windows closed at a draft under 0.125 logits, riding the next pass (round 24's ride_0.125: a
    # tenth of the recompute offline at the same throughput, never served online): fewer wasted draft rows
    "ride_budget_sms_32_rows_1024": {"risk_margin": 0.125, "scheduler_order": "budget", "canonical_sms": 32,
                                     "canonical_sms_max_rows": 1024},
    # round 45: the default without drafting ahead of a window in a pass (a deterministic request waits, rowless,
    # for its window's verdict): round 45's online gaps tracked the requests decoding per step (110 beside a pass
    # against nondet's 89); does dropping the drafts ahead (24K kept, 8K dropped offline at dvr@50) shorten them?
    "draft_ahead_off": {"draft_ahead": False},
    # round 25: the Triton canonical GEMM with SmolLM2's layer weights on 64 x 64 tiles, 2 programs per SM (the
    # graph sweep's fastest at 256 rows, a quarter of the default tiles' shared memory: does a pass that leaves
    # room on each SM disturb the fast steps less?); the same bits as the tree's pins on the H200 (the sweep)
    # round 25 (not run on the H200 yet): verify-only passes held until their windows fill 512 rows or a due window
    # has waited 8 steps (benchmarks/device/batched_passes.py: against the many-narrow-passes regime)
    "batched": {"scheduler": "batched_512_8"},
    "triton_small": {"canonical_gemm": "triton", "gemm_pins": {
        "960,576": "small", "576,576": "small", "3072,576": "small", "576,1536": "small"}},
    # round 26: the canonical pass's stream at the device's highest priority (DVRGenerator(canonical_priority=
    # "high")), or only the passes that carry deterministic prompts ("prompts"): at dvr@50 the free requests finish
    # ~1 s before the deterministic ones, whose late first tokens (prompts waiting for passes) set the run's end;
    # round 25's green contexts showed that less of the device for the pass made the deterministic requests later
    # and the free ones no sooner
    "canon_priority": {"canonical_priority": "high"},
    "prompt_priority": {"canonical_priority": "prompts"},
    # round 26: DefaultScheduler(order="budget"): the largest output budget left first wherever rows are short (prompt
    # chunks of both kinds, windows): round 25's last finishers were 1,024-token deterministic requests whose prompts
    # got their passes last (index ~990); the run's nondet uses the same order, so the ratio compares like with like
    "order_budget": {"scheduler_order": "budget"},
    "order_budget_prompts": {"scheduler_order": "budget", "canonical_priority": "prompts"},
    "triton_small_priority": {"canonical_gemm": "triton", "canonical_priority": "high", "gemm_pins": {
        "960,576": "small", "576,576": "small", "3072,576": "small", "576,1536": "small"}},
    # round 27: every canonical GEMM as cuBLAS at M = 512 / 1,024 / 2,048 rows (FixedShapePolicy(gemm_rows=N): other
    # committed bits, each N its own config), a wide pass's GEMMs a few large calls instead of one per 256 rows, a
    # narrow pass's padded up to N (its bucket too until round 31; now its GEMMs only): on SmolLM2 one 2,048-row
    # call costs 1.5x one 256-row call, eight cost 6-8x
    # (gemm_rows_256: M = R, the default's M, its blocks written into one output: the default's bits exactly where
    # mm(out=) gives F.linear's, which the contract check below compares)
    "gemm_rows_256": {"canonical_gemm_rows": 256},
    "gemm_rows_512": {"canonical_gemm_rows": 512},
    "gemm_rows_1024": {"canonical_gemm_rows": 1024},
    "gemm_rows_2048": {"canonical_gemm_rows": 2048},
    "gemm_rows_1024_priority": {"canonical_gemm_rows": 1024, "canonical_priority": "high"},
    # round 28: the timed run with the objects built before it frozen out of the cyclic collector's passes
    # (llm42.gc_freeze.frozen_gc, what `llm42 serve` does): on the CPU one full pass over ~181K objects took 75-79 ms
    # at 1,000 running requests, 4.7-6.3 ms frozen (cpu_gc_pauses.py). The same engine and bits: pauses, not tokens
    "gc_freeze": {"gc_freeze": True},
    # round 30: a deterministic request drafts from a fast run of its prompt while its prompt's canonical passes wait
    # (DVRGenerator(prompt_drafts=True)): round 25's dvr@50 ended ~1.1 s after the free requests, its deterministic
    # requests' first tokens at 0.85 s p50 / 2.1 s p90 against 0.27 / 0.53 s for the free ones
    "prompt_drafts": {"prompt_drafts": True},
    "gemm_rows_1024_prompt_drafts": {"canonical_gemm_rows": 1024, "prompt_drafts": True},
    # round 31: gemm_rows_1024 served at 0.62-0.64 of nondet against the default's 0.75-0.76 (an H100, ABBA), its
    # passes computing 2.16x the rows they used (narrow passes rounded up to 1,024 rows) and many more of them (545
    # against 398, 53 deferred against 351). A narrow pass now keeps its bucket (pass_buckets); with this scheduler
    # its verify-only passes also wait for 1,024 rows (or 8 steps), so most GEMM blocks are full
    "gemm_rows_1024_batched": {"canonical_gemm_rows": 1024, "scheduler": "batched_1024_8"},
    # round 32: round 31's default dvr@50 ended on its longest deterministic replies admitted last (1,024 tokens,
    # first token at 2.2 s against 1.45 s in nondet, the free requests done at 5.4 s, these at 6.0 s); longest
    # output first, with their prompts drafted from while their canonical passes wait
    "order_budget_prompt_drafts": {"scheduler_order": "budget", "prompt_drafts": True},
    # round 32: order_budget served SmolLM2's dvr@50 at 0.83-0.88 of nondet (the default 0.65-0.68, one H100), but
    # its runs still ended on 1,024-token replies admitted last (K/V-limited admission, oldest first: first token at
    # 1-2 s); with DefaultScheduler(admission="budget") the largest budget is admitted first too
    "order_budget_admit": {"scheduler_order": "budget", "scheduler_admission": "budget"},
    # admission by budget alone: the best of the four pairs in the CPU step model (cpu_order_admission.py)
    "admit_budget": {"scheduler_admission": "budget"},
    # round 33: admission by budget with a bound on the wait it adds (DefaultScheduler(max_wait_steps=)): offline,
    # where every request is queued at step 0, a bound under the run's length admits the rest in arrival order
    # once it passes; 500 steps is ~1.5 s of SmolLM2's offline run on an H100 (1,031 steps, 64K tok/s)
    "admit_budget_wait_500": {"scheduler_admission": "budget", "scheduler_max_wait_steps": 500},
    # round 34: online, the slowest 1 % of free gaps all spanned a step that applied a pass and launched the next
    # (step() 4.27 ms p50 against 1.46 for plain steps; launch alone 2.89, apply alone 1.86); here a step that
    # applies a pass launches none (DVRGenerator(split_pass_steps=True)), the pass goes out in the next step
    "split_pass_steps": {"split_pass_steps": True},
    "gc_freeze_split": {"gc_freeze": True, "split_pass_steps": True},
    # round 34, call D: plain steps spent 1.2 of 1.7 ms in fast_read (waiting for the device), and the pass was
    # launched after that read: a launching step took 1.1 ms longer. Launched before it, the staging runs under
    # the wait (DVRGenerator(pass_before_read=True))
    "pass_before_read": {"pass_before_read": True},
    "pass_before_read_split": {"pass_before_read": True, "split_pass_steps": True},
    # round 38: a pass finished by the fast step's launch applied before the read, under the device's wait, not after
    # it beside the next pass's launch (DVRGenerator(apply_before_read=True)); and with the launch before the read too
    "apply_before_read": {"apply_before_read": True},
    "apply_before_read_pbr": {"apply_before_read": True, "pass_before_read": True},
    # round 39: apply_before_read became the default; the order before it (every pass applied after the read)
    "apply_after_read": {"apply_before_read": False},
    # round 34: what was left of the online tail after the host work was moved: the fast steps beside a pass. A
    # pass's layers in slices, one a step (DVRGenerator(canonical_slices=N)): each fast step beside a slice of it
    "canonical_slices_2": {"canonical_slices": 2},
    "canonical_slices_4": {"canonical_slices": 4},
    # round 35: the other way to shorten what a fast step shares the device with: passes of R = 256 rows at most
    # (32 x 8, CUDA's default canonical config), no wide ones (the same committed bits: a wide pass's rows get an
    # R-row pass's)
    "narrow_passes": {"max_canonical_tokens": 256},
    # round 48: the fast decode attention's program order (the same bits in any order; KernelSwitches): the grid
    # sequence-major with no order (the tree's default), a sequence's kv heads adjacent, and also the longest
    # contexts first (StepInputs.decode_order)
    "order_seq": {"decode_order": "seq"},
    "order_head": {"decode_order": "head"},
    "order_head_longest": {"decode_order": "head_longest"},
    "admit_budget_order_seq": {"scheduler_admission": "budget", "decode_order": "seq"},
    # round 50: the CUDA sampler on a float32 copy of the logits (as before round 50; the same bits)
    "sampler_unfused": {"fused_sampler": False},
    "admit_budget_sampler_unfused": {"scheduler_admission": "budget", "fused_sampler": False},
    # the Gumbel sweep skipping greedy rows and split over ~1,024 programs (kernels.sampling; the same bits): measured
    # in round 51 and the default since; "gumbel_plain" is the sweep before it (one program per row, every row)
    "gumbel_lean": {"gumbel_programs": 1024, "gumbel_skip_greedy": True},
    "admit_budget_gumbel_lean": {"scheduler_admission": "budget", "gumbel_programs": 1024, "gumbel_skip_greedy": True},
    "gumbel_plain": {"gumbel_programs": 0, "gumbel_skip_greedy": False},
    "admit_budget_gumbel_plain": {"scheduler_admission": "budget", "gumbel_programs": 0, "gumbel_skip_greedy": False},
    # round 52: each decode batch replays the fastest graph of a bucket up to 1.25x its size, timed at capture
    # (DVRGenerator(tune_decode_buckets=True)): cuBLAS's time is not monotone in M (docs/benchmarks.md, round 52)
    "tuned_buckets": {"tune_decode_buckets": True},
    "admit_budget_tuned_buckets": {"scheduler_admission": "budget", "tune_decode_buckets": True},
    # a step's decode rows and prompt chunks as two passes: what round 53's 8B runs did (and very likely earlier
    # ones at 1,024 sequences): their mixed graphs ran out of memory at capture (the top-k / top-p filter's
    # temporaries, chunked since round 53)
    "admit_budget_no_mixed": {"scheduler_admission": "budget", "mixed_steps": False},
    # round 55: the top-k / top-p threshold by the torch ops (a sort, float64 sums over every row of a step with a
    # filtered row), as before round 55, against the threshold's kernel (the default); with --top-p-requests
    "admit_budget_torch_filter": {"scheduler_admission": "budget", "filter_kernel": False},
    "admit_budget_filter_whole": {"scheduler_admission": "budget", "filter_split": 0},
    "admit_budget_no_mixed_torch_filter": {"scheduler_admission": "budget", "mixed_steps": False,
                                           "filter_kernel": False},
    "admit_budget_order_head_longest": {"scheduler_admission": "budget", "decode_order": "head_longest"},
    # round 49: the K/V store at 0.85 of the free memory instead of 0.6 (vLLM takes 0.9 of the card): round 47's
    # profile found the 8B shape's decode batches bound by the store (256-354 rows at 1,024 seats on an H100, where
    # 0.6 holds half the set), its GEMMs at 543-595 TFLOP/s there against 703-706 at wider steps. Measured (round 49,
    # an H100): 9,065 and 9,807 tok/s against 11,076, the same 1,030 steps, each longer
    "admit_budget_kv_0.85": {"scheduler_admission": "budget", "kv_free_fraction": 0.85},
    # round 57: the K/V store at a fixed number of positions, whatever the card's memory (capped at
    # KV_POSITIONS_MAX_FRACTION of the free memory). The default store takes 0.6 of the free memory: 247K positions
    # on an H100 (about half the 8B set reserved whole), more than twice that on an H200, where round 35 measured
    # the 8B shape's steps slower than an H100's (30.5 against 25 ms, the same 1,030 steps) and round 49 a larger
    # store slower on an H100 (11-18 %; its schedule, front-loaded with thin last steps, explains 3-6 % by round 57's
    # admission model; those runs most likely lost graph captures for memory, round 53)
    "admit_budget_kv_250k": {"scheduler_admission": "budget", "kv_positions": 250_000},
    "admit_budget_kv_350k": {"scheduler_admission": "budget", "kv_positions": 350_000},
    # round 57: at most 384 running requests (round 49's pacing model: 288 gave 1.02x on an H100)
    "admit_budget_seqs_384": {"scheduler_admission": "budget", "max_num_seqs": 384},
}
KV_POSITIONS_MAX_FRACTION = 0.85


# a run's share of the budget starts at its first request: building its generator (every graph captured) is not
# in it. Round 14 found that build inside the share (about 20 s of a 25 s share for chunked_det_rows, whose runs
# were cut after 3.7 s of serving; round 12's "start-up" losses were the same): this bounds the build instead
BUILD_ALLOWANCE_S = 120.0


class SegmentTiles:
    """An Engine whose generators' canonical passes stage tile tables or not (``CanonicalPass(segment_tiles=)``,
    read from ``llm42.verify.canonical_pass.SEGMENT_TILES`` when a pass is built; no engine knob of its own)."""

    def __init__(self, engine, on: bool):
        self._engine, self._on = engine, on

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def generator(self, *args, **kwargs):
        from llm42.verify import canonical_pass

        saved, canonical_pass.SEGMENT_TILES = canonical_pass.SEGMENT_TILES, self._on
        try:
            return self._engine.generator(*args, **kwargs)
        finally:
            canonical_pass.SEGMENT_TILES = saved


SMALL_TILES = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=4, PROGRAMS_PER_SM=2,
                   TMA=True)


class KernelSwitches:
    """An Engine whose generators run with a variant's module-level kernel switches (``switches``: knob -> value;
    a knob left out takes the tree's value, as it was when the first variant was wrapped):

    - ``decode_order``: the fast decode attention's program order, a name of ``kernels.attention.DECODE_ORDERS``;
    - ``fused_sampler``: ``llm42.sampler.FUSED_CUDA_SAMPLER``;
    - ``gumbel_programs``: ``kernels.sampling.GUMBEL_TARGET_PROGRAMS`` (0 for one program per row);
    - ``gumbel_skip_greedy``: ``kernels.sampling.GUMBEL_SKIP_GREEDY``;
    - ``filter_kernel``: ``llm42.sampler.FILTER_KERNEL`` (False: the torch ops' top-k / top-p threshold);
    - ``filter_split``: ``kernels.sampling.FILTER_CHUNK_BLOCKS`` (0 for one program per row, round 55's launch).

    Set when a generator is built and kept until the next build sets its own (every variant is wrapped: a run
    builds its generator, captures its graphs, then serves with it)."""

    KNOBS = ("decode_order", "fused_sampler", "gumbel_programs", "gumbel_skip_greedy", "filter_kernel",
             "filter_split")
    _tree = None

    def __init__(self, engine, switches: dict):
        from llm42.kernels import attention

        order = switches.get("decode_order")
        if order is not None and order not in attention.DECODE_ORDERS:
            raise ValueError(f"decode_order must be one of {list(attention.DECODE_ORDERS)}, got {order!r}")
        if KernelSwitches._tree is None:
            KernelSwitches._tree = {name: getattr(module, name) for module, name in self._attributes()}
        self._engine, self._switches = engine, switches

    @staticmethod
    def _attributes():
        from llm42 import sampler
        from llm42.kernels import attention, sampling

        return ((attention, "DECODE_HEAD_MAJOR"), (attention, "DECODE_LONGEST_FIRST"),
                (sampler, "FUSED_CUDA_SAMPLER"), (sampling, "GUMBEL_TARGET_PROGRAMS"),
                (sampling, "GUMBEL_SKIP_GREEDY"), (sampler, "FILTER_KERNEL"), (sampling, "FILTER_CHUNK_BLOCKS"))

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def generator(self, *args, **kwargs):
        from llm42.kernels import attention

        values = dict(KernelSwitches._tree)
        knobs = self._switches
        if knobs.get("decode_order") is not None:
            values["DECODE_HEAD_MAJOR"], values["DECODE_LONGEST_FIRST"] = attention.DECODE_ORDERS[knobs["decode_order"]]
        if knobs.get("fused_sampler") is not None:
            values["FUSED_CUDA_SAMPLER"] = knobs["fused_sampler"]
        if knobs.get("gumbel_programs") is not None:
            values["GUMBEL_TARGET_PROGRAMS"] = knobs["gumbel_programs"] or None
        if knobs.get("gumbel_skip_greedy") is not None:
            values["GUMBEL_SKIP_GREEDY"] = knobs["gumbel_skip_greedy"]
        if knobs.get("filter_kernel") is not None:
            values["FILTER_KERNEL"] = knobs["filter_kernel"]
        if knobs.get("filter_split") is not None:
            values["FILTER_CHUNK_BLOCKS"] = knobs["filter_split"] or None
        for module, name in self._attributes():
            setattr(module, name, values[name])
        return self._engine.generator(*args, **kwargs)


class PinnedTiles:
    """An Engine whose generators run the Triton canonical GEMM with the tree's pins (``_SHAPE_CONFIGS``) plus a
    variant's (``gemm_pins``: "N,K" -> "small" for ``SMALL_TILES`` or a config), set when a generator is built and
    kept until the next variant's build sets its own: a run builds its generator, then serves with it."""

    _tree = None

    def __init__(self, engine, pins: dict):
        self._engine, self._pins = engine, pins

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def generator(self, *args, **kwargs):
        from llm42.kernels import batch_invariant_matmul as bim

        if PinnedTiles._tree is None:
            PinnedTiles._tree = dict(bim._SHAPE_CONFIGS)
        bim._SHAPE_CONFIGS.clear()
        bim._SHAPE_CONFIGS.update(PinnedTiles._tree)
        for key, config in self._pins.items():
            n, k = (int(v) for v in key.split(","))
            bim._SHAPE_CONFIGS[(torch.bfloat16, n, k)] = dict(SMALL_TILES if config == "small" else config)
        return self._engine.generator(*args, **kwargs)


def store_positions(knobs: dict, kv_tokens) -> int | None:
    """The K/V positions a variant's ``kv_free_fraction`` or ``kv_positions`` asks for (None: the default store)."""
    if "kv_free_fraction" not in knobs and "kv_positions" not in knobs:
        return None
    if kv_tokens is None:
        raise ValueError("engine_variant: a kv_free_fraction or kv_positions variant needs kv_tokens")
    if "kv_free_fraction" in knobs:
        return kv_tokens(knobs["kv_free_fraction"])
    return min(knobs["kv_positions"], kv_tokens(KV_POSITIONS_MAX_FRACTION))


def engine_variant(base, knobs: dict, *, kv_tokens=None):
    """``base`` (the benchmarks' Engine) with a variant's knobs; ``fast_decode_kernel`` names the fast path's
    ``FastPolicy(decode_kernel=...)``, ``segment_tiles`` the canonical pass's tile tables (``SegmentTiles``),
    ``KernelSwitches.KNOBS`` module-level kernel switches (the decode order, the sampler's; default the tree's),
    ``kv_free_fraction`` the K/V store's share of the free CUDA memory (``kv_tokens(fraction)`` gives its size;
    default ``serving.KV_FREE_FRACTION``), ``kv_positions`` its size in positions (``store_positions``)."""
    knobs = dict(knobs)
    store = store_positions(knobs, kv_tokens)
    knobs.pop("kv_free_fraction", None)
    knobs.pop("kv_positions", None)
    if store is not None:
        knobs["kv_cache_tokens"] = store
    kernel = knobs.pop("fast_decode_kernel", None)
    tile_m = knobs.get("canonical_tile_m", base.canonical_tile_m)
    chunk = knobs.pop("canonical_key_chunk", None)
    tiles = knobs.pop("segment_tiles", None)
    switches = {name: knobs.pop(name) for name in KernelSwitches.KNOBS if name in knobs}
    if kernel is not None:
        from llm42.policies import FastPolicy

        knobs["fast_policy"] = FastPolicy(decode_kernel=kernel, canonical_key_chunk=chunk, canonical_tile_m=tile_m)
    pins = knobs.pop("gemm_pins", None)
    scheduler = knobs.pop("scheduler", None)
    if scheduler is not None:  # "batched_<min_rows>_<max_wait>"
        from batched_passes import batched

        _, min_rows, max_wait = scheduler.split("_")
        knobs["scheduler_class"] = batched(int(min_rows), int(max_wait))
    engine = dataclasses.replace(base, **knobs)
    if engine.canonical_gemm == "triton":  # every Triton variant sets its pins (the tree's, or the tree's + its own)
        engine = PinnedTiles(engine, pins or {})
    return KernelSwitches(engine if tiles is None else SegmentTiles(engine, tiles), switches)


def token_digest(token_ids) -> str:
    return hashlib.sha256(json.dumps(list(token_ids)).encode()).hexdigest()[:16]


def compare_digests(first: Path, second: Path) -> dict:
    """Per (variant, mode) present in both runs' JSON: deterministic requests finished in both, and how many have
    the same digest (two processes, one canonical config: all of them, by the contract)."""
    a, b = (json.loads(Path(p).read_text())["runs"] for p in (first, second))
    out = {}
    for variant in sorted(set(a) & set(b)):
        for mode in sorted(set(a[variant]) & set(b[variant])):
            da = a[variant][mode].get("deterministic_digests")
            db = b[variant][mode].get("deterministic_digests")
            if da is None or db is None:
                continue
            common = set(da) & set(db)
            out[f"{variant}_{mode}"] = {"num_checked": len(common),
                                        "num_identical": sum(da[i] == db[i] for i in common)}
    return out


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "max": None, "n": 0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "max": ordered[-1], "n": len(ordered)}


def tail_summary(result, workload, *, num_last: int = 12) -> dict:
    """Where a run's length comes from: first-token and per-token times of free and deterministic requests
    apart, the last requests to finish, and the run's length had every deterministic request decoded at the
    free requests' median time per token from its own first token (what verification added to the tail)."""
    done = [r for r in result.records if r.finish_s is not None and r.first_token_s is not None]
    out: dict = {}
    per_token = {}
    for kind, is_det in (("free", False), ("deterministic", True)):
        recs = [r for r in done if r.is_deterministic == is_det]
        rates = [(r.finish_s - r.first_token_s) / (r.num_tokens - 1) for r in recs if r.num_tokens > 1]
        per_token[kind] = _percentiles(rates)
        out[kind] = {"ttft_s": _percentiles([r.first_token_s for r in recs]), "s_per_token": per_token[kind],
                     "last_finish_s": max((r.finish_s for r in recs), default=None),
                     "rollbacks": _percentiles([float(r.num_rollbacks) for r in recs])}
    free_rate = per_token["free"]["p50"]
    if free_rate is not None:
        out["finish_s_if_det_decoded_at_free_rate"] = max(
            (r.first_token_s + (r.num_tokens - 1) * free_rate if r.is_deterministic else r.finish_s) for r in done)
    last = sorted(done, key=lambda r: r.finish_s)[-num_last:]
    out["last_finishers"] = [
        {"index": r.index, "deterministic": r.is_deterministic, "prompt_tokens": len(workload.requests[r.index].prompt),
         "output_tokens": r.num_tokens, "ttft_s": round(r.first_token_s, 4), "finish_s": round(r.finish_s, 4),
         "rollbacks": r.num_rollbacks} for r in reversed(last)]
    out["elapsed_s"] = result.elapsed_s
    return out


def add_setup_arguments(p: argparse.ArgumentParser) -> None:
    """The model, request-set and warm-up options ``setup`` and ``warm_up`` read (dvr_ab.py, dvr_timeline.py)."""
    p.add_argument("--model", default=None, help="8b, tiny, a checkpoint directory or a GGUF file")
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--max-num-seqs", type=int, default=1024)
    p.add_argument("--max-fast-tokens", type=int, default=2048)
    p.add_argument("--budget-s", type=float, default=400.0)
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--lm-head-std", type=float, default=None)
    p.add_argument("--lm-head-bias-scale", type=float, default=None)
    p.add_argument("--warmup-requests", type=int, default=16, help="untimed warm-up requests per variant and mode")
    p.add_argument("--warmup-s", type=float, default=60.0, help="deadline of each warm-up run")
    p.add_argument("--top-p-requests", type=int, default=0,
                   help="this many sampled requests (a seeded choice) ask for --top-p (round 55: the threshold kernel)")
    p.add_argument("--top-p", type=float, default=0.9)


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def setup(args, variants: list[str]):
    """(config, model, workload, det_order, engines by variant) for ``args`` (``add_setup_arguments``'s options)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = ServingConfig(device=device.type, model=args.model, dtype=torch.bfloat16 if device.type == "cuda"
                           else torch.float32, budget_s=args.budget_s, window=32, group=8,
                           max_num_seqs=args.max_num_seqs, max_fast_tokens=args.max_fast_tokens,
                           num_requests=args.num_requests, lm_head_std=args.lm_head_std, hf_compare=False)
    name = prepare_checkpoint(config.model, args.cache_dir)
    model = build_model(name, device=device, dtype=config.dtype, max_positions=_max_positions(config),
                        seed=config.seed, lm_head_std=config.lm_head_std, with_tokenizer=True)
    if args.lm_head_bias_scale is not None:
        std = config.lm_head_std if config.lm_head_std is not None else 0.02
        model = with_head(model, HeadBasis.draw(model.cfg, device, std=std, seed=config.seed),
                          args.lm_head_bias_scale)
    workload = build_workload(model, config, config.num_requests)
    if getattr(args, "top_p_requests", 0):
        workload = workload.with_top_p(args.top_p_requests, args.top_p, seed=config.seed)
    det_order = deterministic_order(workload.num_requests, seed=config.seed)
    base = _engine(model, config, workload)

    def kv_tokens(fraction: float) -> int:
        return kv_tokens_for(model, workload, config.max_num_seqs, free_fraction=fraction)

    engines = {v: engine_variant(base, VARIANTS[v], kv_tokens=kv_tokens) for v in variants}
    for v in variants:
        store = store_positions(VARIANTS[v], kv_tokens) or base.kv_cache_tokens
        seats = VARIANTS[v].get("max_num_seqs", base.max_num_seqs)
        print(f"[dvr_ab] {v}: K/V store {store:,} positions, {seats} seats", flush=True)
    return config, model, workload, det_order, engines


def warm_up(args, engines: dict, workload, config, *, warm_modes: str, tag: str = "dvr_ab") -> None:
    """Untimed: each variant's kernels compile (Triton JIT, cuBLAS handles) on a few requests of every mode before
    any timed run, so the first run of the process (or of a variant with its own kernels) does not spend its budget
    share on start-up (rounds 8 and 12 lost runs to it)."""
    warm = workload.head(args.warmup_requests)
    warm_order = deterministic_order(warm.num_requests, seed=config.seed)
    for v in engines if args.warmup_requests > 0 else []:
        for mode_name in (m for m in warm_modes.split(",") if m):
            t0 = time.perf_counter()
            run_offline(engines[v], warm, mode_by_name(mode_name), det_order=warm_order,
                        deadline=time.perf_counter() + args.warmup_s + BUILD_ALLOWANCE_S, budget_s=args.warmup_s)
            print(f"[{tag}] warm-up {v} {mode_name}: {time.perf_counter() - t0:.1f} s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_setup_arguments(p)
    p.add_argument("--out")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A_JSON", "B_JSON"),
                   help="only compare two runs' deterministic digests (printed as JSON, and written to --out if given)")
    p.add_argument("--modes", default="nondet,dvr@10,dvr@50")
    p.add_argument("--variants", default="default,wide_verify,round7")
    p.add_argument("--online-load", type=float, default=None)
    p.add_argument("--online-modes", default="nondet,dvr@50")
    p.add_argument("--online-requests", type=int, default=500)
    p.add_argument("--online-budget-s", type=float, default=120.0)
    p.add_argument("--online-repeats", type=int, default=1,
                   help="serve each variant's online modes this many times to the same arrivals, the variants in "
                        "turn (ABBA...): online ratios moved by 0.3x between two runs of one config in round 34")
    p.add_argument("--online-variants", default=None, help="the variants served online (default: --variants)")
    p.add_argument("--warmup-modes", default=None,
                   help="the modes each variant warms up on (default: --modes; a dvr mode runs every kernel)")
    p.add_argument("--repeats", type=int, default=1,
                   help="offline runs of every (variant, mode), the variants' order reversed on every other repeat "
                   "(ABBA); runs[...] keeps the first, repeats[...] every one, repeat_summary the medians")
    p.add_argument("--profile-mode", default=None)
    p.add_argument("--profile-budget-s", type=float, default=60.0)
    p.add_argument("--keep-going-when-cut", action="store_true",
                   help="go on when the first timed run is cut by its share of --budget-s (by default the script "
                        "stops there: every later run would be cut too, and the device time with it)")
    args = p.parse_args()
    if args.compare:
        checks = compare_digests(*args.compare)
        print(json.dumps(checks), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(checks, indent=1) + "\n")
        return
    if not args.model or not args.out:
        p.error("--model and --out are required (unless --compare)")
    modes = [m for m in args.modes.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    if "nondet" not in modes:
        raise SystemExit("--modes must include nondet (the ratios' reference)")
    config, model, workload, det_order, engines = setup(args, variants)
    warm_up(args, engines, workload, config, warm_modes=args.warmup_modes or args.modes)
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    share = args.budget_s / (len(modes) * len(variants) * args.repeats)
    probe = host_probe()  # the host's speed (round 39: a slower host, a higher online ratio)
    print(f"[dvr_ab] host probe {probe}", flush=True)
    out: dict = {"model": model.summary(), "device": device_name(), "host_probe": probe,
                 "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()},
                 "workload": workload.summary(), "variants": {v: VARIANTS[v] for v in variants},
                 "kv_cache_tokens": {v: engines[v].kv_cache_tokens for v in variants}, "runs": {}}
    results: dict[str, dict] = {v: {} for v in variants}  # the first repeat's
    for rep in range(args.repeats):
        order = variants if rep % 2 == 0 else variants[::-1]
        rep_results: dict[str, dict] = {v: {} for v in variants}
        for mode_name in modes:
            for position, v in enumerate(order):
                print(f"[dvr_ab] {v} {mode_name}" + (f" (repeat {rep + 1})" if args.repeats > 1 else ""), flush=True)
                result = run_offline(engines[v], workload, mode_by_name(mode_name), det_order=det_order,
                                     deadline=time.perf_counter() + share + BUILD_ALLOWANCE_S, budget_s=share)
                rep_results[v][mode_name] = result
                for note in result.notes:
                    print(f"[dvr_ab]   note: {note}", flush=True)
                if rep == 0:
                    results[v][mode_name] = result
                    _record_run(out, v, mode_name, result, rep_results[v].get("nondet"), workload)
                _record_repeat(out, v, mode_name, result, rep_results[v].get("nondet"), workload, rep, position)
                Path(args.out).write_text(json.dumps(out, indent=1))
                if not result.is_complete and len(out["runs"]) == 1 and len(out["runs"][v]) == 1 and (
                        not args.keep_going_when_cut):
                    # round 33 spent ~800 s of device time on 8B runs all cut by a share sized too small
                    done = sum(rec.is_finished for rec in result.records)
                    out["stopped"] = {"reason": "the first timed run was cut by its share of --budget-s",
                                      "share_s": share, "requests_finished": done,
                                      "requests": workload.num_requests}
                    Path(args.out).write_text(json.dumps(out, indent=1))
                    print(f"[dvr_ab] STOP: the first run ({v} {mode_name}) was cut by its {share:.1f} s share of "
                          f"--budget-s ({done} of {workload.num_requests} requests finished): every later run "
                          f"would be cut too. Raise --budget-s, or run fewer variants / modes / repeats "
                          f"(--keep-going-when-cut goes on anyway)", flush=True)
                    return
        if rep:  # the contract across repeats: a variant commits its first repeat's deterministic outputs
            for v in variants:
                for mode_name in (m for m in modes if m.startswith("dvr@")):
                    out.setdefault("repeats_identical", {})[f"{v}_{mode_name}_repeat{rep + 1}"] = _same_outputs(
                        results[v][mode_name], rep_results[v][mode_name])
    if args.repeats > 1:
        out["repeat_summary"] = _repeat_summary(out["repeats"])
        for v, by_mode in out["repeat_summary"].items():
            for mode_name, row in by_mode.items():
                print(f"[dvr_ab] {v} {mode_name}: ratio median {row['ratio_median']}  (min {row['ratio_min']}, max "
                      f"{row['ratio_max']}, n {row['n']}, cut {row['n_cut']})  tok/s median {row['tok_s_median']}",
                      flush=True)
        print(json.dumps(out.get("repeats_identical", {})), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    first = variants[0]
    checks = {}
    for mode_name in modes:
        if not mode_name.startswith("dvr@"):
            continue
        # a variant's deterministic outputs equal those of the first variant with the same canonical config (the
        # contract); another canonical attention commits other bits, so it is compared within its own kind only
        def canonical(variant):
            knobs = VARIANTS[variant]
            window, group = knobs.get("window", 32), knobs.get("group", 8)
            gemm_rows = knobs.get("canonical_gemm_rows")  # M = R is the default's M: compared with it
            return (knobs.get("canonical_attention", "tiled"), knobs.get("canonical_gemm", "cublas"),
                    None if gemm_rows == window * group else gemm_rows, window, group)

        for v in variants:
            ref_variant = next(u for u in variants if canonical(u) == canonical(v))
            if ref_variant == v:
                continue
            checks[f"{v}_vs_{ref_variant}_{mode_name}"] = _same_outputs(results[ref_variant][mode_name],
                                                                         results[v][mode_name])
    out["deterministic_outputs_identical"] = checks
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(checks), flush=True)
    _online_and_profile(args, out, engines, workload, results[first], det_order, config)


def _finished_outputs(result) -> dict:
    """Deterministic requests a run finished (a run cut by its deadline leaves some half done, never compared):
    index -> tokens."""
    return {rec.index: rec.token_ids for rec in result.records if rec.is_deterministic and rec.finish_s is not None}


def _same_outputs(a, b) -> dict:
    ref, got = _finished_outputs(a), _finished_outputs(b)
    common = set(ref) & set(got)
    return {"num_checked": len(common), "num_identical": sum(ref[i] == got[i] for i in common)}


def _record_repeat(out: dict, v: str, mode_name: str, result, nondet, workload, rep: int, position: int) -> None:
    """One repeat's figures (``repeats[v][mode]``): the ratio against the same repeat's nondet of ``v``."""
    summary = serving_summary(result, nondet=nondet)
    tail = tail_summary(result, workload)
    out.setdefault("repeats", {}).setdefault(v, {}).setdefault(mode_name, []).append({
        "repeat": rep + 1, "position_in_mode": position, "is_complete": result.is_complete,
        "output_tokens_per_s": summary["output_tokens_per_s"], "ratio_to_nondet": summary["ratio_to_nondet"],
        "steps": result.stats.get("steps"), "ms_per_step": summary["engine"].get("ms_per_step"),
        "canonical_passes": result.stats.get("canonical_passes"), "prompt_passes": result.stats.get("prompt_passes"),
        "deferred_passes": result.stats.get("deferred_passes"),
        "free_last_finish_s": tail["free"]["last_finish_s"],
        "deterministic_last_finish_s": tail["deterministic"]["last_finish_s"], "elapsed_s": result.elapsed_s,
        "notes": list(result.notes)})


def _repeat_summary(repeats: dict) -> dict:
    """Per (variant, mode): the median, least and largest ratio to nondet and the median tok/s over complete repeats."""
    import statistics

    summary: dict = {}
    for v, by_mode in repeats.items():
        for mode_name, rows in by_mode.items():
            done = [r for r in rows if r["is_complete"]]
            ratios = [r["ratio_to_nondet"] for r in done if r["ratio_to_nondet"] is not None]
            summary.setdefault(v, {})[mode_name] = {
                "n": len(ratios), "n_cut": len(rows) - len(done),  # a run cut by its budget is no figure
                "ratio_median": round(statistics.median(ratios), 4) if ratios else None,
                "ratio_min": round(min(ratios), 4) if ratios else None,
                "ratio_max": round(max(ratios), 4) if ratios else None,
                "tok_s_median": statistics.median(r["output_tokens_per_s"] for r in done) if done else None}
    return summary


def _record_run(out: dict, v: str, mode_name: str, result, nondet, workload) -> None:
    """The first repeat's full record of one run (``runs[v][mode]``), printed as it lands."""
    summary = serving_summary(result, nondet=nondet)
    stats = result.stats
    r = out["runs"].setdefault(v, {})[mode_name] = {
        "is_complete": result.is_complete,
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "ratio_to_nondet": summary["ratio_to_nondet"],
        "steps": stats.get("steps"), "ms_per_step": summary["engine"].get("ms_per_step"),
        "fast_steps": stats.get("fast_steps"), "mixed_steps": stats.get("mixed_steps"),
        "filtered_steps": stats.get("filtered_steps"),
        "canonical_passes": stats.get("canonical_passes"), "prompt_passes": stats.get("prompt_passes"),
        "canonical_rows": stats.get("canonical_rows"),
        "canonical_rows_used": stats.get("canonical_rows_used"),
        "rollbacks_per_deterministic_request": summary["rollbacks_per_deterministic_request"],
        "recompute_share_deterministic": summary["recompute_share_deterministic"],
        "ahead_tokens_kept": stats.get("ahead_tokens_kept"),
        "ahead_tokens_dropped": stats.get("ahead_tokens_dropped"),
        "deferred_passes": stats.get("deferred_passes"),
        "risky_drafts": stats.get("risky_drafts"), "risky_rollbacks": stats.get("risky_rollbacks"),
        "rollbacks": stats.get("rollbacks"),
        "margins": {k: stats.get(k) for k in MARGIN_STATS},
        "free_itl_s": summary["latency_nondeterministic"]["itl_s"],
        "deterministic_tpot_s": summary["latency_deterministic"]["tpot_s"],
        "e2e_s_p99": summary["latency"]["e2e_s"]["p99"],
        "tail": tail_summary(result, workload),
        "notes": list(result.notes),  # e.g. tune_decode_buckets's map
    }
    if mode_name.startswith("dvr@"):
        r["deterministic_digests"] = {str(rec.index): token_digest(rec.token_ids) for rec in result.records
                                      if rec.is_deterministic and rec.finish_s is not None}
    print(f"[dvr_ab]   {r['output_tokens_per_s']:,.0f} tok/s  x{r['ratio_to_nondet'] or 0:.3f}  "
          f"steps {r['steps']}  passes {r['canonical_passes']} ({r['prompt_passes']} with prompts)  "
          f"rollbacks {r['rollbacks']} "
          f"(risky drafts {r['risky_drafts']}, at one {r['risky_rollbacks']})  complete {r['is_complete']}",
          flush=True)


def _online_and_profile(args, out: dict, engines: dict, workload, first_results: dict, det_order: list[int],
                        config) -> None:
    """The online phase (``--online-load``: capacity from the first variant's offline nondet) and the host profile
    (``--profile-mode``), each written to ``--out`` as it lands."""
    if args.online_load is not None:
        capacity = workload.num_requests / first_results["nondet"].elapsed_s
        served = [v for v in (args.online_variants or args.variants).split(",") if v]
        unknown = sorted(set(served) - set(engines))
        if unknown:
            raise SystemExit(f"--online-variants {unknown} are not among --variants")
        online_set = workload.head(min(args.online_requests, workload.num_requests))

        def save(got: dict, *, is_partial: bool) -> None:  # round 42: a call's cap cut two runs' records here
            out["online"] = dict(got, load=args.online_load, capacity_rps=capacity, is_partial=is_partial)
            Path(args.out).write_text(json.dumps(out, indent=1))

        got = online_runs({v: engines[v] for v in served}, online_set,
                          [m for m in args.online_modes.split(",") if m], det_order=det_order,
                          rate=args.online_load * capacity, budget_s=args.online_budget_s,
                          seed=config.seed, repeats=args.online_repeats,
                          on_entry=lambda partial: save(partial, is_partial=True))
        save(got, is_partial=False)
    if args.profile_mode:
        share = args.profile_budget_s / len(engines)
        out["host_profile"] = {v: host_profile(engine, workload, mode_by_name(args.profile_mode),
                                               det_order=det_order, budget_s=share) for v, engine in engines.items()}
        out["host_profile"]["mode"] = args.profile_mode
        Path(args.out).write_text(json.dumps(out, indent=1))


def online_runs(engines: dict, workload, modes: list[str], *, det_order: list[int], rate: float, budget_s: float,
                seed: int, repeats: int = 1, on_entry=None) -> dict:
    """Each variant serves ``modes`` to the same Poisson arrivals at ``rate``, ``repeats`` times (the variants in
    ABBA order); ITL/TTFT percentiles and each free ITL percentile over the same variant's online nondet of the same
    repeat. ``runs``: the first repeat's entries; ``repeats``: every repeat's; ``median_free_itl_over_nondet``: per
    variant and mode, the median over the repeats of each ratio. ``on_entry(got)``: called after every run with what
    has landed so far (no medians yet), so a run cut short by a device call's cap loses only itself."""
    if repeats < 1:
        raise SystemExit(f"--online-repeats must be >= 1, got {repeats}")
    arrivals = poisson_arrivals(workload.num_requests, rate, seed=seed)
    share = budget_s / (len(modes) * len(engines) * repeats)
    got: dict = {"rate_rps": rate, "num_requests": workload.num_requests, "runs": {}, "repeats": {}}
    names = list(engines)
    for r in range(repeats):
        for v in (names if r % 2 == 0 else names[::-1]):
            base = None
            for name in modes:
                print(f"[dvr_ab] online {v} {name}" + (f" (repeat {r + 1})" if repeats > 1 else ""), flush=True)
                entry = _online_entry(engines[v], workload, name, arrivals, det_order=det_order, share=share)
                if name == "nondet":
                    base = entry
                elif base is not None:
                    # round 37: tokens handed over before the canonical phase (step's deliver) and, from the same
                    # runs, as a caller taking them only when step() returns saw them (the clock before round 37)
                    for key, itl in (("free_itl_over_nondet", "free_itl_s"),
                                     ("free_itl_at_return_over_nondet", "free_itl_at_return_s")):
                        entry[key] = {q: (entry[itl][q] / base[itl][q]) if entry[itl].get(q) and base[itl].get(q)
                                      else None for q in ("p50", "p90", "p99")}
                if r == 0:
                    got["runs"].setdefault(v, {})[name] = entry
                got["repeats"].setdefault(v, {}).setdefault(name, []).append(entry)
                _print_online(entry)
                if on_entry is not None:
                    on_entry(got)
    for key in ("free_itl_over_nondet", "free_itl_at_return_over_nondet"):
        got[f"median_{key}"] = {
            v: {name: {q: statistics.median(e[key][q] for e in entries)
                       for q in ("p50", "p90", "p99")
                       if all((e.get(key) or {}).get(q) for e in entries)}
                for name, entries in by_mode.items() if name != "nondet"}
            for v, by_mode in got["repeats"].items()}
        if repeats > 1:
            print(f"[dvr_ab] online median {key.replace('_', ' ')}: {got[f'median_{key}']}", flush=True)
    return got


def _online_entry(engine, workload, name: str, arrivals: list[float], *, det_order: list[int], share: float) -> dict:
    """One online run of mode ``name``: its latencies, passes and free gaps (``free_gap_attribution``)."""
    result = run_online(engine, workload, mode_by_name(name), arrivals, det_order=det_order,
                        deadline=time.perf_counter() + share + BUILD_ALLOWANCE_S, budget_s=share)
    summary = serving_summary(result, nondet=None)
    free = summary["latency_nondeterministic"]
    return {"is_complete": result.is_complete, "output_tokens_per_s": summary["output_tokens_per_s"],
            "free_itl_s": free["itl_s"], "free_itl_at_return_s": free["itl_at_return_s"],
            "free_ttft_s": free["ttft_s"],
            "deterministic_itl_s": summary["latency_deterministic"]["itl_s"],
            "deterministic_ttft_s": summary["latency_deterministic"]["ttft_s"],
            "canonical_passes": result.stats.get("canonical_passes"),
            "prompt_passes": result.stats.get("prompt_passes"),  # round 40: passes carrying a prompt chunk
            # round 33: which free gaps a pass's launch or commits fall in (the ITL target's p99 was 2.1x)
            "free_gaps": free_gap_attribution(result)}


def _print_online(entry: dict) -> None:
    itl = entry["free_itl_s"]
    at_return = entry["free_itl_at_return_s"]
    print(f"[dvr_ab]   free ITL p50 {itl.get('p50')}  p99 {itl.get('p99')}  "
          f"{entry.get('free_itl_over_nondet')}  complete {entry['is_complete']}", flush=True)
    print(f"[dvr_ab]   free ITL at step return p50 {at_return.get('p50')}  p99 {at_return.get('p99')}  "
          f"{entry.get('free_itl_at_return_over_nondet')}", flush=True)
    det_itl, det_ttft, free_ttft = (entry[k] or {} for k in ("deterministic_itl_s", "deterministic_ttft_s",
                                                            "free_ttft_s"))
    print(f"[dvr_ab]   deterministic ITL p50 {det_itl.get('p50')}  p99 {det_itl.get('p99')}  TTFT p50 "
          f"{det_ttft.get('p50')}  p99 {det_ttft.get('p99')}; free TTFT p50 {free_ttft.get('p50')}  p99 "
          f"{free_ttft.get('p99')}; passes {entry['canonical_passes']} ({entry['prompt_passes']} with prompts)",
          flush=True)
    gaps = entry["free_gaps"]
    print(f"[dvr_ab]   free gaps by kind {({k: g['share'] for k, g in gaps['gaps'].items()})}; "
          f"slowest 1 % {gaps['slowest_1pct_share']}; collector {gaps['gc']}", flush=True)
    beside = gaps.get("beside")
    if beside is not None:  # round 36: by the widest pass the gap's fast steps could have run beside
        classes = {k: (g["share"], g["p50_ms"], g["p99_ms"]) for k, g in beside["gaps"].items()}
        print(f"[dvr_ab]   free gaps beside passes (share, p50, p99 ms) {classes}; slowest 1 % "
              f"{beside['slowest_1pct_share']}", flush=True)
    running = gaps.get("running")
    if running is not None:  # round 44: beside a pass still running from an earlier step, and the fast rows
        classes = {k: (g["share"], g["p50_ms"], g["p99_ms"], g["mean_fast_tokens"])
                   for k, g in running["gaps"].items()}
        print(f"[dvr_ab]   free gaps by a pass running (share, p50, p99 ms, fast tokens) {classes}; slowest 1 % "
              f"{running['slowest_1pct_share']}; fast tokens {gaps['fast_tokens']}", flush=True)
    for key, what in (("running_by_rows", "a pass running"), ("beside_by_rows", "the widest pass beside")):
        by_rows = gaps.get(key)
        if by_rows is not None:  # round 45: the same classes at equal fast tokens (share, p50 ms per bin)
            classes = {k: {b: (round(g["share"], 3), g["p50_ms"]) for b, g in bins.items()}
                       for k, bins in by_rows.items()}
            print(f"[dvr_ab]   free gaps by {what} and fast tokens (share, p50 ms) {classes}", flush=True)
    equal_rows = gaps.get("running_at_equal_rows")
    if equal_rows is not None:  # round 46: a pass running over none at equal fast tokens, per bin and weighted
        print(f"[dvr_ab]   free gaps with a pass running over none at equal fast tokens {equal_rows}", flush=True)
    for kind, step in gaps["steps"].items():
        if step["count"]:
            print(f"[dvr_ab]   {kind} steps: {step['count']}, mean {step['mean_ms']} ms; phases "
                  f"{step['phases_mean_ms']}; order {step.get('phase_order')}", flush=True)


# the functions whose callees ``host_profile`` lists (pstats regexes): where a step's and a pass's host time goes
PROFILE_CALLEES = (r"generator.py:\d+\(_step\)", r"engine/passes.py:\d+\(launch\)", r"verifier.py:\d+\(launch\)",
                   r"canonical_pass.py:\d+\(launch\)", r"canonical_pass.py:\d+\(stage\)",
                   r"fast_step.py:\d+\(launch\)", r"fast_step.py:\d+\(_launch_decode\)",
                   r"fast_step.py:\d+\(read\)", r"requests.py:\d+\(views\)",
                   r"engine/passes.py:\d+\(_apply_commits\)", r"engine/passes.py:\d+\(apply_oldest\)")


def host_profile(engine, workload, mode, *, det_order: list[int], budget_s: float, top: int = 90) -> dict:
    """One run of ``mode`` under cProfile: the host's time by function, and the callees of ``PROFILE_CALLEES``.

    The profiler is on for the whole run (submission included, a small share): enabled and disabled around each
    step instead (round 39) it overstated cumulative times (the children of ``_step`` summed to 1.7x its own)."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        result = run_offline(engine, workload, mode, det_order=det_order, deadline=time.perf_counter() + budget_s)
    finally:
        profiler.disable()
    report = {"is_complete": result.is_complete, "steps": result.stats.get("steps"),
              "elapsed_s": result.elapsed_s, "output_tokens_per_s": result.tokens_per_s}
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(top)
        report[f"by_{key}"] = text.getvalue().splitlines()
    callees = {}
    for pattern in PROFILE_CALLEES:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_callees(pattern)
        callees[pattern] = text.getvalue().splitlines()
    report["callees"] = callees
    return report

if __name__ == "__main__":
    main()
