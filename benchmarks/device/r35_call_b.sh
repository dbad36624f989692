#!/usr/bin/env bash
# Round 35, device call B (carry .dev_stage/b, at once after a call that carried .dev_stage/a, e.g.
# r35_call_a.sh): the online ITL target against canonical passes in layer slices (DVRGenerator(canonical_slices=N),
# built in round 34, CPU-tested; its GPU test is tests/gpu/test_canonical_slices_cuda.py, run by r35_call_a.sh).
# Round 34 found the slowest free gaps in steps that apply a pass, whose read-back waited on a device the pass had
# shared; moving the host work (split_pass_steps, pass_before_read) did not remove it. Real SmolLM2: offline nondet
# and dvr@50 (capacity; deterministic outputs compared across the variants), then online at 0.7 load, 500 requests,
# nondet and dvr@50, every step's phases timed, twice in ABBA order (round 34's two default runs on one card gave
# p99 ratios of 1.59 and 1.29: one run a variant is not enough). Then (TIMELINE_CAP > 0) the online timeline of dvr@50, default
# against canonical_slices_4 (dvr_timeline.py --online-load: whether a fast step beside a pass is longer for its
# rows, and how long a pass or a slice of it takes served). VARIANTS=default,canonical_slices_4,narrow_passes also
# serves passes of at most R rows (dvr_ab.py's narrow_passes: the other way to shorten what a fast step shares the
# device with), at a third more device time.
#
#   bash benchmarks/device/r35_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-420}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,canonical_slices_4}" --modes nondet,dvr@50 --budget-s 100 \
    --warmup-requests 8 --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 \
    --online-requests 500 --online-budget-s 240 --online-repeats "${ONLINE_REPEATS:-2}" --out "$OUT/dvr_ab_smollm2_r35_b.json" >"$OUT/dvr_ab_b.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|rror|identical" "$OUT/dvr_ab_b.txt" | grep -v warm-up | tail -n 60
if [ "${TIMELINE_CAP:-200}" -gt 0 ]; then
    timeout "${TIMELINE_CAP:-200}" python3 benchmarks/device/dvr_timeline.py --model "$SMOL" \
        --cache-dir /tmp/llm42_models --variants default,canonical_slices_4 --modes dvr@50 --online-load 0.7 \
        --online-requests 500 --budget-s 120 --warmup-requests 8 --out "$OUT/timeline_online_smollm2.json" \
        >"$OUT/timeline.txt" 2>&1
    log "timeline exit $?"; grep -E "^\[dvr_timeline\]|rror" "$OUT/timeline.txt" | tail -n 12
fi
log "done"
