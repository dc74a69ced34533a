#!/usr/bin/env bash
# The test command: the default suite (no llama-server build, no long load tests), two workers.
# Slow suites: scripts/test.sh -m slow ; real llama.cpp suite: scripts/test.sh -m llama (after scripts/build_llama_server.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "redis-server is required (apt-get install redis-server)" >&2; exit 1; }
exec python -m pytest -n 2 -q "$@"
