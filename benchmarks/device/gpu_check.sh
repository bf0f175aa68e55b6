#!/usr/bin/env bash
# The GPU check of issue #7, as run on a lent NVIDIA machine (no network there).
#
# It needs, beside the checkout (both git-ignored, made on a machine with the network):
#   .whl/  Python 3.12 wheels of what the image lacks (pydantic, structlog, gguf, optuna, ...)
#   .gpu/llama_cpp_python-0.3.36.tar.gz  the pinned sdist, trimmed to what the build and the
#          synthetic models use (no docs, tests, examples, or vocab files but llama-spm)
# and writes its logs and results under $OUT. Stages, each with its own time limit:
#   1. `tuner provision`: the project's own build path, CUDA chosen by itself (nvcc + a GPU)
#   2. benchmarks/moe_verify.py: the synthetic MoE's and its dense twin's verify curves and
#      speedups at forced acceptance, on the GPU
#   3. `tuner bench` on the synthetic MoE at forced acceptance L=2 (the kill-switch run of
#      BENCHMARKS.md), until TOTAL_S (585 s) from the start
# Run there as: bash benchmarks/device/gpu_check.sh (carrying .whl and .gpu)
set -uo pipefail
begin=$(date +%s)
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-/tmp/tuner-cache} TUNER_STATE_DIR=${TUNER_STATE_DIR:-/tmp/tuner-state}
if [ -z "${NO_WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site:$PWD
fi
{ nvidia-smi; nvcc --version; nproc; python3 --version; } > "$OUT/machine.txt" 2>&1
mkdir -p "$TUNER_CACHE_DIR/downloads"
[ -f "$TUNER_CACHE_DIR/downloads/llama_cpp_python-0.3.36.tar.gz" ] ||
    cp .gpu/llama_cpp_python-0.3.36.tar.gz "$TUNER_CACHE_DIR/downloads/"
# no Gemma there: provision and moe_verify resolve a target before they write the synthetic
# ones, so the tokenizer-only vocab GGUF stands in as "the model" (it is never served)
tar xzf "$TUNER_CACHE_DIR/downloads/llama_cpp_python-0.3.36.tar.gz" -C /tmp --strip-components=4 \
    llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf
export TUNER_MODEL=/tmp/ggml-vocab-llama-spm.gguf
python3 -c "import tuner.cli.main, tuner.daemon.serve, tuner.bench.run, benchmarks.moe_verify" || exit 4

start=$(date +%s)
timeout "${BUILD_S:-400}" python3 -m tuner provision 2>&1 | tee "$OUT/provision.log" | grep -E "built|ready|error|Error" 
bin=$(ls "$TUNER_CACHE_DIR"/llama-server/*-${BACKEND:-cuda}-*/llama-server 2>/dev/null) || { echo "no CUDA build"; 
    find "$TUNER_CACHE_DIR" -name build.log -exec tail -40 {} \; ; exit 5; }
echo "build: $(( $(date +%s) - start )) s: $bin"
"$bin" --version 2>&1 | tail -3

timeout "${VERIFY_S:-150}" python3 benchmarks/moe_verify.py --repeats 3 \
    --out "$OUT/moe_verify_gpu.json" > "$OUT/moe_verify.log" 2>&1
echo "moe_verify rc=$? at $(( $(date +%s) - start )) s"; tail -20 "$OUT/moe_verify.log"

synth=$TUNER_CACHE_DIR/synth
[ -n "${SKIP_BENCH:-}" ] && exit 0
TUNER_DRAFT_MODEL=$synth/synth-draft-tiny.gguf TUNER_SPEC_ARGS="--spec-synth-len 2" \
    timeout "${BENCH_S:-$(( ${TOTAL_S:-585} - ($(date +%s) - begin) ))}" python3 -m tuner bench --model "$synth/synth-moe-e128-k8.gguf" \
    --workload benchmarks/workloads/dev.jsonl --requests 200 --max-tokens 64 \
    --matrix draft-simple.max2.min2.p0,draft-simple.max4.min4.p0,draft-simple.max8.min8.p0,ngram-mod,ngram-simple \
    --out "$OUT/bench-moe-len2" > "$OUT/bench.log" 2>&1
echo "bench rc=$? at $(( $(date +%s) - start )) s"; tail -25 "$OUT/bench.log"
# at most 8 files come back from the device: the bench's folder travels as one archive
tar czf "$OUT/bench-moe-len2.tar.gz" -C "$OUT" bench-moe-len2 && rm -rf "$OUT/bench-moe-len2"
