#!/usr/bin/env bash
# The peers of edgeattn/families/causal/peers.py in their own environment (they need a newer
# transformers than the project's tests pin, and llama-cpp-python compiles llama.cpp from its
# source distribution: about 9 minutes on two cores). Usage: bash benchmarks/peers/setup.sh [DIR]
set -euo pipefail
VENV="${1:-${EDGEATTN_PEERS:-$HOME/.cache/edgeattn-peers}}"
python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip
$PIP install --quiet torch==2.13.0
$PIP install --quiet "onnxruntime-genai==0.18.*" "transformers>4.58" onnx onnx_ir numpy psutil sentencepiece
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" $PIP install --quiet --no-binary llama-cpp-python "llama-cpp-python[server]==0.3.36"
SRC="$($PIP download --quiet --no-deps --no-binary :all: "llama-cpp-python==0.3.36" -d "$VENV/src" >/dev/null && ls "$VENV"/src/llama_cpp_python-*.tar.gz)"
tar -xzf "$SRC" -C "$VENV/src"
echo "peers ready in $VENV"
