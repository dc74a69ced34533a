#!/usr/bin/env bash
# The kv benchmarks on one NVIDIA GPU, with no network: build llama-server with CUDA from the vendored llama.cpp,
# write random-weight models, run `python -m loadtest.bench kv` and `kv_load`. Stops itself within 9 minutes.
#
#   scripts/gpu_kv_bundle.sh                      # first, where the registries are reachable: makes build/gpu-kv/
#   OUT=DIR scripts/gpu_kv_bench.sh               # then on the GPU machine, from a copy of the repository that
#                                                 # holds build/gpu-kv/; results and logs go to DIR
#
# Steps (each timed into $OUT/steps.txt; everything logged with timestamps to $OUT/log.txt):
#   1. pre-flight, within the first minute: the GPU (name, memory, compute capability), the wheels installed into
#      $WORK/site, the benchmark's imports, nvcc, cmake, ninja, cuBLAS (from the toolkit, or from the image's
#      Python packages through a folder of links)
#   2. llama-server with CUDA (the GPU's architecture only; FlashAttention kernels for F16 K/V) by
#      scripts/build_llama_server.sh, in $WORK/cache — incremental: when the build runs out of time, running the
#      script again on the same machine continues it; the models are written beside it (scripts/make_tiny_gguf.py:
#      the 1b shape in F16, and the 8b shape, in F16 when the GPU holds four replicas of it, else Q8_0)
#   3. `kv --quick --shape 1b`, sequential, every layer on the GPU, twice: with the fair flags (FlashAttention on)
#      -> seq_fair.json, and with FlashAttention off -> seq_fa_off.json: where a request's time goes (prefill share
#      of TTFT, host prompt-cache time per request) with and without the transposed V cache that the host prompt
#      cache copies one row at a time
#   4. `kv_load --quick --shape 8b` with the fair flags: goodput at the TTFT objective -> load.json (skipped,
#      and said so, when less than GPU_KV_LOAD_MIN_S is left: run again at once with GPU_KV_STEPS=load)
# With GPU_KV_FA=0 the build has no FlashAttention kernels (shorter) and the fair flags are FlashAttention off
# and no host prompt cache (--cache-ram 0: the proxy then pins slots).
# Files back: log.txt, steps.txt, seq_fair.json, seq_fa_off.json, load.json, summary.txt.
#
# Knobs (environment): OUT (required), GPU_KV_DEADLINE_S (530), GPU_KV_STEPS ("seq load"), GPU_KV_WORK
# (/tmp/ragproxy-gpu-kv), GPU_KV_BUNDLE (build/gpu-kv), GPU_KV_TYPE (f16|q8_0 for the 8b shape; default by GPU
# memory), GPU_KV_ARCH (e.g. 90; default from nvidia-smi), GPU_KV_LOAD_ARGS (extra `kv_load` arguments),
# GPU_KV_LOAD_MIN_S (200), GPU_KV_STOP_AFTER (preflight|configure: a dry run of the first steps; configure
# needs no GPU with GPU_KV_ARCH set), GPU_KV_CUBLAS (a folder with cuBLAS's include/ and lib/), GPU_KV_CMAKE_ARGS
# (more CMake arguments for the CUDA build), JOBS (nproc), PY (python3).
# GPU_KV_SIDES (the load run's sides; default direct,proxy and each of smg, contextpilot whose wheels the bundle
# carries in sides/<side>/, made by scripts/fetch_kv_wheels.sh and installed offline in the pre-flight; a side
# without them is dropped, in one line).
# GPU_KV_CPU=1: no GPU — the same steps with a CPU build (the cached one when RAGPROXY_LLAMA_SERVER names it) and
# the tiny shape, to check the script where there is no GPU.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${OUT:?set OUT to a folder for the results}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
T0=$SECONDS
DEADLINE=${GPU_KV_DEADLINE_S:-530}
STEPS=${GPU_KV_STEPS:-seq load}
WORK=${GPU_KV_WORK:-/tmp/ragproxy-gpu-kv}
BUNDLE=${GPU_KV_BUNDLE:-$ROOT/build/gpu-kv}
CPU=${GPU_KV_CPU:-}
PY=${PY:-python3}
LOAD_MIN_S=${GPU_KV_LOAD_MIN_S:-200}
FA=${GPU_KV_FA:-1}

