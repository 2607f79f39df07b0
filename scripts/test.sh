#!/usr/bin/env bash
# Run the whole test suite on a fresh machine (does all set-up itself).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/driver -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
workers=${LIBREMAX_TEST_WORKERS:-$(nproc)}
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" "$@"
