#!/usr/bin/env bash
# The engine's H200 rows in one device call (under 10 minutes):
#   STRATA_GIT_SHA=<sha> OUT=$OUT bash benchmarks/run_engine_gpu.sh
# engine GPU tests; the profiler's fused MoE rates into profiles/h200.yaml's copy (profiler-fused-moe);
# fused_moe host time (kernels-moe-host); the engine on the synthetic kimi-k3.1-pro@5moe model (engine).
# Then here: cp <files_at>/*.json benchmarks/results/; cp <files_at>/h200.yaml profiles/; python benchmarks/summarize.py
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
OUT=${OUT:-/tmp/engine_gpu}; t0=$(date +%s); mkdir -p "$OUT"
source benchmarks/device_setup.sh
left() { echo $(( $1 - ($(date +%s) - t0) )); }
timeout 120 python3 -m pytest -q tests/test_engine_store.py tests/test_engine_runtime.py tests/test_engine_run.py \
  tests/test_kernels_moe_calls.py tests/test_profiler_moe.py -p no:cacheprovider -rs -o addopts="" 2>&1 | tail -8
timeout 90 python3 benchmarks/bench_fused_moe_rates.py --profile h200 --out-dir "$OUT" 2>&1 | tail -4
timeout 60 python3 benchmarks/bench_moe_host.py --out-dir "$OUT" 2>&1 | tail -6
timeout "$(left 580)" python3 benchmarks/bench_engine.py --dir /root/kimi5 --tokens 32 --warmup 16 --out-dir "$OUT" \
  2>&1 | tee "$OUT/bench_engine.log" | grep -v '^ "'
echo "run_engine_gpu: $(( $(date +%s) - t0 ))s"
