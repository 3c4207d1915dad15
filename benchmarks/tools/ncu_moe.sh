#!/usr/bin/env bash
# Nsight Compute on the two decode MoE launches, one report per config (JSON overrides of the tuned config):
#   OUT=dir bash benchmarks/tools/ncu_moe.sh '{"rows1": 32, "warps1": 4}' ['{...}' ...]
# NCU_SOURCE=1: per config also the per-instruction source page of each launch and the instructions that
# fetch the most excessive sectors (benchmarks/tools/ncu_excess.py), in $OUT/excess<i>-<kernel>.txt
source benchmarks/device_setup.sh
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tc} PYTHONUNBUFFERED=1
for c in "$@"; do python3 benchmarks/tools/ncu_moe.py "$c" > /dev/null 2>&1 & done; wait     # compile in parallel
S="${NCU_EXTRA:-} --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats"
i=0
for c in "$@"; do
  i=$((i+1))
  ncu --clock-control none $S -k regex:"gate_up_kernel|down_kernel" --launch-skip 2 -c 2 python3 benchmarks/tools/ncu_moe.py "$c" > "$OUT/ncu$i.txt" 2>&1
  echo "ncu$i rc $? $c"
  grep -E "^  [a-z_]+kernel|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|DRAM Throughput|L1/TEX Cache Throughput|Grid Size" "$OUT/ncu$i.txt"
  if [ "${NCU_SOURCE:-0}" = 1 ]; then
    for k in gate_up_kernel down_kernel; do
      ncu --clock-control none --section SourceCounters --page source --print-source sass --csv -k regex:$k \
        --launch-skip 1 -c 1 python3 benchmarks/tools/ncu_moe.py "$c" > /tmp/src-$i-$k.csv 2>&1
      python3 benchmarks/tools/ncu_excess.py /tmp/src-$i-$k.csv 30 | cut -c1-260 > "$OUT/excess$i-$k.txt"
      head -3 "$OUT/excess$i-$k.txt"
    done
  fi
done
