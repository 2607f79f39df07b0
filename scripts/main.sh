#!/usr/bin/env bash
# The main job on a fresh machine (does all set-up itself).
# Until the generation pipeline lands this runs the examples/ programs that
# exercise what exists: device listing, buffer round trips, a compiled graph.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
for ex in examples/*.py; do
    echo "=== $ex"
    .venv/bin/python "$ex"
done
