#!/usr/bin/env bash
# The tuner on the hybrid recurrent MoE at Qwen3.6-35B-A3B's width and depth, on one H100
# (issue #54 items 4 and 6): `tuner bench` at forced acceptance (the output is noise, the
# acceptance is what we set), draft-mtp's static arms against the daemon, twice:
#   alpha 0.8 (each drafted token kept with probability 0.8 given the ones before it):
#              every MTP setting lost on the 64-expert a3b (hybrid_check.sh); on this copy,
#              whose verify pass reads fewer distinct experts, not yet measured: the tuner
#              must match no speculation if all lose, the best arm if one pays;
#   alpha 1.0: draft-mtp with 3 tokens pays (1.46x), so the tuner must find and serve it.
# (Its one run so far, docs/hybrid.md, gave the 0.8 case a flat profile: the first token
# kept with probability 0.8, the rest always; there three drafts paid 1.32x.)
# The model: benchmarks/hybrid_verify.py's a3b16 (40 layers, 30 gated DeltaNet, one MTP
# block, 16 routed experts of 512 per layer, 8 GB F16), so the matrix's four instances and
# the daemon's four fit the GPU together. Needs, beside the checkout (git-ignored, made where
# the network is): .whl/ (Python 3.12 wheels the image lacks, psycopg and psycopg-binary
# among them) and .gpu/ (the pinned sdist); the CUDA build took 241 s and 370 s on two H100s;
# see hybrid_check.sh. Writes under $OUT as each stage ends. On a CPU, for a dry run:
#   BACKEND=cpu SCALE=tiny bash benchmarks/device/hybrid_tuner_check.sh
set -uo pipefail
begin=$(date +%s)
OUT=${OUT:-$PWD/gpu-out}
SCALE=${SCALE:-a3b16}
BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-/tmp/tuner-cache} TUNER_STATE_DIR=${TUNER_STATE_DIR:-/tmp/tuner-state}
if [ -d .whl ] && [ "$BACKEND" = cuda ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site:$PWD
    mkdir -p "$TUNER_CACHE_DIR/downloads"
    cp .gpu/llama_cpp_python-0.3.36.tar.gz "$TUNER_CACHE_DIR/downloads/"
fi
PY=${PY:-python3}
{ nvidia-smi; nproc; free -g; } > "$OUT/machine.txt" 2>&1
# provision resolves a target before it builds: the tokenizer-only vocab stands in
vocab=$($PY -c "from tuner.synthetic.moe import default_vocab; from pathlib import Path
print(default_vocab(Path('$TUNER_CACHE_DIR'), 'qwen35'))") || exit 4
export TUNER_MODEL=$vocab
timeout "${BUILD_S:-420}" $PY -m tuner provision > "$OUT/provision.log" 2>&1
ls "$TUNER_CACHE_DIR"/llama-server/*-"$BACKEND"-*/llama-server > /dev/null 2>&1 || {
    echo "no $BACKEND build"; tail -30 "$OUT/provision.log"; exit 5; }
echo "build: $(( $(date +%s) - begin )) s"

model=$($PY -c "import sys; sys.path.insert(0, '.')
from pathlib import Path; from benchmarks.hybrid_verify import model_file
print(model_file(Path('$TUNER_CACHE_DIR'), '$SCALE', 'hybrid'))") || exit 6
echo "model: $(( $(date +%s) - begin )) s: $model"

# the MTP types only: n-gram types draft on matches, and forced acceptance of copied noise
# says nothing about them
printf '[search.draft-mtp]\nn_max = [1, 2, 3]\n' > /tmp/mtp-only.toml
for alpha in 0.8 1; do
    left=$(( ${TOTAL_S:-585} - ($(date +%s) - begin) ))
    [ "$left" -gt 40 ] || { echo "no time left for alpha $alpha"; break; }
    [ "$alpha" = 0.8 ] && left=$(( left / 2 ))
    TUNER_TUNING_FILE=/tmp/mtp-only.toml TUNER_SPEC_ARGS="--spec-synth-rates $alpha" \
    TUNER_MAX_INSTANCES=4 timeout "$left" $PY -m tuner bench --model "$model" \
        --workload benchmarks/workloads/dev.jsonl --prompts "${PROMPTS:-20}" \
        --requests "${REQUESTS:-80}" --max-tokens 48 --seed 54 \
        --matrix draft-mtp.max1,draft-mtp.max2,draft-mtp.max3 \
        --out "$OUT/bench-a$alpha" > "$OUT/bench-a$alpha.log" 2>&1
    echo "alpha $alpha: rc=$? at $(( $(date +%s) - begin )) s"
    # cut short by the time limit: summarize what was answered
    [ -f "$OUT/bench-a$alpha/summary.md" ] || $PY -m tuner bench --analyse "$OUT/bench-a$alpha" \
        >> "$OUT/bench-a$alpha.log" 2>&1
    grep -A12 "^## Overall" "$OUT/bench-a$alpha/summary.md"
    # at most 8 files come back: each run travels as one archive
    tar czf "$OUT/bench-a$alpha.tar.gz" -C "$OUT" "bench-a$alpha" && rm -rf "$OUT/bench-a$alpha"
done
