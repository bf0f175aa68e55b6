#!/usr/bin/env bash
# Build ik_llama.cpp's llama-server for the CPU, as ours is built, for the peer comparison
# (tuner bench --peer, docs/benchmarks.md). SRC: a checkout of github.com/ikawrakow/ik_llama.cpp.
#   bash benchmarks/peers/build_ik_llama.sh SRC [DEST]   (about 15 min on 2 cores)
# DEST (default ~/.cache/spec-tuner/peers/ik_llama.cpp) gets llama-server and its shared
# libraries; run it with LD_LIBRARY_PATH=DEST.
set -euo pipefail
src=${1:?usage: build_ik_llama.sh SRC [DEST]}
dest=${2:-$HOME/.cache/spec-tuner/peers/ik_llama.cpp}
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DGGML_CUDA=OFF > "$src/build.log" 2>&1
cmake --build "$src/build" --target llama-server -j "$(nproc)" >> "$src/build.log" 2>&1
mkdir -p "$dest"
cp "$src/build/bin/llama-server" "$dest/"
find "$src/build" -name '*.so' -exec cp {} "$dest/" \;
echo "$dest/llama-server (LD_LIBRARY_PATH=$dest)"
