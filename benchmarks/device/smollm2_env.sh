# Sourced after session_preamble.sh by the device calls that serve the real SmolLM2: joins the staged GGUF
# (when the calls before copied .dev_stage/a/part_a and .dev_stage/m/part_m to /root and this one carries
# .dev_stage/b), puts the staged wheels on PYTHONPATH and sets SMOL to the GGUF's path; stops the call when there is
# none.
if ! ls /root/smollm2/*.gguf >/dev/null 2>&1 && [ -f /root/smollm2.part_a ] && [ -d .dev_stage/b ]; then
    bash benchmarks/device/join_smollm2.sh >>"$LOG" 2>&1 || log "join_smollm2.sh failed"
fi
export PYTHONPATH="src:/tmp/site"
SMOL=$(ls /root/smollm2/*.gguf 2>/dev/null | head -n 1)
[ -n "$SMOL" ] || { log "no SmolLM2 GGUF: stopping"; exit 1; }
