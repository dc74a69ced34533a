#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source vendored in the llama-cpp-python sdist on PyPI.
#
# Idempotent: the binary and the vendored tokenizer files are cached outside the repository, in
# ${RAGPROXY_LLAMA_CACHE:-~/.cache/ragproxy}; a second run with the binary present only prints its path.
#
#   scripts/build_llama_server.sh            # prints the path of llama-server on its last line
#   scripts/build_llama_server.sh --source   # only fetches and unpacks the sdist; prints the llama.cpp folder
#   scripts/build_llama_server.sh --configure  # stops after CMake's configure step (checks a build's settings)
#   LLAMA_CPP_PYTHON_VERSION=0.3.16 scripts/build_llama_server.sh
#   JOBS=2 nice -n 19 scripts/build_llama_server.sh
#
# Other builds (scripts/gpu_kv_bench.sh makes the CUDA one this way, with no network):
#   LLAMA_CPP_SOURCE=DIR      build this llama.cpp tree instead of fetching the sdist (build tree in <cache>/build)
#   LLAMA_CMAKE_ARGS="..."    extra CMake arguments (word-split), e.g. "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"
#
# Layout of the cache:
#   <cache>/llama-server           the server binary (statically linked against ggml/llama)
#   <cache>/vocab/ggml-vocab-*.gguf tokenizer-only GGUF files from the vendored tree (used by make_tiny_gguf.py)
#   <cache>/src/                   unpacked sdist + cmake build tree (kept so a rebuild is incremental)
set -euo pipefail

CACHE="${RAGPROXY_LLAMA_CACHE:-$HOME/.cache/ragproxy}"
BIN="$CACHE/llama-server"
PYTHON="${PYTHON:-/work/venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
JOBS="${JOBS:-$(nproc)}"
VERSION_SPEC=""
if [ -n "${LLAMA_CPP_PYTHON_VERSION:-}" ]; then
  VERSION_SPEC="==${LLAMA_CPP_PYTHON_VERSION}"
fi
MODE="${1:-}"   # --source | --configure | empty

if [ -z "$MODE" ] && [ -x "$BIN" ] && [ -n "$(ls "$CACHE"/vocab/ggml-vocab-*.gguf 2>/dev/null)" ]; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$CACHE/vocab"
if [ -n "${LLAMA_CPP_SOURCE:-}" ]; then
  llama="$(cd "$LLAMA_CPP_SOURCE" && pwd)"
  build="$CACHE/build"
else
  mkdir -p "$CACHE/src"
  cd "$CACHE/src"
  sdist="$(ls llama_cpp_python-*.tar.gz 2>/dev/null | head -n1 || true)"
  if [ -z "$sdist" ]; then
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --dest . "llama-cpp-python${VERSION_SPEC}"
    sdist="$(ls llama_cpp_python-*.tar.gz | head -n1)"
  fi
  srcdir="${sdist%.tar.gz}"
  [ -d "$srcdir" ] || tar -xzf "$sdist"
  llama="$CACHE/src/$srcdir/vendor/llama.cpp"
  build="$CACHE/src/$srcdir/build"
fi
[ -f "$llama/CMakeLists.txt" ] || { echo "no llama.cpp source in $llama" >&2; exit 1; }
if [ "$MODE" = --source ]; then
  echo "$llama"
  exit 0
fi

cp -f "$llama"/models/ggml-vocab-*.gguf "$CACHE/vocab/"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
read -r -a extra <<< "${LLAMA_CMAKE_ARGS:-}"
cmake -S "$llama" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON \
  -DGGML_OPENMP=OFF \
  -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON "${extra[@]}" >/dev/null
if [ "$MODE" = --configure ]; then
  echo "configured: $build"
  exit 0
fi
cmake --build "$build" --target llama-server -j "$JOBS"

built="$(find "$build" -type f -name llama-server -perm -u+x | head -n1)"
[ -n "$built" ] || { echo "llama-server was not produced" >&2; exit 1; }
cp -f "$built" "$BIN.tmp"
mv -f "$BIN.tmp" "$BIN"
echo "$BIN"
