#!/usr/bin/env bash
# The GPU device check (issue 40): one command that proves the GPU path on the H200 within 8 minutes.
#
# Prepare here (once per change of requirements-device.txt), then try the dry run:
#   bash scripts/fetch_device_wheels.sh          # .whl/: the wheels the image lacks (~9 MiB), size checked
#   bash scripts/device_check.sh --dry-run       # the same steps without a GPU (tests/test_device_check.py)
# On the GPU machine, with the device tool (the repository root is the working directory there):
#   run(command="bash scripts/device_check.sh", carry=[".whl"], timeout_s=560)
# Everything it writes lands flat in $OUT (6 files): summary.json, device_check.log, steps.tsv,
# junit_ops.xml, junit_gpu.xml, bench.json.
#
# Steps (and their time limits on the GPU; DEVICE_CHECK_BUDGET_S, default 480, bounds the whole):
#   0. environment: nvidia-smi, python, torch and CUDA versions
#   1. install: the carried wheels into /tmp/site (pip --no-index --no-deps --target), libremax from src/ by
#      PYTHONPATH (no build, nothing fetched); an import check of every carried package
#      (dry run: the .whl/ folder is checked against requirements-device.txt instead: cp312 wheels do not
#      install into this host's Python)
#   2. tests_ops: tests/graph and the paged-attention kernel tests with LIBREMAX_TEST_DEVICE=gpu
#      (xdist -n 8, 120 s per test, OPS_TIMEOUT_S=150 for the group)
#   3. tests_gpu: every test marked gpu outside tests/graph (xdist -n 4, GPU_TIMEOUT_S=90)
#      (dry run: both groups collected, not run: their GPU tests cannot run here)
#   4. bench: bench/generate.py --devices gpu (bench/gpu_decode.py) on random bfloat16 checkpoints of the
#      SmolLM2-135M and Qwen2.5-Coder-1.5B shapes built there (no model can travel: the real ones are 0.1
#      and 3 GB); libremax beside transformers eager (and static cache + torch.compile for the 1.5B),
#      within what is left of the budget (dry run: a 2-layer model on the CPU, every engine in one process)
#   5. summary: $OUT/summary.json (pass/fail counts, step times, benchmark figures and acceptance ratios)
set -uo pipefail
DRY=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out/device_check}
mkdir -p "$OUT"
rm -f "$OUT"/summary.json "$OUT"/steps.tsv "$OUT"/junit_*.xml "$OUT"/bench.json "$OUT"/device_check.log
exec > >(tee -a "$OUT/device_check.log") 2>&1
PY=${PYTHON:-python3}
BUDGET=${DEVICE_CHECK_BUDGET_S:-480}
START=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
elapsed() { echo $(( $(date +%s) - START )); }
step() {  # step NAME STATUS SECONDS REASON
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$OUT/steps.tsv"
  echo "[device-check] $1: $2 ($3 s) $4"
}

