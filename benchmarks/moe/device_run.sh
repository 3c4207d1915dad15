#!/usr/bin/env bash
# One GPU-machine call: train the fixture and the benchmark MoE, evaluate them, take their routing traces.
# Everything that comes back is written under $OUT (at most 8 files): the fixture's weights, a tar of the
# rest of the fixture folder, a tar of the benchmark model's folder without its weights (they stay there),
# a tar of the benchmark-result JSONs, and the log (written by the caller through tee).
#   OUT=... FIX_S=120 BENCH_S=240 bash benchmarks/moe/device_run.sh 2>&1 | tee $OUT/log.txt
set -uo pipefail   # no -e: the benchmark model still trains if the fixture stage fails
: "${OUT:?set OUT}"
FIX_S=${FIX_S:-120}
BENCH_S=${BENCH_S:-240}
W=/tmp/moe
mkdir -p "$W/results"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1
# strata_plan must import (the traces go through its writer).
source benchmarks/device_setup.sh
python3 -c "import strata_plan.core.routing" || exit 1
python3 -c "import sys, torch, transformers, tokenizers, numpy; print(sys.version.split()[0], torch.__version__, \
transformers.__version__, tokenizers.__version__, numpy.__version__, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader || true

python3 benchmarks/train_moe.py --size fixture --out "$W/fixture-moe" --seconds "$FIX_S" --corpus-mb 300 \
  --trace-tokens 8192 --result-dir "$W/results" || echo "FIXTURE STAGE FAILED"
cp "$W/fixture-moe/model.safetensors" "$OUT/fixture-model.safetensors"
tar -C "$W" -cf "$OUT/fixture-moe.tar" --exclude model.safetensors fixture-moe
tar -C "$W" -cf "$OUT/results.tar" results

python3 benchmarks/train_moe.py --size bench --out "$W/bench-moe" --seconds "$BENCH_S" --corpus-mb 300 \
  --trace-tokens 4096 --result-dir "$W/results" || echo "BENCH STAGE FAILED"
tar -C "$W" -cf "$OUT/bench-moe.tar" --exclude model.safetensors bench-moe
tar -C "$W" -cf "$OUT/results.tar" results
ls -la "$W"/fixture-moe "$W"/bench-moe
for m in fixture-moe bench-moe; do
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); t=d['train']; h=d['held_out']; \
print(d['model'], d['parameters'], 'params;', t['steps'], 'steps', round(t['seconds']), 's', t['tokens'], 'tokens;', \
'held-out ppl', round(h['perplexity'], 2), 'bpb', round(h['bits_per_byte'], 4))" "$W/$m/train_log.json"
done
