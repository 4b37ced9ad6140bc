#!/usr/bin/env bash
# Build the ATen (PyTorch C++) harness aten_mlp.cpp against the headers and shared libraries
# that the torch pip wheel ships (torch/include, torch/lib). Prints the binary's path.
#
#   PEERS_VENV  the venv with torch installed (default /work/peers/venv)
#   BUILD_DIR   where the binary goes (default target/peers)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PEERS_VENV="${PEERS_VENV:-/work/peers/venv}"
BUILD_DIR="${BUILD_DIR:-$ROOT/target/peers}"
PY="$PEERS_VENV/bin/python"
test -x "$PY" || { echo "no python in $PEERS_VENV (see benches/peers/README.md)" >&2; exit 1; }
TORCH="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
ABI="$("$PY" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')"
test -f "$TORCH/include/ATen/ATen.h" || { echo "ATen headers not found in $TORCH/include" >&2; exit 1; }

mkdir -p "$BUILD_DIR"
OUT="$BUILD_DIR/aten_mlp"
if [ ! -x "$OUT" ] || [ "$HERE/aten_mlp.cpp" -nt "$OUT" ]; then
  ${CXX:-g++} -O2 -std=c++20 -D_GLIBCXX_USE_CXX11_ABI="$ABI" \
    -isystem "$TORCH/include" -isystem "$TORCH/include/torch/csrc/api/include" \
    "$HERE/aten_mlp.cpp" \
    -L"$TORCH/lib" -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10 -Wl,--as-needed \
    -Wl,-rpath,"$TORCH/lib" -o "$OUT"
fi
echo "$OUT"
