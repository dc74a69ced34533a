#!/usr/bin/env bash
# Fetch the wheels of the kv benchmarks' optional sides for scripts/gpu_kv_bench.sh, which installs them offline
# (pip install --no-index --find-links) on a GPU machine with no package index. Run here, with PyPI reachable:
#
#   scripts/fetch_kv_wheels.sh [SIDES [PYTHON_VERSION [DEST]]]   # SIDES: smg,contextpilot (both); the GPU
#                                                                 # machine's Python (3.12); DEST (build/gpu-kv)
#
# DEST/sides/<side>/ gets the side's wheels for that Python on x86-64 and requirements.txt (what to install).
# Only what the side imports is fetched, not the packages' whole dependency closure: smg's `smg launch` imports
# smg and setproctitle (grpcio, protobuf and PyYAML serve its gRPC mode only); ContextPilot's library mode
# (contextpilot.server.live_index) imports scipy, numpy and requests, while its declared dependencies (transformers,
# datasets, pyarrow, pandas, fastapi, ... about 205 MB) serve its HTTP server and retrievers. numpy comes with the
# CUDA image; gpu_kv_bench.sh's pre-flight imports each side and says which one it drops and why.
# Sizes: smg ~37 MB, contextpilot with scipy ~37 MB; with llama.cpp.tar.gz (~10 MB) both together exceed a 64 MiB
# carry limit: carry one side per run where that limit applies (the script prints the folder's total).
set -euo pipefail
cd "$(dirname "$0")/.."
sides="${1:-smg,contextpilot}"
pyver="${2:-3.12}"
dest="${3:-build/gpu-kv}"
declare -A wanted=(
  [smg]="smg==1.13.0 setproctitle==1.3.8"
  [contextpilot]="contextpilot==0.5.0 scipy==1.17.1 requests==2.34.2 urllib3==2.8.0 certifi==2026.10.19.post1 charset_normalizer==3.5.3 idna==3.20"
)
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
IFS=, read -r -a names <<< "$sides"
for side in "${names[@]}"; do
  [ -n "${wanted[$side]:-}" ] || { echo "unknown side $side (known: ${!wanted[*]})" >&2; exit 2; }
  dir="$dest/sides/$side"
  rm -rf "$dir"; mkdir -p "$dir"
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d "$dir" ${wanted[$side]}
  tr ' ' '\n' <<< "${wanted[$side]}" > "$dir/requirements.txt"
done
du -sh "$dest"/sides/*
du -sh "$dest"
total_kib=$(du -sk "$dest" | cut -f1)
if [ "$total_kib" -gt $((60 * 1024)) ]; then
  echo "note: $dest holds $((total_kib / 1024)) MiB: above a 64 MiB carry limit with the repository; fetch one side"
fi
