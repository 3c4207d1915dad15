#!/usr/bin/env bash
# The peer rows in one device call (README.md):
#   bash benchmarks/peers/fetch_llama_cpp.sh     # here, once: the source travels in the run's carry
#   STRATA_GIT_SHA=<sha> OUT=$OUT [TYPES=q2_k OURS=q2_g16_s8m4] bash benchmarks/peers/run_peer_gpu.sh
#   (TEXT: default the first TEXT_KB=128 KiB of the peer's heldout.txt, scored; CALIB: the next CALIB_KB=128 KiB,
#   llama-imatrix's text; TYPES / OURS: bench_peer.py's --types / --ours, paired, default its three pairs; after a
#   330-370 s build a call holds two: TYPES=q2_k,iq2_xxs OURS=q2_g16_s8m4,q2_g32_s8m8, then TYPES=iq1_s
#   OURS=q1_g32_s8m4 on the machine still warm: it reuses the build and the trained model, so both calls' rows share
#   one checkpoint)
# llama.cpp is built for sm_90 on the CPU cores while the peer model trains on the GPU, then bench_peer.py, which
# saves its JSON after every row (a failing row is recorded in `errors`). Everything ends by 590 s; `strata-plan
# plan` needs Optuna: carry .whl (benchmarks/run_trained_gpu.sh's header) with the llama.cpp source.
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache PATH=/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/peer_gpu}; mkdir -p "$OUT"; t0=$(date +%s)
source benchmarks/device_setup.sh
left() { echo $(( $1 - ($(date +%s) - t0) )); }
# a warm machine keeps /root/lc and /root/peer from the call before: the second call of a pair skips build and training
if [ -x /root/lc/bin/llama-bench ] && [ -x /root/lc/bin/llama-imatrix ]; then echo "llama.cpp: built by an earlier call"; ( true ) &
else
( timeout 360 cmake -S benchmarks/peers/llama.cpp -B /root/lc -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  && timeout 360 cmake --build /root/lc -j14 --target llama-bench llama-quantize llama-perplexity llama-imatrix llama-tokenize ) > "$OUT/build.log" 2>&1 &
fi
build=$!
# the trainer's start (corpus, tokenizer) and end (held-out loss, trace, heldout.txt) take 60-90 s beside TRAIN_S
TRAIN_S=${TRAIN_S:-210}
[ -s /root/peer/heldout.txt ] && ls /root/peer/*.trace.npz >/dev/null 2>&1 && echo "peer model: trained by an earlier call" \
  || timeout $(( TRAIN_S + 150 )) python3 benchmarks/train_moe.py --size peer --out /root/peer --seconds "$TRAIN_S" 2>&1 | tail -5 | tee "$OUT/train.log"
wait $build || { tail -20 "$OUT/build.log"; exit 1; }
[ -s /root/peer/heldout.txt ] && ls /root/peer/*.trace.npz > /dev/null || { echo "the peer's training did not finish"; exit 1; }
echo "built and trained in $(( $(date +%s) - t0 )) s"
# the evaluation text: the held-out part, its first TEXT_KB KiB in whole lines (the KL and eval rows' time goes as
# it); the importance matrix's: the CALIB_KB KiB after it, in whole lines (disjoint from the scored text)
TEXT=${TEXT:-/root/peer/heldout-cut.txt}; CALIB=${CALIB:-/root/peer/calib-cut.txt}
tk=$(( ${TEXT_KB:-128} * 1024 )); ck=$(( ${CALIB_KB:-128} * 1024 ))
[ -f "$TEXT" ] || head -c $tk /root/peer/heldout.txt | sed '$d' > "$TEXT"
[ -f "$CALIB" ] || head -c $(( tk + ck )) /root/peer/heldout.txt | tail -c $ck | sed '1d;$d' > "$CALIB"
timeout "$(left 590)" python3 benchmarks/peers/bench_peer.py --checkpoint /root/peer --llama-bin /root/lc/bin --work /root/pw \
  --text "$TEXT" --calib-text "$CALIB" --out-dir "$OUT" ${TYPES:+--types "$TYPES"} ${OURS:+--ours "$OURS"} 2>&1 | tee "$OUT/bench_peer.log" | tail -40
echo "run_peer_gpu: $(( $(date +%s) - t0 ))s"
