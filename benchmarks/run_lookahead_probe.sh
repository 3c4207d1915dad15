#!/usr/bin/env bash
# One device call (under 10 minutes) for the lookahead's copies and the NVMe handshake on the GPU:
#   STRATA_GIT_SHA=<sha> OUT=$OUT [COPY_PROGRAMS=0,16] bash benchmarks/run_lookahead_probe.sh
# 1. the slot protocol's and the stager handshake's kernel tests, the GPU-marked tests of the engine's graph loop
#    (gpu_tests.log);
# 2. bench_engine on kimi5 RAM-rich: the plan, LRU-only, on-demand and the forced depth 1 at each of COPY_PROGRAMS
#    thread blocks of the copy kernel; predicted with the committed quick profile of the same GPU model
#    (benchmarks/data/run-20261205/: not measured in this call, labelled in the JSON's command).
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
OUT=${OUT:-/tmp/lookahead_probe}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/device_setup.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
case "$GPU" in *H100*) PROFILE=benchmarks/data/run-20261205/h100-run-153300.yaml ;;
               *) PROFILE=benchmarks/data/run-20261205/h200-run-131300.yaml ;; esac
bash benchmarks/device_loop_tests.sh "$OUT/gpu_tests.log"
left=$(( 585 - ($(date +%s) - t0) ))
timeout "$left" python3 benchmarks/bench_engine.py --dir /root/kimi5 --plans ramrich --tokens 32 --warmup 16 \
  --profile "$PROFILE" --out-dir "$OUT" --copy-programs "${COPY_PROGRAMS:-0,16}" --deadline-s "$(( left - 40 ))" 2>&1 \
  | tee "$OUT/bench_engine.log" | grep -v '^ "'
echo "run_lookahead_probe: $(( $(date +%s) - t0 ))s"
