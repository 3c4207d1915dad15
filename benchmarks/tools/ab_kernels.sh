#!/usr/bin/env bash
# Side-by-side timing of several source trees of the package in one GPU session (the device tool):
#   OUT=dir bash benchmarks/tools/ab_kernels.sh ROUNDS DIR... -- [bench_kernels.py args]
# Each DIR holds a copy of the tree (strata_plan/ benchmarks/bench_kernels.py benchmarks/_result.py), e.g.
# `git archive REV ... | tar -x -C DIR`. Every tree is imported from its own folder (PYTHONPATH=DIR); rounds alternate the trees (A B C, A B C, ...) so that
# clock or temperature drift falls on all of them. Results: $OUT/<dir name>-<round>/*.json, then a table
# of medians over rounds (benchmarks/tools/ab_summary.py).
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tc}
ROUNDS=$1; shift; DIRS=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do DIRS+=("$1"); shift; done; shift
for d in "${DIRS[@]}"; do
  n=$(basename "$d"); root=$(cd "$d" && pwd)
  (cd /tmp && PYTHONPATH=$root python3 -c "import strata_plan.kernels.ops as o; print('$n:', o.__file__)") || exit 3
  PYTHONPATH=$root timeout 200 python3 "$d/benchmarks/bench_kernels.py" --prewarm 4 --prewarm-only "$@" 2>&1 | tail -1 &
done
wait
for r in $(seq 1 "$ROUNDS"); do
  for d in "${DIRS[@]}"; do
    n=$(basename "$d")
    PYTHONPATH=$(cd "$d" && pwd) python3 "$d/benchmarks/bench_kernels.py" --out-dir "$OUT/$n-$r" --name "ab-$n" "$@" 2>&1 \
      | grep -E "MoE layer \[best|GEMV|wrote" | cut -c1-160
  done
done
python3 "$(dirname "$0")/ab_summary.py" "$OUT"
