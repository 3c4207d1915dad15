#!/usr/bin/env bash
# Nsight Compute on the two decode MoE launches for two configs: OUT=dir bash benchmarks/ncu_moe.sh
source benchmarks/device_setup.sh
export TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
C1='{"BN1":128,"warps1":4,"NS1":2,"BN2":64,"warps2":4,"NS2":1}'
C2='{"BN1":64,"warps1":4,"NS1":1,"BN2":32,"warps2":2,"NS2":2}'
for c in "$C1" "$C2"; do python3 benchmarks/ncu_moe.py "$c" > /dev/null 2>&1 & done; wait
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats"
i=0; for c in "$C1" "$C2"; do i=$((i+1)); ncu --clock-control none $S -k regex:"gate_up_kernel|down_kernel" --launch-skip 2 -c 2 python3 benchmarks/ncu_moe.py "$c" > $OUT/ncu$i.txt 2>&1; echo "ncu$i rc $?"; done
grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Memory Throughput|DRAM Throughput|Block Limit|Waves Per SM|Executed Ipc A|Grid Size" $OUT/ncu*.txt
