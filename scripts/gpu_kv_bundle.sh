#!/usr/bin/env bash
# Make build/gpu-kv/ (ignored by git) for scripts/gpu_kv_bench.sh, which runs on a GPU machine with no network.
# Run here, from anywhere in the repository, with the package registries reachable:
#
#   scripts/gpu_kv_bundle.sh [PYTHON_VERSION [DEST]]   # the GPU machine's Python (3.12), DEST (build/gpu-kv)
#
# build/gpu-kv/llama.cpp.tar.gz  the llama.cpp tree vendored in the llama-cpp-python sdist (the one
#                                scripts/build_llama_server.sh builds for the CPU), without its docs, tests, examples
#                                and models but the tokenizer the model writer copies (~10 MB)
# build/gpu-kv/wheels/           the Python packages the benchmark and the model writer need that a CUDA image with
#                                PyTorch usually lacks (scripts/gpu_kv_wheels.txt), built for that Python on x86-64
set -euo pipefail
cd "$(dirname "$0")/.."
pyver="${1:-3.12}"
dest="${2:-build/gpu-kv}"
llama="$(scripts/build_llama_server.sh --source | tail -n1)"
mkdir -p "$dest/wheels"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
tar -C "$(dirname "$llama")" -cf - --exclude='llama.cpp/.git*' --exclude=llama.cpp/.github \
  --exclude=llama.cpp/.devops --exclude=llama.cpp/docs --exclude=llama.cpp/media --exclude=llama.cpp/benches \
  --exclude=llama.cpp/tests --exclude=llama.cpp/examples --exclude=llama.cpp/pocs --exclude=llama.cpp/gguf-py \
  --exclude=llama.cpp/conversion --exclude=llama.cpp/models llama.cpp | tar -C "$stage" -xf -
mkdir -p "$stage/llama.cpp/models"
cp "$llama/models/ggml-vocab-llama-spm.gguf" "$stage/llama.cpp/models/"
tar -C "$stage" -czf "$dest/llama.cpp.tar.gz" llama.cpp
platforms=()
for n in 17 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 -d "$dest/wheels" -r scripts/gpu_kv_wheels.txt
du -sh "$dest" "$dest"/*
