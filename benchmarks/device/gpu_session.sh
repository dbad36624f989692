#!/usr/bin/env bash
# One device call: GPU tests, doctor, kernel benchmark, serving benchmark (8B shape, then SmolLM2), paper figures.
#
#   bash benchmarks/device/gpu_session.sh [TOTAL_S] [STAGES]
#
# TOTAL_S (default 540) bounds the whole call; STAGES is a comma list, in this order, of
#   tests      python3 -m pytest -q -m gpu tests                            -> $OUT/gpu_tests.txt
#   doctor     python3 -m llm42 doctor --device cuda --json ...             -> $OUT/doctor_cuda.json
#   kernels    benchmarks/gpu_bench.py                                      -> $OUT/gpu_bench.json
#   serving8b  benchmarks/serving.py --model 8b                             -> $OUT/serving_cuda_8b.json
#   longprompts python3 -m llm42.bench.long_prompts --model 8b            -> $OUT/long_prompts_cuda_8b.json
#   smollm2    benchmarks/serving.py --model /root/smollm2/*.gguf           -> $OUT/serving_cuda_smollm2.json
#   figures    benchmarks/paper_figures.py --model /root/smollm2/*.gguf --random-model 8b
#                                                                           -> $OUT/paper_figures_cuda_smollm2.json
# (default: all of them but longprompts, which is asked for by name). Each stage gets a share of the time still left (a stage that ends early leaves its
# time to the next) and runs under `timeout`; the Python benchmarks get a --budget-s a little under their
# share and write their JSON after every run, so a cut stage still leaves its finished figures. The SmolLM2
# stages need the GGUF staged by benchmarks/device/stage_smollm2.py (this script runs join_smollm2.sh itself
# when /root/smollm2.part_a, /root/smollm2.part_m and .dev_stage/b are there; it installs the gguf wheels to
# /tmp/site); without it they are skipped. Every stage's output goes to $OUT/session_log.txt.
# At most 7 files come back; the PNGs are redrawn on the workstation:
#   PYTHONPATH=src python3 benchmarks/serving.py --replot <json>      (and paper_figures.py --replot <json>)
set -uo pipefail
cd "$(dirname "$0")/../.."

