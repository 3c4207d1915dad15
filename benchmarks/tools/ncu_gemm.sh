#!/usr/bin/env bash
# Nsight Compute on the prefill GEMM (the Triton or the Gluon kernel, whichever the config picks), one
# report per config (JSON overrides of the tuned config), with the warp stall reasons and the instructions
# where warps stall most (ncu_excess.py ... stall):
#   OUT=dir bash benchmarks/tools/ncu_gemm.sh '{}' '{"prefetch_scales": false}' ...
source benchmarks/device_setup.sh
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tc} PYTHONUNBUFFERED=1
for c in "$@"; do python3 benchmarks/tools/ncu_gemm.py "$c" > /dev/null 2>&1 & done; wait     # compile in parallel
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats
   --section ComputeWorkloadAnalysis --section InstructionStats
   --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
i=0
for c in "$@"; do
  i=$((i+1))
  ncu --clock-control none $S -k regex:gemm_.*kernel --launch-skip 1 -c 1 python3 benchmarks/tools/ncu_gemm.py "$c" \
    > "$OUT/ncu-gemm$i.txt" 2>&1
  echo "ncu-gemm$i rc $? $c"
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|stalled_(long|short|barrier|wait|math|mio|gmma|not_sel|dispatch|lg)" \
    "$OUT/ncu-gemm$i.txt" | grep -v " 0$"
  ncu --clock-control none --section SourceCounters --page source --print-source sass --csv -k regex:gemm_.*kernel \
    --launch-skip 1 -c 1 python3 benchmarks/tools/ncu_gemm.py "$c" > /tmp/gemm-src-$i.csv 2>&1
  python3 benchmarks/tools/ncu_excess.py /tmp/gemm-src-$i.csv 30 stall | cut -c1-220 > "$OUT/stall-gemm$i.txt"
  head -12 "$OUT/stall-gemm$i.txt"
done
