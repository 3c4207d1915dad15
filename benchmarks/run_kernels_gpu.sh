#!/usr/bin/env bash
# One call on a GPU machine (the device tool): install, the kernel tests on CUDA, then the benchmark.
#   OUT=dir bash benchmarks/run_kernels_gpu.sh [total s, default 290] [test seconds] [pytest -k expr] [bench args...]
# Tests and the benchmark's parallel kernel compilation run side by side; timing starts after both.
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
OUT=${OUT:-/tmp/kernels_out}; TOTAL=${1:-290}; TEST_S=${2:-120}; TEST_K=${3:-}; shift $(( $# < 3 ? $# : 3 )); t0=$(date +%s)
mkdir -p "$OUT"
source benchmarks/device_setup.sh
python3 -c "import torch, triton, strata_plan.kernels.ops as o; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))" || exit 3
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
(timeout "$TEST_S" python3 -m pytest tests/test_kernels_triton.py tests/test_kernels_moe_calls.py tests/test_kernels_quantize.py tests/test_kernels_gluon.py -q -rfE --tb=short --dist loadgroup \
   -n 6 -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} > "$OUT/tests.log" 2>&1; echo "tests exit $?" >> "$OUT/tests.log") &
TESTS=$!
timeout 160 python3 benchmarks/bench_kernels.py --prewarm 8 --prewarm-only "$@" 2>&1 | tail -3
wait $TESTS; grep -v "PytestBenchmarkWarning\|warner(" "$OUT/tests.log" | tail -40
LEFT=$(( TOTAL - ($(date +%s) - t0) - 10 ))
echo "benchmark budget ${LEFT}s"
python3 benchmarks/bench_kernels.py --out-dir "$OUT" --budget-s "$LEFT" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "^\s*$"
echo "total $(( $(date +%s) - t0 ))s"
