#!/usr/bin/env bash
# The trained-model rows of issue 29 in one device call (under 10 minutes): retrain bench-moe (TRAIN_S seconds
# of training, default 200), plan it from its own held-out trace under the RAM-rich and seed-proportion budgets,
# pack it, run the engine (plan / LRU-only / on-demand, real router lookahead), transformers + accelerate
# offload beside it, `run` equivalence, hit rate by lookahead depth (benchmarks/bench_trained.py).
#   STRATA_GIT_SHA=<sha> OUT=$OUT [CALIBRATION=P.yaml] [GPU_TESTS=1] [TRAIN_S=170] [SKIP=transformers,equivalence] \
#     [STEP_KERNELS=1 [STEP_KERNELS_PLAN="ramrich seed"]] [BUDGETS=seed] [BURST=1] [DRAW=1] [LOOKAHEAD_POINT=1] [BENCH_ARGS=--io-repeats 3] [END_S=585] bash benchmarks/run_trained_gpu.sh   # device `carry`: [".whl"]; SKIP: bench_trained.py's --skip
# Plans and predictions: the quick profile measured in the call (with the trained model's layer times), no fitted constant
# (CALIBRATION=P.yaml: the calibration constants of P instead).
# `strata-plan plan` needs Optuna, which the GPU machine lacks: carry its wheels (pure Python, in-memory
# studies need no SQLAlchemy), made here in the repository root once:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl optuna==5.1.0 colorlog==6.12.0
# Back here: cp <files_at>/*.json benchmarks/results/; python benchmarks/summarize.py. $OUT also gets the log
# and trained-artifacts.tar (plans, the predictions' profile, trace, train log, config, tokenizer, each engine row's
# routing teacher-forced (run-routing/<row>.npz), the call's quick profile, the GPU tests' and step_kernels' logs;
# the weights stay there).
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/trained_gpu}; t0=$(date +%s); mkdir -p "$OUT"
TRAIN_S=${TRAIN_S:-170}
W=${W:-/root/trained}
source benchmarks/device_setup.sh
python3 -c "import optuna, colorlog; print('optuna', optuna.__version__)" \
  || { echo "optuna is missing: carry .whl (see this script's header)"; exit 1; }
python3 -c "import sys, torch, transformers, accelerate, tokenizers; print(sys.version.split()[0], 'torch', \
torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'tokenizers', \
tokenizers.__version__, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader || true
left() { echo $(( $1 - ($(date +%s) - t0) )); }
CAL=${CALIBRATION-}   # constants of another profile YAML (default none: the quick profile's measured figures)
timeout 90 python3 -m strata_plan.cli profile --quick --nvme-dir /root --out "$OUT/run-profile.yaml" --force 2>&1 | tail -1
PROFILE=$([ -f "$OUT/run-profile.yaml" ] && echo "$OUT/run-profile.yaml" || echo h200)   # the shipped one if it failed
# DRAW=1: the token pick's GPU time by way of picking, argmax / sampled draw (tools/draw_probe.py; draw.log)
[ -n "${DRAW-}" ] && timeout 120 python3 benchmarks/tools/draw_probe.py >"$OUT/draw.log" 2>&1; \
  [ -f "$OUT/draw.log" ] && cat "$OUT/draw.log"
# BURST=1: bursts of O_DIRECT reads on the idle drive against the call's profile (tools/burst_read.py; burst.log)
[ -n "${BURST-}" ] && timeout 150 python3 benchmarks/tools/burst_read.py --dir /root --profile "$PROFILE" \
  ${BURST_ARGS-} >"$OUT/burst.log" 2>&1; [ -f "$OUT/burst.log" ] && cat "$OUT/burst.log"
# GPU_TESTS=1: the slot protocol's and the stager's kernel tests and the engine's GPU-marked tests run beside the
# training (after the profile, done before the engine rows start; gpu_tests.log). Correctness only, no timings.
if [ -n "${GPU_TESTS-}" ]; then
  bash benchmarks/device_loop_tests.sh "$OUT/gpu_tests.log" >"$OUT/gpu_tests.summary" &
  tests=$!
