#!/usr/bin/env bash
# Issue 30's fidelity rows in one device call (under 9.5 minutes): on the trained bench-moe (reused from
# $W/bench-moe when a run_trained_gpu.sh run left it there, else trained now for TRAIN_S seconds), every
# variant packed once and evaluated on held-out text, its weights alone and through the engine
# (benchmarks/bench_fidelity.py).
#   STRATA_GIT_SHA=<sha> OUT=$OUT [BUDGET_S=560] [ROWS=uniform.,...] bash benchmarks/run_fidelity_gpu.sh   # carry [".whl"]
# ROWS: only the rows whose names start so (bench_fidelity.py --rows), e.g. the rows a cut-short run left.
# HQQ (PyPI `hqq`, an sdist) and termcolor (which hqq.core.quantize imports; the GPU machine may lack it) go
# as wheels in .whl/, made here in the repository root once (both pure Python):
#   python3 -m pip wheel --no-deps hqq==0.2.8.post1 -w .whl
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl termcolor==3.3.0
# Without them the run still measures every other row (the HQQ row is recorded as failed). Training, when there
# is no checkpoint, takes about 3.5 minutes with TRAIN_S=120 (corpus, tokenizer, training, its own evaluation and
# trace); rows then run in priority order (the targets' rows first) until --deadline-s, the rest are recorded as
# skipped. With the checkpoint present every row fits.
# Back here: cp <files_at>/*.json benchmarks/results/; python benchmarks/summarize.py.
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/fidelity_gpu}; t0=$(date +%s); mkdir -p "$OUT"
TRAIN_S=${TRAIN_S:-120}
W=${W:-/root/trained}
source benchmarks/device_setup.sh
python3 -c "import hqq, termcolor; print('hqq', hqq.__version__)" || echo "hqq is missing: carry .whl (see this script's header)"
python3 -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, \
'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
left() { echo $(( $1 - ($(date +%s) - t0) )); }
if [ -f "$W/bench-moe/model.safetensors" ]; then
  MODEL=(--checkpoint "$W/bench-moe"); echo "reusing $W/bench-moe"
else
  MODEL=(--train-seconds "$TRAIN_S"); echo "no $W/bench-moe: training it (${TRAIN_S} s of training)"
fi
timeout "$(left ${BUDGET_S:-560})" python3 benchmarks/bench_fidelity.py "${MODEL[@]}" ${ROWS:+--rows "$ROWS"} --work "$W" --out-dir "$OUT" \
  --deadline-s "$(left $(( ${BUDGET_S:-560} - 30 )))" 2>&1 | tee "$OUT/bench_fidelity.log" | grep -v -e '^Loading weights' -e 'deprecated'
echo "run_fidelity_gpu: $(( $(date +%s) - t0 ))s"
