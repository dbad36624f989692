#!/usr/bin/env bash
# On the device machine (call 3, carrying .dev_stage/b; calls 1 and 2 copied .dev_stage/a/part_a and
# .dev_stage/m/part_m to /root): join the three parts of the SmolLM2 GGUF, check its SHA-256, and install
# the staged wheels (gguf and the dependencies the image lacks) to /tmp/site.
# Then: PYTHONPATH=/tmp/site python3 ... --model /root/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
set -euo pipefail
cd "$(dirname "$0")/../.."

part_a=/root/smollm2.part_a
part_m=/root/smollm2.part_m
part_b=.dev_stage/b/part_b
out=/root/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
for part in "$part_a" "$part_m" "$part_b" .dev_stage/b/SHA256; do
    [ -f "$part" ] || { echo "join_smollm2: $part is missing (see benchmarks/device/stage_smollm2.py)" >&2; exit 1; }
done

mkdir -p "$(dirname "$out")"
cat "$part_a" "$part_m" "$part_b" > "$out.tmp"
expected=$(cut -d' ' -f1 .dev_stage/b/SHA256)
actual=$(sha256sum "$out.tmp" | cut -d' ' -f1)
if [ "$expected" != "$actual" ]; then
    rm -f "$out.tmp"
    echo "join_smollm2: SHA-256 mismatch: expected $expected, got $actual" >&2
    exit 1
fi
mv "$out.tmp" "$out"

python3 -m pip install -q --no-deps --no-index --target /tmp/site .dev_stage/b/*.whl
PYTHONPATH=/tmp/site python3 -c "import gguf; print('gguf', gguf.__file__)"
echo "join_smollm2: $out ($(stat -c %s "$out") bytes, SHA-256 ok); wheels in /tmp/site"
