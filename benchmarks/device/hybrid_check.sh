#!/usr/bin/env bash
# The GPU check of issue #54: the hybrid recurrent MoE at the shape of Qwen3.6-35B-A3B (full
# depth, 40 trunk layers and its MTP block; 64 routed experts of 512 per layer, F16, ~21 GB)
# on one H100, no network there. It needs, beside the checkout (git-ignored, made where the
# network is):
#   .whl/  Python 3.12 wheels of what the image lacks (pydantic, structlog, gguf, optuna, ...)
#   .gpu/llama_cpp_python-0.3.36.tar.gz  the pinned sdist trimmed to what the build and the
#          synthetic models use (no docs, tests, examples, git objects; vocab files: llama-spm
#          and qwen35)
# and writes its logs and results under $OUT as each stage ends:
#   1. `tuner provision`: the project's own build path, CUDA chosen by itself
#   2. benchmarks/hybrid_verify.py --scale a3b: the hybrid's decode step and T(n), draft-mtp at
#      forced acceptance against the speedup model, then the attention-only twin's T(n);
#      until TOTAL_S (570 s) from the start
# Run there as: bash benchmarks/device/hybrid_check.sh (carrying .whl and .gpu)
set -uo pipefail
begin=$(date +%s)
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-/tmp/tuner-cache} TUNER_STATE_DIR=${TUNER_STATE_DIR:-/tmp/tuner-state}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi; nvcc --version; nproc; free -g; df -h /tmp; python3 --version; } > "$OUT/machine.txt" 2>&1
mkdir -p "$TUNER_CACHE_DIR/downloads"
cp .gpu/llama_cpp_python-0.3.36.tar.gz "$TUNER_CACHE_DIR/downloads/"
# no model there: provision resolves a target before it builds, so the tokenizer-only vocab
# GGUF stands in as "the model" (it is never served)
tar xzf "$TUNER_CACHE_DIR/downloads/llama_cpp_python-0.3.36.tar.gz" -C /tmp --strip-components=4 \
    llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-qwen35.gguf
export TUNER_MODEL=/tmp/ggml-vocab-qwen35.gguf
python3 -c "import tuner.cli.main, tuner.synthetic.hybrid, benchmarks.hybrid_verify" || exit 4

timeout "${BUILD_S:-330}" python3 -m tuner provision > "$OUT/provision.log" 2>&1
bin=$(ls "$TUNER_CACHE_DIR"/llama-server/*-cuda-*/llama-server 2>/dev/null) || {
    echo "no CUDA build"; tail -30 "$OUT/provision.log"
    find "$TUNER_CACHE_DIR" -name build.log -exec tail -40 {} \; ; exit 5; }
echo "build: $(( $(date +%s) - begin )) s: $bin"

left=$(( ${TOTAL_S:-570} - ($(date +%s) - begin) )); [ "$left" -gt 30 ] || { echo "no time left"; exit 6; }
timeout "$left" python3 benchmarks/hybrid_verify.py \
    --scale a3b --repeats 3 --out "$OUT/hybrid_verify_a3b.json" > "$OUT/hybrid_verify.log" 2>&1
echo "hybrid_verify rc=$? at $(( $(date +%s) - begin )) s"
grep -E "writing|measuring|mtp alpha" "$OUT/hybrid_verify.log" | cut -c1-300
tail -5 "$OUT/hybrid_verify.log"