fi
END=585; [ -n "${STEP_KERNELS-}" ] && END=530     # STEP_KERNELS=1 leaves a minute for step_kernels after it
END=${END_S:-$END}                                 # END_S: the benchmark's end, seconds into the call (a shorter call)
timeout "$(left $END)" python3 benchmarks/bench_trained.py --work "$W" --out-dir "$OUT" --train-seconds "$TRAIN_S" \
  --profile-predict "$PROFILE" ${CAL:+--calibration "$CAL"} ${SKIP:+--skip "$SKIP"} ${BUDGETS:+--budgets "$BUDGETS"} ${BENCH_ARGS-} \
  --deadline-s "$(left $((END - 25)))" 2>&1 | tee "$OUT/bench_trained.log" | grep -v -e '^Loading weights' -e 'deprecated'
[ -n "${tests-}" ] && { wait "$tests"; cat "$OUT/gpu_tests.summary"; }
# STEP_KERNELS=1: the decode token kernel by kernel (benchmarks/tools/step_kernels.py) of each trained plan in
# STEP_KERNELS_PLAN (default ramrich; "ramrich seed": side by side on one machine, with END_S=470 to leave them two
# minutes), by STEP_KERNELS_RUNS (default on-demand,lru,plan:1), each run in its own process: step_kernels-<plan>.log
# and .json. A seed plan's replays wait only for what its staging cache could not keep from the replay before.
if [ -n "${STEP_KERNELS-}" ]; then
  for SKP in ${STEP_KERNELS_PLAN:-ramrich}; do
    SKD=$W/packed-$SKP; [ -d "$SKD" ] || SKD=$W/packed-ramrich      # a plan packed like the RAM-rich one shares it
    [ -d "$SKD" ] || continue
    OUT="$OUT" timeout "$(left $((END + 60)))" python3 benchmarks/tools/step_kernels.py --packed "$SKD" \
      --plan "$W/plan-$SKP.yaml" --runs "${STEP_KERNELS_RUNS:-on-demand,lru,plan:1}" --reps 10 \
      >"$OUT/step_kernels-$SKP.log" 2>&1
    [ -f "$OUT/step_kernels.json" ] && mv "$OUT/step_kernels.json" "$OUT/step_kernels-$SKP.json"
    grep -E "wall" "$OUT/step_kernels-$SKP.log"
  done
fi
# LOOKAHEAD_POINT=1: the trained model's lookahead precision from each layer's output and from its residual after
# attention (tools/lookahead_point.py; lookahead_point.log)
[ -n "${LOOKAHEAD_POINT-}" ] && [ -d "$W/bench-moe" ] && timeout 120 python3 benchmarks/tools/lookahead_point.py \
  --model "$W/bench-moe" --depth 4 >"$OUT/lookahead_point.log" 2>&1; [ -f "$OUT/lookahead_point.log" ] && \
  grep -v "Loading weights" "$OUT/lookahead_point.log"
tar -C "$W" -cf "$OUT/trained-artifacts.tar" --ignore-failed-read plan-ramrich.yaml plan-seed.yaml plan-bf16.yaml profile-predict.yaml \
  bench-moe/config.json bench-moe/train_log.json bench-moe/bench-moe.trace.npz bench-moe/heldout_tokens.npz \
  bench-moe/tokenizer.json bench-moe/tokenizer_config.json run-routing 2>/dev/null
# at most 8 files come back from $OUT: the logs, the call's profile and step_kernels' files go into the tar too
for f in run-profile.yaml burst.log draw.log gpu_tests.log gpu_tests.summary step_kernels-*.json step_kernels-*.log \
  lookahead_point.log; do
  [ -f "$OUT/$f" ] && tar -C "$OUT" -rf "$OUT/trained-artifacts.tar" "$f" && rm -f "$OUT/$f"
done
echo "run_trained_gpu: $(( $(date +%s) - t0 ))s"
