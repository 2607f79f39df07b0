#!/usr/bin/env bash
# Build llama.cpp's llama-server (the peer for `bench/serve.py --peer llama-server`)
# from the llama-cpp-python sdist's vendored llama.cpp. Nothing of llama.cpp is
# kept in this repository: the sdist is downloaded from PyPI into a temporary
# directory, only the llama-server target is built, and the binary is copied out.
#
# Usage: scripts/build_llama_server.sh [PREFIX]
#   PREFIX     directory that receives `llama-server`
#              (default: ~/.cache/libremax/llama-server/<variant>)
# Environment:
#   LLAMA_SERVER_VARIANT  native (default: -DGGML_NATIVE=ON) or avx2
#                         (-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
#   LLAMA_CPP_PYTHON_VERSION  sdist version (default 0.3.36)
#   JOBS                  parallel compile jobs (default 2)
#   PYTHON                python with pip (default: python3)
# Idempotent: exits at once when PREFIX/llama-server already exists.
set -euo pipefail

VARIANT="${LLAMA_SERVER_VARIANT:-native}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-python3}"

case "$VARIANT" in
  native) ISA_FLAGS=(-DGGML_NATIVE=ON) ;;
  avx2)   ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON) ;;
  *) echo "build_llama_server: LLAMA_SERVER_VARIANT must be 'native' or 'avx2', got '$VARIANT'" >&2; exit 2 ;;
esac

PREFIX="${1:-$HOME/.cache/libremax/llama-server/$VARIANT}"
TARGET="$PREFIX/llama-server"
if [ -x "$TARGET" ]; then
  echo "build_llama_server: $TARGET already exists; nothing to do"
  exit 0
fi

for tool in cmake "$PYTHON"; do
  command -v "$tool" >/dev/null || { echo "build_llama_server: '$tool' not found on PATH" >&2; exit 1; }
done
command -v c++ >/dev/null || command -v g++ >/dev/null || { echo "build_llama_server: no C++ compiler (c++/g++) on PATH" >&2; exit 1; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "build_llama_server: downloading llama-cpp-python==$VERSION sdist into $WORK"
# --no-binary only for llama-cpp-python: with ':all:' pip would also build every build
# dependency of scikit-build-core from source just to read the sdist's metadata.
"$PYTHON" -m pip download "llama-cpp-python==$VERSION" --no-binary llama-cpp-python --no-deps -d "$WORK" -q
SDIST="$(ls "$WORK"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1 || true)"
[ -n "$SDIST" ] || { echo "build_llama_server: no sdist found after pip download" >&2; exit 1; }
tar -xzf "$SDIST" -C "$WORK"
SRC="$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp | head -n1)"
[ -f "$SRC/CMakeLists.txt" ] || { echo "build_llama_server: $SRC has no CMakeLists.txt" >&2; exit 1; }

echo "build_llama_server: configuring ($VARIANT: ${ISA_FLAGS[*]})"
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF "${ISA_FLAGS[@]}"
echo "build_llama_server: compiling llama-server with -j$JOBS at nice 19 (several minutes)"
nice -n 19 cmake --build "$WORK/build" --config Release --target llama-server -j"$JOBS"

BIN="$(find "$WORK/build" -type f -name llama-server -perm -u+x | head -n1)"
[ -n "$BIN" ] || { echo "build_llama_server: build finished but no llama-server binary found" >&2; exit 1; }
mkdir -p "$PREFIX"
cp "$BIN" "$TARGET.tmp" && mv "$TARGET.tmp" "$TARGET"
echo "build_llama_server: installed $TARGET"