TOTAL_S=${1:-540}
STAGES=${2:-tests,doctor,kernels,serving8b,smollm2,figures}
OUT=${OUT:-/tmp/llm42_out}
mkdir -p "$OUT"
LOG="$OUT/session_log.txt"
export PYTHONUNBUFFERED=1
# the SmolLM2 parts staged by stage_smollm2.py (part_a and part_m copied to /root by two earlier calls, part_b
# carried in .dev_stage/b by this one): join them here when that has not happened yet
if ! ls /root/smollm2/*.gguf >/dev/null 2>&1 && [ -f /root/smollm2.part_a ] && [ -d .dev_stage/b ]; then
    bash benchmarks/device/join_smollm2.sh >>"$LOG" 2>&1 || echo "gpu_session: join_smollm2.sh failed" >>"$LOG"
fi
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
SMOL=$(ls /root/smollm2/*.gguf 2>/dev/null | head -n 1)
CACHE=/tmp/llm42_models
START=$(date +%s)
END=$((START + TOTAL_S))
SERVING_ARGS=${SERVING_ARGS:-}  # extra benchmarks/serving.py arguments, e.g. "--max-fast-tokens 2048"
GRACE=15  # seconds between a benchmark's own budget and its timeout: model load, last save, exit

declare -A SHARE=([tests]=17 [doctor]=6 [kernels]=10 [serving8b]=22 [longprompts]=15 [smollm2]=17 [figures]=28)
ORDER=(tests doctor kernels serving8b longprompts smollm2 figures)
selected=()
for s in "${ORDER[@]}"; do
    [[ ",$STAGES," == *",$s,"* ]] && selected+=("$s")
done
for s in ${STAGES//,/ }; do
    [[ -n "${SHARE[$s]:-}" ]] || { echo "gpu_session: unknown stage '$s' (known: ${ORDER[*]})" >&2; exit 2; }
done

log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }

# slice STAGE: seconds for STAGE = its share of the time left, over the shares of the stages still to run
slice() {
    local stage=$1 left=$(( END - $(date +%s) )) total=0 s seen=0
    for s in "${selected[@]}"; do
        [[ $s == "$stage" ]] && seen=1
        (( seen )) && total=$(( total + SHARE[$s] ))
    done
    (( left < 0 )) && left=0
    echo $(( left * SHARE[$stage] / total ))
}

run_stage() {  # run_stage NAME SECONDS COMMAND...: bounded by timeout, output appended to the log
    local name=$1 secs=$2
    shift 2
    if (( secs < 10 )); then
        log "$name: skipped, only ${secs}s left"
        return
    fi
    log "$name: start (timeout ${secs}s): $*"
    timeout --signal=TERM --kill-after=10 "$secs" "$@" >>"$LOG" 2>&1
    log "$name: exit $? after $(( $(date +%s) - stage_start ))s"
}

log "gpu_session: total ${TOTAL_S}s, stages ${selected[*]}; SmolLM2: ${SMOL:-absent}"
if [[ -n "$SMOL" && ( ",$STAGES," == *",smollm2,"* || ",$STAGES," == *",figures,"* ) ]]; then
    # the GGUF -> HF conversion (about 30 s) once, before any stage's budget starts (round 4's first timed run
    # spent its whole budget on it and on the first compilations)
    python3 -c "import sys; from pathlib import Path; from llm42.bench.serving import prepare_checkpoint; \
prepare_checkpoint(sys.argv[1], Path(sys.argv[2]))" "$SMOL" "$CACHE" >>"$LOG" 2>&1 || log "SmolLM2 conversion failed"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv >>"$LOG" 2>&1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())' \
    >>"$LOG" 2>&1

for stage in "${selected[@]}"; do
    secs=$(slice "$stage")
    budget=$(( secs > 2 * GRACE ? secs - GRACE : secs / 2 ))
    stage_start=$(date +%s)
    case $stage in
    tests)
        log "tests: start (timeout ${secs}s)"
        # -v: a run cut by its timeout still says which test it was in (round 4's -q run did not)
        timeout --signal=TERM --kill-after=10 "$secs" python3 -m pytest -v -p no:cacheprovider -m gpu \
            --durations=20 tests >"$OUT/gpu_tests.txt" 2>&1
        rc=$?
        tail -n 5 "$OUT/gpu_tests.txt" >>"$LOG"
        log "tests: exit $rc after $(( $(date +%s) - stage_start ))s"
        ;;
    doctor)
        if grep -q "\"doctor\"" src/llm42/cli.py; then
            run_stage doctor "$secs" python3 -m llm42 doctor --device cuda --json "$OUT/doctor_cuda.json"
        else
            log "doctor: skipped (this tree's CLI has no doctor subcommand)"
        fi
        ;;
    kernels)
        run_stage kernels "$secs" python3 benchmarks/gpu_bench.py --out "$OUT/gpu_bench.json"
        ;;
    serving8b)
        run_stage serving8b "$secs" python3 benchmarks/serving.py --device cuda --model 8b --budget-s "$budget" \
            --no-plots $SERVING_ARGS --out "$OUT/serving_cuda_8b.json"
        ;;
    longprompts)
        run_stage longprompts "$secs" python3 -m llm42.bench.long_prompts --device cuda --model 8b \
            --budget-s "$budget" --out "$OUT/long_prompts_cuda_8b.json"
        ;;
    smollm2)
        if [[ -z "$SMOL" ]]; then
            log "smollm2: skipped (no /root/smollm2/*.gguf: run stage_smollm2.py + join_smollm2.sh first)"
            continue
        fi
        run_stage smollm2 "$secs" python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir "$CACHE" \
            --budget-s "$budget" --no-plots $SERVING_ARGS --out "$OUT/serving_cuda_smollm2.json"
        ;;
    figures)
        if [[ -z "$SMOL" ]]; then
            log "figures: skipped (no /root/smollm2/*.gguf)"
            continue
        fi
        run_stage figures "$secs" python3 benchmarks/paper_figures.py --device cuda --model "$SMOL" \
            --random-model 8b --cache-dir "$CACHE" --budget-s "$budget" --no-plots \
            --out "$OUT/paper_figures_cuda_smollm2.json"
        ;;
    esac
done
log "gpu_session: done in $(( $(date +%s) - START ))s"
ls -l "$OUT" >>"$LOG"
