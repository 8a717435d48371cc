#!/usr/bin/env bash
# The CUDA checks and timings in one device call, results under $OUT.
#
# Before it, stage the onnxruntime-gpu wheel into /tmp/ortw on the device as
# ../shared/gpu/README.md describes (three `run` calls copying .ortgpu0-2, each with its carry);
# then, with carry [".ortgpu3"]:
#     cp .ortgpu3/part* /tmp/ortw/ && bash benchmarks/cuda_h200.sh
# It installs the wheel beside the machine's packages, runs the `cuda` tests, exports the
# BERT-base preset's encoder (fp32, fp32-opt, fp16; parity-checked on the CPU) and times it on the
# CUDA provider at the shapes the goals name, beside eager PyTorch fp32 and fp16 SDPA on the GPU
# (each fused precision also with its padding as key lengths: the `... lengths` variants).
# The `cuda` tests include a language model's (tests/runtime/test_cuda_causal.py: a trained Llama
# exported at fp32-opt and fp16, its cache bound on the device). The three steps are capped at
# 210 + 150 + 210 s, inside one call's 600 s.
set -uo pipefail
OUT=${OUT:-/tmp/edgeattn-cuda}
mkdir -p "$OUT"
WHEEL=${WHEEL:-/tmp/ortw/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl}
if [ ! -f "$WHEEL" ]; then
    cat /tmp/ortw/part0 /tmp/ortw/part1 /tmp/ortw/part2 /tmp/ortw/part3 > "$WHEEL" || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ortgpu "$WHEEL" || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
export PYTHONPATH=/tmp/ortgpu PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, onnxruntime as o; print(torch.__version__, o.__version__, o.get_available_providers())" \
    | tee -a "$OUT/gpu.txt"

timeout 210 python3 -m pytest -q -m cuda tests 2>&1 | tee "$OUT/cuda-tests.log"

timeout 150 python3 -m edgeattn.cli export --preset bert-base --graphs encoder --precision fp32-opt,fp16 \
    --allow-degraded -o /tmp/bert-base --force 2>&1 | tee "$OUT/export.log"
timeout 210 python3 -m edgeattn.cli bench /tmp/bert-base --providers CUDAExecutionProvider \
    --shapes 1x128,32x128,8x1024 --precision fp32,fp32-opt,fp16 --repeats 50 --no-peers \
    --json "$OUT/cuda-bert-base.json" 2>&1 | tee "$OUT/bench.log"
