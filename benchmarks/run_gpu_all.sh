#!/usr/bin/env bash
# Every kernel headline row of BENCHMARKS.md at one commit, in two device calls of under 10 minutes each
# (benchmarks/README.md lists which command makes which row):
#   STRATA_GIT_SHA=<sha> OUT=$OUT bash benchmarks/run_gpu_all.sh 1
#       the kernel GPU tests; fused MoE decode (sweep, shipped, back to back: kernels-moe-sweep); GemLite,
#       single GEMVs, launch overhead, profiler GEMV (kernels); fused_moe host time (kernels-moe-host)
#   STRATA_GIT_SHA=<sha> OUT=$OUT bash benchmarks/run_gpu_all.sh 2
#       prefill GEMMs in bursts and back to back (kernels-prefill); fused MoE prefill (kernels-moe-prefill)
# GemLite (the baseline of the GemLite rows; pure Python over Triton, not on the GPU machine) goes as a wheel
# in .whl/, made here once and carried (device `carry`: [".whl"]):
#   python3 -m pip download --no-deps -d /tmp/gl gemlite==0.6.0.post2 && python3 -m pip wheel --no-deps /tmp/gl/gemlite-*.tar.gz -w .whl
# Without it those rows fail in one line ("No module named 'gemlite'") and every other row runs.
# Then here: cp <files_at>/*.json benchmarks/results/ && python benchmarks/summarize.py
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
PART=${1:?part 1 or 2}; OUT=${OUT:-/tmp/kernels_all}; t0=$(date +%s)
mkdir -p "$OUT"
source benchmarks/device_setup.sh
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))" || exit 3
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
left() { echo $(( $1 - ($(date +%s) - t0) )); }
if [ "$PART" = 1 ]; then
  (timeout 200 python3 -m pytest tests/test_kernels_triton.py tests/test_kernels_moe_calls.py tests/test_kernels_quantize.py \
     tests/test_kernels_gluon.py tests/test_kernels_tuned.py -q -rfE --tb=short --dist loadgroup -n 6 -p no:cacheprovider \
     > "$OUT/tests.log" 2>&1; echo "tests exit $?" >> "$OUT/tests.log") &
  TESTS=$!
  timeout 170 python3 benchmarks/bench_kernels.py --prewarm 8 --prewarm-only \
    --sections moe,gemlite,gemv_single,launch_overhead,measure_gemv_gbps 2>&1 | tail -2
  wait $TESTS; grep -v "PytestBenchmarkWarning\|warner(" "$OUT/tests.log" | tail -15
  python3 benchmarks/bench_kernels.py --out-dir "$OUT" --name kernels-moe-sweep --reps 10 --sweep-rounds 3 \
    --sections moe --budget-s "$(( $(left 560) - 150 ))" 2>&1 | tee "$OUT/bench-moe.log" | grep -v "^\s*$" | tail -12
  python3 benchmarks/bench_kernels.py --out-dir "$OUT" --name kernels --reps 10 --no-sweep --sustained-s 0 \
    --sections gemlite,gemv_single,launch_overhead,measure_gemv_gbps --budget-s "$(( $(left 560) - 40 ))" 2>&1 \
    | tee "$OUT/bench-kernels.log" | grep -v "^\s*$" | tail -8
  timeout "$(left 590)" python3 benchmarks/bench_moe_host.py --out-dir "$OUT" 2>&1 | tee "$OUT/host.log"
else
  timeout 150 python3 benchmarks/bench_kernels.py --prewarm 8 --prewarm-only --no-sweep --sections prefill,moe_prefill \
    2>&1 | tail -2
  python3 benchmarks/bench_kernels.py --out-dir "$OUT" --name kernels-prefill --reps 10 --no-sweep --sections prefill \
    --budget-s "$(( $(left 560) - 90 ))" 2>&1 | tee "$OUT/bench-prefill.log" | grep -v "^\s*$" | tail -12
  python3 benchmarks/bench_kernels.py --out-dir "$OUT" --name kernels-moe-prefill --reps 5 --no-sweep \
    --sections moe_prefill --budget-s "$(left 580)" 2>&1 | tee "$OUT/bench-moe-prefill.log" | grep -v "^\s*$" | tail -6
fi
echo "part $PART: $(( $(date +%s) - t0 ))s"
