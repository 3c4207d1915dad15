"""The lookahead copy kernel's units (`kernels.prefetch`), which the cost model charges too: here, without torch or
Triton, so the planner imports them light."""

COPY_CHUNK = 64 << 10
"""Bytes of one item of the lookahead's copy kernel (`kernels.prefetch`, a multiple of 8 KiB): the unit in which a
guess lands (partial landing)."""

COPY_PROGRAMS = 16
"""The copy kernel's programs: the link's rate is the link's, not the SMs'. On the H100, 16 moved 50.1 GB/s alone and
49.5 beside a GEMV workload that they slowed by 6%; 165 (1.25 a SM) no faster, the workload slowed by 35%; 8: 34.4 GB/s
(benchmarks/results/prefetch-copy-20261205T155055Z.json). Program p copies items p, p + P, ...: at any moment about P
chunks are in flight past a guess's landed prefix."""
