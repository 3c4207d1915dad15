#!/usr/bin/env bash
# One device call: the GPU-marked tests (kernels on CUDA, profiler GPU paths), then a full
# `strata-plan profile` of the machine (it also records each packed format's fused-GEMV GB/s).
#   OUT=dir bash benchmarks/run_gpu_suite.sh [test seconds, default 220] [profile seconds, default 220]
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
OUT=${OUT:-/tmp/gpu_suite}; TEST_S=${1:-220}; PROF_S=${2:-220}; t0=$(date +%s)
mkdir -p "$OUT"
source benchmarks/device_setup.sh
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))" || exit 3
timeout "$TEST_S" python3 -m pytest tests/test_kernels_triton.py tests/test_kernels_quantize.py tests/test_kernels_compile.py \
  tests/test_profiler_gpu.py -q -rfEs --tb=short -n 8 -p no:cacheprovider 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  | tee "$OUT/gpu-tests.log" | tail -25
echo "tests done at $(( $(date +%s) - t0 ))s"
timeout "$PROF_S" python3 -m strata_plan.cli profile --nvme-dir /var/tmp --max-gib 4 --pin-cap-gib 32 --name h200 \
  --out "$OUT/h200.yaml" > "$OUT/profile.log" 2>&1; echo "profile exit $?" >> "$OUT/profile.log"
tail -15 "$OUT/profile.log"
echo "total $(( $(date +%s) - t0 ))s"