# ---------------------------------------------------------------------------- 0. environment
echo "[device-check] $(date -u +%FT%TZ) mode=$([ $DRY = 1 ] && echo dry-run || echo gpu) python=$PY"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
ENV_LINE=$("$PY" -c "import sys, torch; print(int(torch.cuda.is_available()), 'python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tail -1)
echo "[device-check] ${ENV_LINE#* }"
HAS_GPU=${ENV_LINE%% *}
# DEVICE_CHECK_FORCE=1: the GPU steps even without a GPU (to try this script's own logic; they then fail)
if [ "$DRY" = 0 ] && [ "$HAS_GPU" != 1 ] && [ "${DEVICE_CHECK_FORCE:-0}" != 1 ]; then
  echo "[device-check] no CUDA device here: run with --dry-run" >&2
  step environment failed 0 "torch.cuda.is_available() is False"
  "$PY" scripts/device_check.py summary "$OUT" gpu
  exit 1
fi
if [ "$DRY" = 1 ]; then why="dry run: no GPU used"; elif [ "$HAS_GPU" = 1 ]; then why="GPU found"
else why="DEVICE_CHECK_FORCE=1 without a GPU: the GPU steps will fail"; fi
step environment ok "$(elapsed)" "$why"

# ---------------------------------------------------------------------------- 1. install
t=$(date +%s)
if [ "$DRY" = 1 ]; then
  if "$PY" scripts/device_check.py wheels; then
    if [ -d .whl ]; then step install ok $(( $(date +%s) - t )) "dry run: .whl/ matches requirements-device.txt (not installed: cp312 wheels)"
    else step install skipped $(( $(date +%s) - t )) "dry run: no .whl/ folder (scripts/fetch_device_wheels.sh makes it)"; fi
  else
    step install failed $(( $(date +%s) - t )) ".whl/ does not match requirements-device.txt"
  fi
  export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
else
  if [ -d .whl ] && "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target /tmp/site .whl/*.whl; then
    export PYTHONPATH="$ROOT/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    if "$PY" -c "import max, max.engine, max.pipelines, gguf, msgspec, llguidance, fastapi, uvicorn, soundfile, soxr, python_multipart, opentelemetry, pydantic; print('imports ok')"; then
      step install ok $(( $(date +%s) - t )) "wheels into /tmp/site, libremax from src/"
    else
      step install failed $(( $(date +%s) - t )) "an import failed after installing the wheels"
    fi
  else
    export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
    step install failed $(( $(date +%s) - t )) "no .whl/ carried or pip install failed (carry=[\".whl\"])"
  fi
fi

# ---------------------------------------------------------------------------- 2./3. tests
# DEVICE_CHECK_OPS_TESTS / DEVICE_CHECK_GPU_TESTS (space-separated paths) narrow the groups for a quick try
read -r -a OPS_TESTS <<< "${DEVICE_CHECK_OPS_TESTS:-tests/graph tests/nn/test_kernels_attention.py tests/nn/test_kernels_decoder.py tests/nn/test_kernels_chunked_attention.py}"
if [ -n "${DEVICE_CHECK_GPU_TESTS:-}" ]; then read -r -a GPU_TESTS <<< "$DEVICE_CHECK_GPU_TESTS"
else mapfile -t GPU_TESTS < <("$PY" scripts/device_check.py gpu-files tests/graph); fi
TIMEOUT_ARGS=()
"$PY" -c "import pytest_timeout" 2>/dev/null && TIMEOUT_ARGS=(--timeout=120)
run_group() {  # run_group NAME LIMIT_S XDIST_WORKERS PYTEST_ARGS...
  local name=$1 limit=$2 workers=$3; shift 3
  local t0; t0=$(date +%s)
  if [ "$DRY" = 1 ]; then
    local n st=skipped
    n=$("$PY" -m pytest -q -p no:cacheprovider --collect-only "$@" 2>&1 | tail -1)
    case "$n" in *" collected"*) ;; *) st=failed ;; esac
    step "tests_$name" "$st" $(( $(date +%s) - t0 )) "dry run: no GPU, collected only: $n"
    return
  fi
  local left=$(( BUDGET - $(elapsed) - 200 ))  # keep 200 s for the benchmark
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then step "tests_$name" skipped 0 "time budget spent"; return; fi
  timeout -s INT -k 20 "$limit" "$PY" -m pytest -q -p no:cacheprovider -n "$workers" "${TIMEOUT_ARGS[@]}" \
    --junitxml="$OUT/junit_$name.xml" "$@"
  local rc=$?
  local status=ok reason="pytest exit $rc"
  [ $rc -ne 0 ] && status=failed
  [ $rc -eq 124 ] || [ $rc -eq 130 ] && reason="stopped at the group's limit of $limit s (pytest exit $rc)"
  step "tests_$name" "$status" $(( $(date +%s) - t0 )) "$reason"
}
LIBREMAX_TEST_DEVICE=gpu run_group ops "${OPS_TIMEOUT_S:-150}" 8 "${OPS_TESTS[@]}"
run_group gpu "${GPU_TIMEOUT_S:-90}" 4 -m gpu "${GPU_TESTS[@]}"

# ---------------------------------------------------------------------------- 4. benchmark
t=$(date +%s)
if [ "$DRY" = 1 ]; then
  "$PY" bench/generate.py --devices cpu --models tiny --engines libremax,transformers --new-tokens 4 \
    --prompt-tokens 16 --batches 1,2 --inline --budget-s 120 --json "$OUT/bench.json"
  rc=$?
  reason="dry run: a 2-layer model on the CPU (GPU figures need the GPU)"
else
  left=$(( BUDGET - $(elapsed) - 15 ))
  "$PY" bench/generate.py --devices gpu --budget-s "$left" --workdir /tmp/lmx-gpu-bench --json "$OUT/bench.json"
  rc=$?
  reason="random bfloat16 checkpoints of the real shapes, built here; budget $left s"
fi
if [ $rc -eq 0 ] && [ -s "$OUT/bench.json" ]; then step bench ok $(( $(date +%s) - t )) "$reason"
else step bench failed $(( $(date +%s) - t )) "exit $rc; $reason"; fi

# ---------------------------------------------------------------------------- 5. summary
"$PY" scripts/device_check.py summary "$OUT" "$([ $DRY = 1 ] && echo dry-run || echo gpu)"
echo "[device-check] done in $(elapsed) s; results in $OUT"
grep -q $'\tfailed\t' "$OUT/steps.tsv" && exit 1
exit 0
