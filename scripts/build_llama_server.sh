#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source vendored in the llama-cpp-python sdist on PyPI.
#
# Idempotent: the binary and the vendored tokenizer files are cached outside the repository, in
# ${RAGPROXY_LLAMA_CACHE:-~/.cache/ragproxy}; a second run with the binary present only prints its path.
#
#   scripts/build_llama_server.sh            # prints the path of llama-server on its last line
#   LLAMA_CPP_PYTHON_VERSION=0.3.16 scripts/build_llama_server.sh
#   JOBS=2 nice -n 19 scripts/build_llama_server.sh
#
# Layout of the cache:
#   <cache>/llama-server           the server binary (statically linked against ggml/llama, CPU only)
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

if [ -x "$BIN" ] && [ -n "$(ls "$CACHE"/vocab/ggml-vocab-*.gguf 2>/dev/null)" ]; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$CACHE/src" "$CACHE/vocab"
cd "$CACHE/src"

sdist="$(ls llama_cpp_python-*.tar.gz 2>/dev/null | head -n1 || true)"
if [ -z "$sdist" ]; then
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --dest . "llama-cpp-python${VERSION_SPEC}"
  sdist="$(ls llama_cpp_python-*.tar.gz | head -n1)"
fi
srcdir="${sdist%.tar.gz}"
[ -d "$srcdir" ] || tar -xzf "$sdist"
llama="$srcdir/vendor/llama.cpp"
[ -f "$llama/CMakeLists.txt" ] || { echo "no vendored llama.cpp in $sdist" >&2; exit 1; }

cp -f "$llama"/models/ggml-vocab-*.gguf "$CACHE/vocab/"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$llama" -B "$srcdir/build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON \
  -DGGML_OPENMP=OFF \
  -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON >/dev/null
cmake --build "$srcdir/build" --target llama-server -j "$JOBS"

built="$(find "$srcdir/build" -type f -name llama-server -perm -u+x | head -n1)"
[ -n "$built" ] || { echo "llama-server was not produced" >&2; exit 1; }
cp -f "$built" "$BIN.tmp"
mv -f "$BIN.tmp" "$BIN"
echo "$BIN"