left() { echo $((DEADLINE - (SECONDS - T0))); }
mark() { echo "$1 $2" >> "$OUT/steps.txt"; echo "=== $1: $2"; }
fail() { echo "FATAL: $*"; mark failed "$*"; exit 1; }
# `timeout` for a step, never past the deadline (less `reserve` seconds for what follows)
budget() { local want=$1 reserve=${2:-0} have; have=$(( $(left) - reserve )); [ "$have" -lt "$want" ] && want=$have; echo "$want"; }

preflight() {
  local t=$SECONDS
  mkdir -p "$WORK/site" "$WORK/models"
  uname -m; nproc; free -g | head -2; df -h /tmp | tail -1
  "$PY" --version || fail "no $PY"
  if [ -z "$CPU" ]; then
    if nvidia-smi -L; then
      GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
      GPU_MIB="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n1 | tr -d ' ')"
      ARCH=${GPU_KV_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' .')}
    elif [ "${GPU_KV_STOP_AFTER:-}" = configure ] && [ -n "${GPU_KV_ARCH:-}" ]; then
      GPU_NAME="none (configure only)"; GPU_MIB=0; ARCH=$GPU_KV_ARCH
    else
      fail "no GPU visible (GPU_KV_CPU=1 runs the CPU variant)"
    fi
    echo "GPU: $GPU_NAME, $GPU_MIB MiB, sm_$ARCH"
  fi
  if ls "$BUNDLE"/wheels/*.whl >/dev/null 2>&1; then
    timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
      "$BUNDLE"/wheels/*.whl || fail "installing the wheels of $BUNDLE/wheels"
  fi
  export PYTHONPATH="$WORK/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  timeout 60 "$PY" -c "import loadtest.bench.kv_load, gguf, orjson, httptools, httpx, numpy; print('imports ok')" \
    || fail "the benchmark's imports (scripts/gpu_kv_wheels.txt lists what the bundle brings)"
  optional_sides
  CMAKE_EXTRA=""
  if [ -z "$CPU" ]; then
    local nvcc cuda inc="" lib="" d
    nvcc="$(command -v nvcc || true)"
    [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc  # the toolkit's own, not a wrapper
    [ -n "$nvcc" ] || fail "no nvcc"
    "$nvcc" --version | tail -n2
    cuda="$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)"
    command -v cmake >/dev/null && command -v ninja >/dev/null || export PATH="$(dirname "$(command -v "$PY")"):$PATH"
    cmake --version | head -n1; ninja --version || fail "no ninja"
    for d in "$cuda/include" "$cuda/targets/x86_64-linux/include"; do [ -f "$d/cublas_v2.h" ] && inc=$d && break; done
    for d in "$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib"; do ls "$d"/libcublas.so* >/dev/null 2>&1 && lib=$d && break; done
    # FlashAttention kernels for F16 K/V only (the vector kernels of the quantized caches are not used here)
    CMAKE_EXTRA="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH -DCMAKE_CUDA_COMPILER=$nvcc"
    if [ "$FA" = 1 ]; then CMAKE_EXTRA+=" -DGGML_CUDA_FA=ON -DGGML_CUDA_FA_QUANTS=f16-f16"; else CMAKE_EXTRA+=" -DGGML_CUDA_FA=OFF"; fi
    CMAKE_EXTRA+=" -DCUDAToolkit_ROOT=$cuda -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
    CMAKE_EXTRA+=" -DLLAMA_OPENSSL=OFF"
    if [ -z "$inc" ] || [ -z "$lib" ]; then
      # the toolkit lacks cuBLAS: take GPU_KV_CUBLAS (a folder with include/ and lib/) or the one of the image's
      # Python packages (nvidia-cublas), through links, so that only cuBLAS's headers join the toolkit's
      local header shim="$WORK/cublas" l f
      if [ -n "${GPU_KV_CUBLAS:-}" ]; then
        header="$GPU_KV_CUBLAS/include/cublas_v2.h"
      else
        header="$("$PY" -c 'import site; print("\n".join(site.getsitepackages()))' \
          | while read -r d; do find -L "$d/nvidia" -maxdepth 4 -name cublas_v2.h 2>/dev/null; done | head -n1)"
      fi
      [ -f "$header" ] || fail "no cuBLAS in $cuda nor in the Python packages (GPU_KV_CUBLAS names one)"
      inc="$(dirname "$header")"; lib="$(dirname "$inc")/lib"
      rm -rf "$shim"; mkdir -p "$shim/include" "$shim/lib"
      ln -s "$inc"/cublas*.h "$shim/include/"
      for l in libcublas libcublasLt; do
        f="$(ls "$lib/$l".so.* | awk '{ print length, $0 }' | sort -n | head -n1 | cut -d' ' -f2)"
        [ -n "$f" ] || fail "no $l beside $inc"
        ln -sf "$f" "$shim/lib/$l.so"; ln -sf "$f" "$shim/lib/$(basename "$f")"
      done
      CMAKE_EXTRA+=" -DCUDA_cublas_LIBRARY=$shim/lib/libcublas.so -DCUDA_cublasLt_LIBRARY=$shim/lib/libcublasLt.so"
      CMAKE_EXTRA+=" -DCMAKE_CUDA_FLAGS=-I$shim/include"
      lib="$shim/lib:$lib"
    fi
    CMAKE_EXTRA+=" ${GPU_KV_CMAKE_ARGS:-}"
    echo "cuBLAS: headers $inc, libraries $lib"
    export LD_LIBRARY_PATH="$lib:$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  mark preflight_s $((SECONDS - t))
}

optional_sides() {  # the smg and contextpilot sides, from $BUNDLE/sides/<side>/ (scripts/fetch_kv_wheels.sh)
  local side dir
  EXTRA_SIDES=""
  for side in smg contextpilot; do
    dir="$BUNDLE/sides/$side"
    if [ ! -f "$dir/requirements.txt" ]; then
      echo "$side side: no wheels in $dir (scripts/fetch_kv_wheels.sh $side): dropped"; continue
    fi
    # a folder per side: pip --target --upgrade replaces a folder (bin/) another install wrote
    timeout 120 "$PY" -m pip install -q --no-index --find-links "$dir" --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$WORK/sides/$side" -r "$dir/requirements.txt" \
      || { echo "$side side: installing the wheels of $dir failed: dropped"; continue; }
    export PYTHONPATH="$PYTHONPATH:$WORK/sides/$side"
    if [ "$side" = smg ]; then
      export RAGPROXY_SMG="$WORK/sides/smg/bin/smg"
      timeout 60 "$RAGPROXY_SMG" launch --help >/dev/null 2>&1 \
        || { echo "smg side: $RAGPROXY_SMG launch --help failed: dropped"; unset RAGPROXY_SMG; continue; }
    else
      timeout 60 "$PY" -c "from contextpilot.server.live_index import ContextPilot" \
        || { echo "contextpilot side: its library mode does not import: dropped"; continue; }
    fi
    echo "$side side: installed from $dir"
    EXTRA_SIDES+=",$side"
  done
  # the fleet side (GPU_KV_SIDES=...,fleet: proxies in shared mode) starts a redis-server of its own
  echo "fleet side: redis-server $(command -v redis-server || echo 'not found: the bench drops the side')"
}

build() {
  local t=$SECONDS src="$WORK/llama.cpp"
  if [ -n "${RAGPROXY_LLAMA_SERVER:-}" ]; then
    SERVER="$RAGPROXY_LLAMA_SERVER"; VOCAB="${GPU_KV_VOCAB:-$HOME/.cache/ragproxy/vocab/ggml-vocab-llama-spm.gguf}"
    echo "using $SERVER (no build)"; return 0
  fi
  [ -f "$src/CMakeLists.txt" ] || { [ -f "$BUNDLE/llama.cpp.tar.gz" ] || fail "no $BUNDLE/llama.cpp.tar.gz: run scripts/gpu_kv_bundle.sh"; tar -C "$WORK" -xzf "$BUNDLE/llama.cpp.tar.gz"; }
  local b mode=()
  b=$(budget 480 150)
  [ "${GPU_KV_STOP_AFTER:-}" = configure ] && mode=(--configure)
  echo "build budget ${b}s ${mode[*]}"
  RAGPROXY_LLAMA_CACHE="$WORK/cache" LLAMA_CPP_SOURCE="$src" LLAMA_CMAKE_ARGS="$CMAKE_EXTRA" JOBS="${JOBS:-$(nproc)}" \
    timeout "$b" bash "$ROOT/scripts/build_llama_server.sh" "${mode[@]}" 2>&1 \
    | grep --line-buffered -E '^\[[0-9]+/[0-9]+\]|error|FAILED|llama-server$|configured|CMake (Error|Warning)|CUDA'
  local rc=${PIPESTATUS[0]}
  mark build_s $((SECONDS - t))
  if [ "${GPU_KV_STOP_AFTER:-}" = configure ]; then
    [ "$rc" -eq 0 ] || fail "configure (rc=$rc)"
    return 0
  fi
  [ "$rc" -eq 0 ] || fail "build (rc=$rc; 124 = out of time: run again on the same machine to continue it)"
  SERVER="$WORK/cache/llama-server"; VOCAB="$WORK/cache/vocab/ggml-vocab-llama-spm.gguf"
  "$SERVER" --version 2>&1 | tail -n2
}

write_models() {  # in the background, beside the build
  local small=tiny big=tiny type=f16
  if [ -z "$CPU" ]; then
    small=1b; big=8b
    type=${GPU_KV_TYPE:-$([ "$GPU_MIB" -ge 100000 ] && echo f16 || echo q8_0)}
  fi
  MODEL_SEQ="$WORK/models/$small-f16.gguf"; MODEL_LOAD="$WORK/models/$big-$type.gguf"; LOAD_SHAPE="$big-$type"
  ( for _ in $(seq 120); do [ -f "$VOCAB" ] && break; sleep 1; done   # the build script copies it first
    for spec in "$small f16 $MODEL_SEQ" "$big $type $MODEL_LOAD"; do
      set -- $spec
      [ -f "$3" ] || "$PY" "$ROOT/scripts/make_tiny_gguf.py" --shape "$1" --type "$2" --vocab "$VOCAB" --out "$3" || exit 1
    done ) > "$WORK/models.log" 2>&1 &
  MODELS_PID=$!
}

bench() {  # bench NAME TIMEOUT BENCH ARGS...: python -m loadtest.bench BENCH ARGS, its JSON line to $OUT/NAME.json
  local name=$1 limit=$2 module=$3 t=$SECONDS; shift 3
  [ "$limit" -ge 30 ] || { echo "skipping $name: ${limit}s left"; mark "${name}_skipped" "$(left)s left"; return 1; }
  RAGPROXY_LLAMA_SERVER="$SERVER" timeout "$limit" "$PY" -m loadtest.bench "$module" --json "$@" | tee "$WORK/$name.out"
  local rc=${PIPESTATUS[0]}
  tail -n1 "$WORK/$name.out" | grep '^{' > "$OUT/$name.json" || { rm -f "$OUT/$name.json"; echo "no JSON from $name (rc=$rc)"; }
  mark "${name}_s" $((SECONDS - t))
  return "$rc"
}

main() {
  echo "ragproxy $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); steps: $STEPS; deadline ${DEADLINE}s"
  preflight
  [ "${GPU_KV_STOP_AFTER:-}" = preflight ] && return 0
  if [ -z "${RAGPROXY_LLAMA_SERVER:-}" ]; then VOCAB="$WORK/cache/vocab/ggml-vocab-llama-spm.gguf"; else VOCAB="${GPU_KV_VOCAB:-$HOME/.cache/ragproxy/vocab/ggml-vocab-llama-spm.gguf}"; fi
  [ "${GPU_KV_STOP_AFTER:-}" = configure ] || write_models
  build
  [ "${GPU_KV_STOP_AFTER:-}" = configure ] && return 0
  wait "$MODELS_PID" || { cat "$WORK/models.log"; fail "writing the models"; }
  cat "$WORK/models.log"; ls -l "$WORK/models"
  local gpu=() extra=()
  [ -z "$CPU" ] && gpu=(--server-arg=-ngl --server-arg=99)
  # both sides' replicas get the same flags: every layer on the GPU, FlashAttention on (with its kernels built),
  # else off and no host prompt cache (whose row-by-row copies of the transposed V cache are what is measured)
  local fair=(--server-arg=-fa --server-arg=on) reserve=20
  [ "$FA" = 1 ] || fair=(--server-arg=-fa --server-arg=off --cache-ram 0)
  [[ " $STEPS " == *" load "* ]] && reserve=$LOAD_MIN_S
  if [[ " $STEPS " == *" seq "* ]]; then
    # two sides and the knee search, as budgeted: the smg and preserve sides and the capacity sweep take more
    # replicas' memory and more than one run's minutes
    bench seq_fair "$(budget 90 "$reserve")" kv --quick --sides direct,proxy --model "$MODEL_SEQ" "${gpu[@]}" \
      "${fair[@]}"
    bench seq_fa_off "$(budget 90 "$reserve")" kv --quick --sides direct,proxy --model "$MODEL_SEQ" "${gpu[@]}" \
      --server-arg=-fa --server-arg=off
  fi
  if [[ " $STEPS " == *" load "* ]]; then
    read -r -a extra <<< "${GPU_KV_LOAD_ARGS:-}"
    if [ "$(left)" -ge "$LOAD_MIN_S" ] || [ -n "$CPU" ]; then
      bench load "$(budget 400 10)" kv_load --quick --search --sides "${GPU_KV_SIDES:-direct,proxy$EXTRA_SIDES}" \
        --model "$MODEL_LOAD" "${gpu[@]}" \
        "${fair[@]}" "${extra[@]}"
    else
      echo "skipping the load run: $(left)s left (GPU_KV_STEPS=load on the same machine reuses the build)"
      mark load_skipped "$(left)s left"
    fi
  fi
  summarize
  mark total_s $((SECONDS - T0))
}

summarize() {
  "$PY" - "$OUT" "${GPU_NAME:-CPU}" "${LOAD_SHAPE:-?}" <<'PYEOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out, device, shape = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
print(f"device: {device}")
for name in ("seq_fair", "seq_fa_off"):
    path = out / f"{name}.json"
    if not path.exists():
        print(f"{name}: no result"); continue
    r = json.loads(path.read_text())
    print(f"{name} ({r['shape']}): TTFT p50 direct {r['ttft_p50_direct_ms']} ms -> proxy {r['ttft_p50_proxy_ms']} ms "
          f"(x{r['ttft_speedup']}; the prefill saved allows x{r['prefill_bound_speedup']}); reuse "
          f"{r['prefix_token_reuse_direct']} -> {r['prefix_token_reuse']} (ceiling {r['prefix_token_reuse_ceiling']}); "
          f"prefill bound vs {r.get('prefill_bound_peer')}: time {r.get('prefill_bound_time')}, tokens "
          f"{r.get('prefill_bound_tokens')}; "
          f"prefill share of TTFT direct {r['prefill_share_direct']}, proxy {r['prefill_share']}; host prompt-cache "
          f"ms per request direct {r['prompt_cache_ms_per_request_direct']}, proxy {r['prompt_cache_ms_per_request']}")
path = out / "load.json"
if path.exists():
    r = json.loads(path.read_text())
    print(f"load ({shape}): objective {r['slo_ms']} ms; goodput_ratio {r['goodput_ratio']} at {r['goodput_ratio_rate']}"
          f"/s; TTFT p99 ratio at low load {r['ttft_p99_ratio_low_load']}; reuse/ceiling {r['reuse_vs_ceiling']}; "
          f"prefill bound vs {r.get('prefill_bound_peer')}: time {r.get('prefill_bound_time')}, tokens "
          f"{r.get('prefill_bound_tokens')}")
    if r.get("capacity_ratio_vs_smg") is not None:
        print(f"  capacity proxy / smg {r['capacity_ratio_vs_smg']} CI {r.get('capacity_ratio_vs_smg_ci')}")
    if r.get("capacity_ratio_vs_one_proxy") is not None:
        print(f"  capacity {r['proxies']} proxies / one {r['capacity_ratio_vs_one_proxy']} CI "
              f"{r['capacity_ratio_vs_one_proxy_ci']}")
    for row in r["rates"]:
        d, p = row["direct"], row["proxy"]
        print(f"  {row['rate']}/s: direct {d['goodput_rps']}/s ({d['attainment']:.0%}), proxy {p['goodput_rps']}/s "
              f"({p['attainment']:.0%}, {p['rejected']} refused)")
else:
    print("load: no result")
PYEOF
}

export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
: > "$OUT/steps.txt"
main "$@" 2>&1 | while IFS= read -r line || [ -n "$line" ]; do printf '%(%H:%M:%S)T %s\n' -1 "$line"; done | tee -a "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
