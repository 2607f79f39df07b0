#!/usr/bin/env bash
# The main job on a fresh machine (does all set-up itself): generate text offline with the
# bundled default model (SmolLM2-135M-Instruct).  Extra arguments go to `max generate`,
# e.g. scripts/main.sh --prompt "Once upon a time" --max-new-tokens 100
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/max generate "$@"
