#!/usr/bin/env bash
# Round 46, device call B (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): round 45 found free
# requests' online gaps at dvr@50 as long as the requests decoding in their steps make them (0.024-0.026 ms per
# sampled row beside a pass or none; 110 rows beside a pass against nondet's 89). Real SmolLM2: the default against
# draft_ahead_off (deterministic requests wait rowless for a window's verdict instead of drafting ahead), offline
# nondet and dvr@50, online at 0.7 load twice in ABBA order, with the gaps at equal fast tokens
# (free_gap_attribution's running_by_rows: at the same rows, is a gap beside a pass longer?).
#
#   bash benchmarks/device/r46_call_b.sh
VARIANTS=${VARIANTS:-default,draft_ahead_off} MODES=${MODES:-nondet,dvr@50} \
    ONLINE_VARIANTS=${ONLINE_VARIANTS:-default,draft_ahead_off} ONLINE_REPEATS=${ONLINE_REPEATS:-2} \
    ROUND=r46 TAG=${TAG:-b} CAP=${CAP:-420} exec bash "$(dirname "$0")/r42_call_b.sh"
