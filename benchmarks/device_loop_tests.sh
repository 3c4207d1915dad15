#!/usr/bin/env bash
# The device loop's GPU tests in a device call (correctness only, no timings): the slot protocol's and the stager
# handshake's kernel tests, then the GPU-marked tests of the engine's graph loop and its NVMe stager. Their output
# goes to LOG; the failures and totals are printed.
#   bash benchmarks/device_loop_tests.sh LOG        # after `source benchmarks/device_setup.sh`
LOG=${1:?usage: device_loop_tests.sh LOG}
( timeout 60 python3 -m pytest -q tests/test_kernels_stage_wait.py tests/test_kernels_prefetch.py -p no:cacheprovider \
    -rs -o addopts="" --tb=short
  timeout 120 python3 -m pytest -q -m gpu tests/test_engine_staging.py tests/test_engine_run.py -p no:cacheprovider \
    -rs -o addopts="" --tb=short ) >"$LOG" 2>&1
grep -E "^(FAILED|ERROR|E  )|passed|failed" "$LOG" | head -20
