#!/usr/bin/env bash
# eagervm against PyTorch (ATen C++ and Python) and MXNet's engine, in the same run, with
# ratios. benches/peers/README.md says how to install the peers.
#
#   benches/peers/run.sh                 # the CPU: 3 rounds at -n 10^6
#   benches/peers/run.sh --rounds 5 -n 200000
#   benches/peers/run.sh --cuda          # on a GPU machine: the run-mlp step on cuda:0
#   benches/peers/run.sh --busy 0,1,2    # against ATen beside 0, 1 and 2 busy loops, with slowdowns
#
# Any other argument goes to compare.py (--reps, --cuda-steps, --json-out FILE, --busy LIST).
#   PEERS_VENV   venv with torch (default /work/peers/venv)
#   TORCH_PYTHON a python with torch, if not the venv's (e.g. a GPU machine's system python)
#   MXNET_VENV   venv with mxnet==1.9.1 (default /work/peers/mxnet-venv); skipped if missing
#   MXNET_HARNESS  the MXNet engine harness's directory (default ../shared/baselines/mxnet-engine)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PEERS_VENV="${PEERS_VENV:-/work/peers/venv}"
MXNET_VENV="${MXNET_VENV:-/work/peers/mxnet-venv}"
MXNET_HARNESS="${MXNET_HARNESS:-$ROOT/../shared/baselines/mxnet-engine}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
CUDA=0
for a in "$@"; do [ "$a" = "--cuda" ] && CUDA=1; done

(cd "$ROOT" && cargo build --release --quiet)
ARGS=(--eagervm "$TARGET/release/eagervm")
TORCH_PYTHON="${TORCH_PYTHON:-$PEERS_VENV/bin/python}"
if [ -x "$TORCH_PYTHON" ] || command -v "$TORCH_PYTHON" > /dev/null; then
  ARGS+=(--torch-python "$TORCH_PYTHON")
  if [ "$CUDA" = 0 ] && [ -x "$PEERS_VENV/bin/python" ]; then
    ARGS+=(--aten "$(PEERS_VENV="$PEERS_VENV" BUILD_DIR="$TARGET/peers" "$HERE/build_aten.sh" | tail -n 1)")
  fi
else
  echo "run.sh: no PyTorch venv at $PEERS_VENV: PyTorch skipped (benches/peers/README.md)" >&2
fi
if [ "$CUDA" = 0 ] && [ -x "$MXNET_VENV/bin/python" ] && [ -x "$MXNET_HARNESS/build.sh" ]; then
  ARGS+=(--mxnet "$(MXNET_VENV="$MXNET_VENV" BUILD_DIR="$TARGET/peers/mxnet" "$MXNET_HARNESS/build.sh" | tail -n 1)")
elif [ "$CUDA" = 0 ]; then
  echo "run.sh: no MXNet venv at $MXNET_VENV or no harness at $MXNET_HARNESS: MXNet skipped" >&2
fi
exec "${PEERS_PYTHON:-python3}" "$HERE/compare.py" "${ARGS[@]}" "$@"
