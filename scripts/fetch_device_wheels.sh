#!/usr/bin/env bash
# Download the wheels the GPU machine's image lacks (requirements-device.txt) into .whl/ (ignored by git) as
# CPython 3.12 manylinux x86_64 wheels, with the pip download command /work/.library/device/README.md gives
# (plus the manylinux_2_N tags some of these wheels carry), then check that the wheels and the working tree
# that travels with them stay under the device tool's 64 MiB.
#   bash scripts/fetch_device_wheels.sh [PYTHON]      (default: .venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
LIMIT=$((64 * 1024 * 1024))
rm -rf .whl && mkdir -p .whl
grep -v '^\s*#' requirements-device.txt | grep -v '^\s*$' > .whl/.requirements
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
  --platform manylinux_2_35_x86_64 \
  -d .whl -r .whl/.requirements
rm -f .whl/.requirements
"$PY" scripts/device_check.py wheels --strict
wheels=$(du -cb .whl/*.whl | tail -1 | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
untracked=$( (git ls-files -z --others --exclude-standard | xargs -0 -r du -cb | tail -1 | cut -f1) || echo 0)
total=$((wheels + tree + ${untracked:-0}))
echo "wheels: $wheels bytes; tracked tree: $tree bytes; untracked, not ignored: ${untracked:-0} bytes;" \
     "together $total of $LIMIT"
if [ "$total" -ge "$LIMIT" ]; then
  echo "over the device tool's 64 MiB: carry less" >&2
  exit 1
fi
