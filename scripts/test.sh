#!/usr/bin/env bash
# The test command: the default suite on two workers; it needs redis-server and nothing else (tests that need another
# program skip, and -rs lists each skip with its reason at the end).
# Kept out of the default run (README, "The test command"): scripts/test.sh -m browser (Chromium), -m long,
# -m slow, -m llama (after scripts/build_llama_server.sh). A -m given here replaces the default selection.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "redis-server is required (apt-get install redis-server)" >&2; exit 1; }
exec python -m pytest -n 2 -q -rs "$@"
