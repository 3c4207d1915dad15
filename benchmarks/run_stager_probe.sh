#!/usr/bin/env bash
# One device call (about 5 minutes) for the NVMe stager's latency and the graph capture's failing cases:
#   STRATA_GIT_SHA=<sha> OUT=$OUT bash benchmarks/run_stager_probe.sh        # device `carry`: [".whl"]
# 1. tools/capture_probe.py: the streamed-dense decode steps captured with a check after every call (capture.log);
# 2. benchmarks/device_loop_tests.sh: the device loop's kernel and GPU-marked engine tests (gpu_tests.log);
# 3. tools/stager_handoff.py: the stager's thread hand-off on this host's CPU, the drive left out (handoff.log);
# 4. bench_trained on the seed budget only, after TRAIN_S (default 45) seconds of training: the stager's
#    host-side latency beside the GPU's wait (predicted with the committed quick profile of the same GPU model,
#    named in the JSON's command).
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/stager_probe}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/device_setup.sh
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
case "$GPU" in *H100*) PROFILE=benchmarks/data/run-20261205/h100-trained-162000.yaml ;;
               *) PROFILE=benchmarks/data/run-20261205/h200-run-131300.yaml ;; esac
timeout 150 python3 benchmarks/tools/capture_probe.py >"$OUT/capture.log" 2>&1; grep -E "^(OK|FAIL)" "$OUT/capture.log"
bash benchmarks/device_loop_tests.sh "$OUT/gpu_tests.log"
timeout 30 python3 benchmarks/tools/stager_handoff.py --requests 200 2>&1 | tee "$OUT/handoff.log" | tail -5
left=$(( ${LIMIT:-585} - ($(date +%s) - t0) ))
timeout "$left" python3 benchmarks/bench_trained.py --work /root/trained --out-dir "$OUT" --train-seconds "${TRAIN_S:-45}" \
  --budgets seed --skip transformers,equivalence --depths "${DEPTHS:-1,2}" --profile-predict "$PROFILE" \
  --deadline-s "$(( left - 20 ))" 2>&1 | tee "$OUT/bench_trained.log" | grep -E "MEASURED|hit rate|^seed|json|FAIL|Error"
echo "run_stager_probe: $(( $(date +%s) - t0 ))s"
