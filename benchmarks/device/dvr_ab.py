"""DVR's engine variants side by side in one process: the same offline requests, nondet and dvr@p, per variant.

    PYTHONPATH=src python3 benchmarks/device/dvr_ab.py --model PATH_OR_8B --out ab.json [--modes nondet,dvr@10,dvr@50]
        [--variants default,wide_verify,round7] [--num-requests 1000] [--max-num-seqs 1024] [--budget-s 400]

Variants (``DVRGenerator`` knobs): ``default`` (the engine's defaults: on CUDA since round 9 drafting ahead, wide
verify passes, each pass on its own stream), ``round8`` (round 8's default: drafting ahead, narrow passes on the
caller's stream), ``wide_verify`` (that with wide verify passes), ``no_draft_ahead`` (round 8's without drafting
ahead), ``round7`` (neither), ``side_stream`` (drafting ahead, narrow passes on their own stream),
``side_stream_wide`` (drafting ahead, wide passes on their own stream). Round 9's call B ran ``default`` when it was
round 8's; round 8's runs named drafting ahead + wide verify ``new`` and drafting ahead alone ``no_wide_verify``.
The model is loaded once (``llm42.bench.serving``'s loaders; SmolLM2's chat prompts when it has a tokenizer);
each variant builds its generators through the benchmarks' ``Engine`` (every graph captured before timing) and
runs every mode on the same request set through ``run_offline``. Variants run in turn, mode by mode
(nondet of variant 1, of variant 2, ..., then dvr@10 of each, ...), so drift on the machine spreads over all.
Each run gets an equal share of ``--budget-s`` as its deadline; a run cut by it says so (``is_complete``).
Reported per run: output tok/s and its ratio to the same variant's nondet, engine steps, ms per step,
canonical passes and rows, rollbacks and recompute of deterministic requests, drafts ahead kept/dropped; and
whether each variant's deterministic outputs equal the first variant's (they must: the contract).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench.models import build_model  # noqa: E402
from llm42.bench.modes import deterministic_order, mode_by_name  # noqa: E402
from llm42.bench.runner import run_offline  # noqa: E402
from llm42.bench.serving import (  # noqa: E402
    ServingConfig, _engine, _max_positions, build_workload, prepare_checkpoint, serving_summary,
)

VARIANTS = {
    "default": {},
    "round8": {"canonical_stream": False, "wide_verify": False},
    "wide_verify": {"canonical_stream": False, "wide_verify": True},
    "no_draft_ahead": {"canonical_stream": False, "wide_verify": False, "draft_ahead": False},
    "round7": {"canonical_stream": False, "wide_verify": False, "draft_ahead": False},
    "side_stream": {"canonical_stream": True, "wide_verify": False},
    "side_stream_wide": {"canonical_stream": True, "wide_verify": True},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a checkpoint (GGUF file or directory) or 8b")
    p.add_argument("--out", required=True)
    p.add_argument("--modes", default="nondet,dvr@10,dvr@50")
    p.add_argument("--variants", default="default,wide_verify,round7")
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--max-num-seqs", type=int, default=1024)
    p.add_argument("--max-fast-tokens", type=int, default=2048)
    p.add_argument("--budget-s", type=float, default=400.0)
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--lm-head-std", type=float, default=None)
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    if "nondet" not in modes:
        raise SystemExit("--modes must include nondet (the ratios' reference)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = ServingConfig(device=device.type, model=args.model, dtype=torch.bfloat16 if device.type == "cuda"
                           else torch.float32, budget_s=args.budget_s, window=32, group=8,
                           max_num_seqs=args.max_num_seqs, max_fast_tokens=args.max_fast_tokens,
                           num_requests=args.num_requests, lm_head_std=args.lm_head_std, hf_compare=False)
    name = prepare_checkpoint(config.model, args.cache_dir)
    model = build_model(name, device=device, dtype=config.dtype, max_positions=_max_positions(config),
                        seed=config.seed, lm_head_std=config.lm_head_std, with_tokenizer=True)
    workload = build_workload(model, config, config.num_requests)
    det_order = deterministic_order(workload.num_requests, seed=config.seed)
    base = _engine(model, config, workload)
    engines = {v: dataclasses.replace(base, **VARIANTS[v]) for v in variants}
    share = args.budget_s / (len(modes) * len(variants))
    out: dict = {"model": model.summary(), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                 "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()},
                 "workload": workload.summary(), "variants": {v: VARIANTS[v] for v in variants}, "runs": {}}
    results: dict[str, dict] = {v: {} for v in variants}
    for mode_name in modes:
        for v in variants:
            print(f"[dvr_ab] {v} {mode_name}", flush=True)
            result = run_offline(engines[v], workload, mode_by_name(mode_name), det_order=det_order,
                                 deadline=time.perf_counter() + share)
            results[v][mode_name] = result
            summary = serving_summary(result, nondet=results[v].get("nondet"))
            stats = result.stats
            out["runs"].setdefault(v, {})[mode_name] = {
                "is_complete": result.is_complete,
                "output_tokens_per_s": summary["output_tokens_per_s"],
                "ratio_to_nondet": summary["ratio_to_nondet"],
                "steps": stats.get("steps"), "ms_per_step": summary["engine"].get("ms_per_step"),
                "canonical_passes": stats.get("canonical_passes"), "canonical_rows": stats.get("canonical_rows"),
                "canonical_rows_used": stats.get("canonical_rows_used"),
                "rollbacks_per_deterministic_request": summary["rollbacks_per_deterministic_request"],
                "recompute_share_deterministic": summary["recompute_share_deterministic"],
                "ahead_tokens_kept": stats.get("ahead_tokens_kept"),
                "ahead_tokens_dropped": stats.get("ahead_tokens_dropped"),
                "deferred_passes": stats.get("deferred_passes"),
                "free_itl_s": summary["latency_nondeterministic"]["itl_s"],
                "deterministic_tpot_s": summary["latency_deterministic"]["tpot_s"],
                "e2e_s_p99": summary["latency"]["e2e_s"]["p99"],
            }
            r = out["runs"][v][mode_name]
            print(f"[dvr_ab]   {r['output_tokens_per_s']:,.0f} tok/s  x{r['ratio_to_nondet'] or 0:.3f}  "
                  f"steps {r['steps']}  passes {r['canonical_passes']}  complete {r['is_complete']}", flush=True)
            Path(args.out).write_text(json.dumps(out, indent=1))
    first = variants[0]
    checks = {}
    for mode_name in modes:
        if not mode_name.startswith("dvr@"):
            continue
        def finished(variant):  # a run cut by its deadline leaves requests half done: those are not compared
            return {rec.index: rec.token_ids for rec in results[variant][mode_name].records
                    if rec.is_deterministic and rec.finish_s is not None}

        ref = finished(first)
        for v in variants[1:]:
            got = finished(v)
            common = set(ref) & set(got)
            checks[f"{v}_vs_{first}_{mode_name}"] = {"num_checked": len(common),
                                                     "num_identical": sum(ref[i] == got[i] for i in common)}
    out["deterministic_outputs_identical"] = checks
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(checks), flush=True)


if __name__ == "__main__":
    main()
