#!/usr/bin/env bash
# The engine's H200 rows in one device call (under 10 minutes):
#   STRATA_GIT_SHA=<sha> OUT=$OUT [CALIBRATION=P.yaml] [PINNED_GB=64] [GPU_TESTS=]
#     [DEVICE_LOOP_LAYERS=5,24 [DEVICE_LOOP_FIRST=1]]
#     [KERNEL_TESTS=] [PREFETCH_COPY=] [END_S=590] [ENGINE_ARGS="--whole-landing"] bash benchmarks/run_engine_gpu.sh [PLANS]
#   (PLANS default ramrich,seed; predictions with the quick profile measured in the call, its layer times included, no
#   fitted constant; CALIBRATION=P.yaml: the calibration constants of P instead)
# 0. the device loop's kernel tests (LRU, lookahead slots and gate, RMSNorm, NVMe staging handshake, embedding gather) first, 100 s at
#    most: a kernel that misbehaves on the GPU shows before the benchmarks run it (kernel_tests.log);
# 1. a quick profile of this machine with kimi-k3.1-pro's decode layers timed (run-profile.yaml: the predictions are
#    re-run with its measured figures);
# 2. the engine on the synthetic kimi-k3.1-pro@5moe model, every plan in modes plan / lru / on-demand after the same
#    budget with every expert in VRAM (the reference tokens), each run beside its bound (engine-*.json; runs past
#    the deadline are listed as skipped); with PINNED_GB, the pinned-memory cost of a region that size against torch's;
# 3. (first, 60 s at most) benchmarks/bench_prefetch_copy.py: the lookahead copy kernel's rate by thread blocks;
# 4. with DEVICE_LOOP_LAYERS, benchmarks/bench_device_loop.py (host and GPU time a token by depth, qwen3-30b-a3b;
#    it plans with Optuna: carry .whl, see run_trained_gpu.sh's header);
#    (DEVICE_LOOP_FIRST=1: before step 1, within 200 s; the later marks stay)
# 5. the engine GPU tests, the device LRU's and the NVMe stager's among them (gpu_tests.log; GPU_TESTS= to skip).
# Each step ends by its mark (bench_engine 400 s, bench_device_loop 575 s, the rest 590 s, each moved earlier by
# 590 - END_S when the call runs something else first; a step with under 10 s left is skipped); KERNEL_TESTS= and
# PREFETCH_COPY= skip steps 0 and 3; the benchmarks save their JSON
# after every run, and a run that fails is recorded in its `errors` while the others go on.
# The seed plans' NVMe runs take ~25 s each (three modes, the forced-depth plan beside): run
# `ramrich` and `seed` in two calls.
# Then here: cp <files_at>/*.json benchmarks/results/; python benchmarks/summarize.py
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache
OUT=${OUT:-/tmp/engine_gpu}; t0=$(date +%s); mkdir -p "$OUT"
source benchmarks/device_setup.sh
END=${END_S:-590}
left() { echo $(( $1 - (590 - END) - ($(date +%s) - t0) )); }
by() { local l; l=$(left "$1"); [ "$l" -ge 10 ] && echo "$l"; }      # seconds to second $1 of the script, or none
upto() { local l; l=$(left 590); [ "$l" -gt "$1" ] && l=$1; [ "$l" -ge 10 ] && echo "$l"; }   # at most $1 s, or none
device_loop() {   # step 4, within $1 seconds
  if python3 -c "import optuna" 2>/dev/null; then
    timeout "$1" python3 benchmarks/bench_device_loop.py --dir /root/dl --layers "$DEVICE_LOOP_LAYERS" --out-dir "$OUT" \
      --deadline-s "$(( $1 * 2 / 3 ))" 2>&1 | tee "$OUT/bench_device_loop.log" | grep -v '^ "'
  else
    echo "bench_device_loop skipped: optuna is missing (carry .whl: run_trained_gpu.sh's header)"
  fi
}
CAL=${CALIBRATION-}   # constants of another profile YAML (default none: the quick profile's measured figures)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -n "${KERNEL_TESTS-1}" ]; then
  timeout 100 python3 -m pytest -q tests/test_kernels_stage_wait.py tests/test_kernels_lru.py tests/test_kernels_prefetch.py \
    tests/test_kernels_gate.py tests/test_kernels_norm.py tests/test_kernels_rope.py tests/test_lookahead_launches.py \
    tests/test_kernels_gather.py -p no:cacheprovider -rs -o addopts="" --tb=short >"$OUT/kernel_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/kernel_tests.log" | head -20
fi
if [ -n "${DEVICE_LOOP_LAYERS:-}" ] && [ -n "${DEVICE_LOOP_FIRST:-}" ]; then   # step 4 first, at most 200 s
  device_loop 200
fi
timeout 180 python3 -m strata_plan.cli profile --quick --nvme-dir /root --models kimi-k3.1-pro --out "$OUT/run-profile.yaml" \
  --force 2>&1 | tail -3
PROFILE=$([ -f "$OUT/run-profile.yaml" ] && echo "$OUT/run-profile.yaml")
if [ -n "${PREFETCH_COPY-1}" ] && t=$(upto 60); then
  timeout "$t" python3 benchmarks/bench_prefetch_copy.py --out-dir "$OUT" 2>&1 | tee "$OUT/bench_prefetch_copy.log" | tail -3
fi
MARK=400; [ -n "${DEVICE_LOOP_FIRST:-}" ] && MARK=575      # step 4 ran first: bench_engine until 575 s
if t=$(by "$MARK"); then
  timeout "$t" python3 benchmarks/bench_engine.py --dir /root/kimi5 --plans "${1:-ramrich,seed}" --tokens 32 \
    --warmup 16 ${PROFILE:+--profile "$PROFILE"} ${CAL:+--calibration "$CAL"} --out-dir "$OUT" \
    --pinned-gb "${PINNED_GB:-0}" --deadline-s "$(( t - 70 ))" ${ENGINE_ARGS:-} 2>&1 \
    | tee "$OUT/bench_engine.log" | grep -v '^ "'
fi
if [ -n "${DEVICE_LOOP_LAYERS:-}" ] && [ -z "${DEVICE_LOOP_FIRST:-}" ] && t=$(by 575); then
  device_loop "$t"
fi
if [ -n "${GPU_TESTS-1}" ] && t=$(by 590); then
  timeout "$t" python3 -m pytest -q tests/test_engine_run.py tests/test_engine_store.py tests/test_engine_runtime.py \
    tests/test_engine_models.py tests/test_engine_staging.py tests/test_lookahead_launches.py -p no:cacheprovider -rs \
    -o addopts="" --tb=short \
    >"$OUT/gpu_tests.log" 2>&1
  grep -E "^(FAILED|ERROR|E  )|passed|failed" "$OUT/gpu_tests.log" | head -30
fi
echo "run_engine_gpu: $(( $(date +%s) - t0 ))s"
